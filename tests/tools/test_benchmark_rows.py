"""benchmarks/rows.py: a run's rows replace those of the cases it measured, on its device and
by its benchmark (its timer), and no others."""
import datetime
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_a_device_name_becomes_its_file_name():
    """As gpu_check.sh names the file: lower case, each run of other characters one dash, none at the ends."""
    assert result_rows.slug("NVIDIA H200") == "nvidia-h200"
    assert result_rows.slug(" CPU Intel(R) Xeon(R)  2vCPU ") == "cpu-intel-r-xeon-r-2vcpu"
    assert result_rows.rows_file("NVIDIA H200") == result_rows.RESULTS / "nvidia-h200.jsonl"


def test_the_cpu_rows_file_is_named_by_the_cpu_model_and_count():
    name = result_rows.device_name("cpu")
    assert name.startswith("CPU ") and name.endswith(f" {os.cpu_count()}vCPU"), name
    assert result_rows.rows_path("cpu") == result_rows.rows_file(name)


@pytest.mark.parametrize("cpuinfo", ["processor\t: 0\nBogoMIPS\t: 50.00\n", None])
def test_a_cpu_without_a_model_name_is_named_by_its_machine(monkeypatch, cpuinfo):
    """An ARM /proc/cpuinfo has no "model name" line, and some systems have no /proc/cpuinfo."""
    def fake_open(path):
        if cpuinfo is None:
            raise OSError(path)
        return io.StringIO(cpuinfo)

    monkeypatch.setattr(result_rows, "open", fake_open, raising=False)
    monkeypatch.setattr(result_rows.platform, "processor", lambda: "")
    monkeypatch.setattr(result_rows.platform, "machine", lambda: "aarch64")
    assert result_rows.device_name("cpu") == f"CPU aarch64 {os.cpu_count()}vCPU"


def test_the_source_hash_covers_the_source_files_in_byte_order(tmp_path):
    """What gpu_check.sh --tree-hash prints: sha1sum lines of the sources (no caches, no other
    suffixes), sorted by bytes (upper case first), hashed, 12 digits."""
    files = {"ddpd/a.py": b"a", "ddpd/Z.py": b"z", "kernels/k.cu": b"k", "ddpd/notes.txt": b"n",
             "ddpd/__pycache__/a.py": b"c", "other/o.py": b"o"}
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    lines = "".join(f"{hashlib.sha1(files[name]).hexdigest()}  {name}\n"
                    for name in ("ddpd/Z.py", "ddpd/a.py", "kernels/k.cu"))
    assert result_rows.source_hash(tmp_path) == hashlib.sha1(lines.encode()).hexdigest()[:12]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_the_commit_is_marked_when_the_tree_differs_from_it(tmp_path):
    (tmp_path / "f.py").write_text("1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "f.py")
    git(tmp_path, "commit", "-q", "-m", "one")
    head = git(tmp_path, "rev-parse", "--short", "HEAD")
    assert result_rows.commit(tmp_path) == head
    (tmp_path / "f.py").write_text("2\n")
    assert result_rows.commit(tmp_path) == head + "+"


def test_the_commit_outside_a_checkout_is_unknown(tmp_path):
    assert result_rows.commit(tmp_path) == "unknown"


def test_a_row_holds_its_fields_with_six_digits_and_the_speed_up():
    stamp = dict(commit="abc1234", sources="0123456789ab", date="2026-11-29")
    got = result_rows.row("bernoulli", (64, 8), "float32", 1 / 3, "torch: rand < p", 1.0, device="GPU X",
                          source="benchmarks/gpu_timings.py", stamp=stamp)
    assert got == dict(op="bernoulli", shape=[64, 8], dtype="float32", params="", device="GPU X", mode="eager",
                       commit="abc1234", sources="0123456789ab", date="2026-11-29", median=0.333333,
                       baseline="torch: rand < p", baseline_median=1.0, ratio=3.0,
                       source="benchmarks/gpu_timings.py")
    assert result_rows.row("bernoulli", (1,), "float32", 1.0, "reference", 2 / 3, device="GPU X", source="s",
                           stamp=stamp)["baseline_median"] == 0.666667


def test_a_stamp_holds_the_utc_date_of_the_run(monkeypatch):
    class Fixed(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 1, 2, 23, 0, tzinfo=tz)

    monkeypatch.setattr(result_rows.datetime, "datetime", Fixed)
    monkeypatch.setattr(result_rows, "commit", lambda: "abc1234")
    monkeypatch.setattr(result_rows, "source_hash", lambda: "0123456789ab")
    assert result_rows.make_stamp() == dict(commit="abc1234", sources="0123456789ab", date="2026-01-02")


def test_a_missing_rows_file_has_no_rows_and_blank_lines_are_skipped(tmp_path):
    assert result_rows.read(tmp_path / "none.jsonl") == []
    (tmp_path / "x.jsonl").write_text('{"op": "a"}\n\n  \n{"op": "b"}\n')
    assert result_rows.read(tmp_path / "x.jsonl") == [{"op": "a"}, {"op": "b"}]


def test_a_run_without_rows_writes_nothing(tmp_path):
    path = tmp_path / "gpu-x.jsonl"
    assert result_rows.merge(path, []) == 0 and not path.exists()


def test_merged_rows_keep_the_others_first_and_only_the_fields(tmp_path):
    """The file's folder is made; the kept rows come before the new ones; each row is written
    with FIELDS in their order (nothing else); the count is that of the new rows."""
    path = tmp_path / "results" / "sub" / "gpu-x.jsonl"
    other = row(shape=[1, 50257])
    assert result_rows.merge(path, [other]) == 1
    new = [dict(row(), note="not a field"), row(shape=[2, 50257])]
    assert result_rows.merge(path, new) == 2
    lines = path.read_text().splitlines()
    assert [json.loads(line)["shape"] for line in lines] == [[1, 50257], [64, 50257], [2, 50257]]
    assert all(list(json.loads(line)) == list(result_rows.FIELDS) for line in lines)
