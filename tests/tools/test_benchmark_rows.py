"""benchmarks/rows.py: a run's rows replace those of the cases it measured, on its device and
by its benchmark (its timer), and no others."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import rows as result_rows  # noqa: E402


def row(baseline: str = "torch: fast", median: float = 2e-5, device: str = "GPU X",
        source: str = "benchmarks/gpu_timings.py", **fields) -> dict:
    made = dict(op="sample_categorical", shape=[64, 50257], dtype="bfloat16", params="", device=device, mode="eager",
                commit="abc1234", sources=None, median=median, baseline=baseline, baseline_median=6e-5,
                ratio=6e-5 / median, date="2026-11-29", source=source)
    return {**made, **fields}


def merged(tmp_path: Path, before: list[dict], new: list[dict]) -> list[dict]:
    path = tmp_path / "gpu-x.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in before))
    result_rows.merge(path, new)
    return result_rows.read(path)


def test_rows_of_another_device_are_kept(tmp_path):
    cpu = row(device="CPU Y 2vCPU", median=1e-3)
    got = merged(tmp_path, [cpu], [row()])
    assert cpu in got and len(got) == 2


def test_rows_of_another_benchmark_are_kept(tmp_path):
    """A pytest bench on CUDA times the same case with another timer: gpu_timings' row stays."""
    timings = row()
    got = merged(tmp_path, [timings], [row(source="benchmarks/bench_sample_categorical.py", median=3e-5)])
    assert timings in got and len(got) == 2


def test_a_measured_case_drops_its_earlier_rows(tmp_path):
    """A baseline renamed or removed since the last run leaves no stale row behind; the rows of
    cases the run did not measure stay."""
    stale, other = row("torch: renamed since"), row("torch: fast", shape=[1, 50257])
    fresh = row("torch: fast", median=1e-5, commit="def5678")
    got = merged(tmp_path, [stale, other], [fresh])
    assert stale not in got and other in got and fresh in got and len(got) == 2
