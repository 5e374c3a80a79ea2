"""benchmarks/conftest.py, the harness of `pytest benchmarks/`: how it names a case and words
fused's ratio against each variant in its table. No clock: the medians are given."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("benchmarks_harness", ROOT / "benchmarks" / "conftest.py")
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)
result_rows = harness.result_rows


def test_a_case_is_titled_by_its_nonempty_parts_and_cuda_only_on_a_gpu():
    assert harness.case_title(("draw", (64, 50257), "bfloat16", "top_p 0.9", "cuda")) == \
        "draw 64x50257 bfloat16 top_p 0.9 cuda"
    assert harness.case_title(("draw", (3,), "float32", "", "cpu")) == "draw 3 float32"


@pytest.mark.parametrize("theirs, ours, text", [
    (3.0, 1.5, "2.00x faster"), (2.0, 2.0, "1.00x faster"), (1.0, 4.0, "4.00x SLOWER"),
    (None, 1.0, ""), (1.0, None, ""), (0.0, 1.0, ""),
])
def test_fuseds_ratio_says_how_many_times_faster_or_slower_and_nothing_without_both_times(theirs, ours, text):
    assert harness._ratio(theirs, ours) == text


def test_peak_memory_is_in_mib_to_a_tenth_or_na():
    assert harness._mib(None) == "n/a"
    assert harness._mib(3 * 2**20 + 2**19) == "3.5 MiB"


# A bench file of tiny torch calls, timed by a copy of the harness: the real bench files take
# minutes on a loaded CPU. Which variant is faster is left to the clock; the tests read it back
# from the rows written and check the table against them.
TINY_BENCH = '''
import os

import pytest
import torch

X = torch.ones(8)


@pytest.mark.parametrize("variant", ["torch: sum", "torch: cumsum", "related: mul", "reference", "fused"])
def test_tiny(compare, variant):
    fns = {"torch: sum": X.sum, "torch: cumsum": X.cumsum(0).__len__, "related: mul": lambda: X * 2,
           "reference": lambda: X.sum(0), "fused": lambda: X.max()}
    compare("tiny", (8,), variant, fns[variant], params="p 1")


def test_rounds(compare):
    torch.set_num_threads(1)
    threads = int(os.environ.get("DDPD_BENCH_THREADS", "1"))
    seen = []
    compare("rounded", (2, 3), "fused", lambda: seen.append(torch.get_num_threads()), dtype="int64", rounds=3)
    assert torch.get_num_threads() == 1
    # --benchmark-disable: one call, no memory probe; else a warm-up, 3 rounds and the memory probe
    assert seen in ([threads], [threads] * 5)


def test_alone(compare):
    compare("alone", (4,), "torch: sum", X.sum)
'''


def run_tiny_bench(tmp_path, *options, threads: Optional[str] = "2"):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text((ROOT / "benchmarks" / "conftest.py").read_text())
    (tmp_path / "bench_tiny.py").write_text(TINY_BENCH)
    # Not the calling pytest's variables: PYTEST_XDIST_WORKER (under -n) makes pytest-benchmark
    # disable itself, and PYTEST_ADDOPTS would add the caller's options.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    env.update(DDPD_BENCH_THREADS=threads,
               PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if threads is None:
        env.pop("DDPD_BENCH_THREADS")
    run = subprocess.run([sys.executable, "-m", "pytest", "bench_tiny.py", "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist", "--benchmark-min-rounds=5", "--benchmark-max-time=0.001",
                          "--benchmark-warmup=off", "--rows", str(tmp_path / "rows.jsonl"), *options],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return run.stdout.splitlines()


def table_of(lines, title):
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[start + 1:end]


def ratio_text(theirs, ours):
    return f"{theirs / ours:.2f}x faster" if theirs >= ours else f"{ours / theirs:.2f}x SLOWER"


def test_a_timed_run_tables_each_case_and_writes_fuseds_ratio_against_every_other_variant(tmp_path):
    lines = run_tiny_bench(tmp_path, f"--benchmark-json={tmp_path / 'bench.json'}")
    assert "ddpd against plain torch (2 torch threads, same run)" in " ".join(lines)
    written = result_rows.read(tmp_path / "rows.jsonl")
    assert f"4 rows written to {tmp_path / 'rows.jsonl'}" in lines
    # only the case with a fused variant has rows: one per other variant, in the order run
    assert [r["baseline"] for r in written] == ["torch: sum", "torch: cumsum", "related: mul", "reference"]
    ours = written[0]["median"]
    for r in written:
        assert (r["op"], r["shape"], r["dtype"], r["params"], r["mode"]) == ("tiny", [8], "float32", "p 1", "eager")
        assert r["device"] == result_rows.device_name("cpu")
        assert r["source"] == "benchmarks/bench_tiny.py"
        assert r["median"] == ours
        assert r["ratio"] == pytest.approx(r["baseline_median"] / ours, rel=1e-5)

    table = table_of(lines, "tiny 8 float32 p 1")
    names = ["torch: sum", "torch: cumsum", "related: mul", "reference", "fused"]
    assert [line[2:].split(" median")[0].rstrip() for line in table[:5]] == names
    assert len({line.index(" median ") for line in table[:5]}) == 1  # the medians line up
    medians = {r["baseline"]: r["baseline_median"] for r in written}
    medians["fused"] = ours
    for name, line in zip(names, table):
        shown = float(re.search(r"median +([0-9.]+) ms", line).group(1))
        assert shown == pytest.approx(medians[name] * 1e3, abs=6e-4)
        assert re.search(r"  peak memory \+[0-9]+\.[0-9] MiB", line)
        if name == "fused":
            assert " is " not in line
        else:
            assert line.endswith(f"  fused is {ratio_text(medians[name], ours)}")
    torch_medians = {name: m for name, m in medians.items() if name.startswith("torch: ")}
    fastest = min(torch_medians, key=torch_medians.get)
    assert table[5:] == [
        f"  => fastest torch code: {fastest[len('torch: '):]} ({torch_medians[fastest] * 1e3:.3f} ms); "
        f"fused is {ratio_text(torch_medians[fastest], ours)} than it",
        f"  => related code, another job: mul; fused is {ratio_text(medians['related: mul'], ours)} than it"]

    # a case without fused shows its medians, and no ratio, no verdict
    alone = table_of(lines, "alone 4 float32")
    assert len(alone) == 1 and re.fullmatch(r"  torch: sum median +[0-9.]+ ms  peak memory \+[0-9.]+ MiB", alone[0])
    # the width of the names is at least 10
    rounded = table_of(lines, "rounded 2x3 int64")
    assert len(rounded) == 1 and rounded[0].startswith("  fused      median ")

    benches = {b["name"]: b for b in json.loads((tmp_path / "bench.json").read_text())["benchmarks"]}
    assert benches["test_rounds"]["stats"]["rounds"] == 3
    assert benches["test_rounds"]["group"] == "rounded 2x3 int64"
    for r in written:  # the rows' times are medians, not means
        assert r["baseline_median"] == pytest.approx(benches[f"test_tiny[{r['baseline']}]"]["stats"]["median"],
                                                     rel=1e-5)
    for name, variant in [("test_tiny[related: mul]", "related: mul"), ("test_rounds", "fused")]:
        info = benches[name]["extra_info"]
        assert (info["variant"], info["threads"]) == (variant, 2)
        assert isinstance(info["peak_memory_growth_mib"], float)


def test_a_run_with_benchmark_disable_tables_no_times_and_writes_no_rows(tmp_path):
    lines = run_tiny_bench(tmp_path, "--benchmark-disable", threads=None)
    assert "ddpd against plain torch (1 torch threads, same run)" in " ".join(lines)
    table = table_of(lines, "tiny 8 float32 p 1")
    assert [line.split(" median ")[1] for line in table] == ["n/a"] * 5
    assert table_of(lines, "rounded 2x3 int64") == ["  fused      median n/a"]
    assert not (tmp_path / "rows.jsonl").exists()
    assert not any("rows written" in line for line in lines)


class Reporter:
    def __init__(self):
        self.lines = []

    def section(self, title):
        self.lines.append(f"== {title}")

    def write_line(self, line):
        self.lines.append(line)


class Config:
    def __init__(self, rows):
        self.rows = rows

    def getoption(self, name):
        assert name == "--rows"
        return self.rows


@pytest.fixture
def results(monkeypatch):
    """The harness's results, set by the test; merge and the stamp recorded, not run."""
    monkeypatch.setattr(harness, "_results", {})
    stamps, merged = [], []
    monkeypatch.setattr(result_rows, "make_stamp", lambda: stamps.append(1) or {"commit": "c", "sources": "s"})
    monkeypatch.setattr(result_rows, "merge", lambda path, new: merged.append((path, new)) or len(new))
    return harness._results, stamps, merged


def test_the_fastest_torch_code_is_among_the_timed_torch_variants_only(results):
    found, _, _ = results
    found[("op", (2,), "float32", "", "cpu")] = {
        "torch: slow": (4e-3, None, "bench_op.py"), "torch: untimed": (None, None, "bench_op.py"),
        "torch: quick": (3e-3, None, "bench_op.py"), "related: quicker": (1e-3, None, "bench_op.py"),
        "reference": (5e-4, None, "bench_op.py"), "fused": (2e-3, 2**20, "bench_op.py")}
    reporter = Reporter()
    harness.pytest_terminal_summary(reporter, Config(""))
    assert reporter.lines[-2:] == ["  => fastest torch code: quick (3.000 ms); fused is 1.50x faster than it",
                                   "  => related code, another job: quicker; fused is 2.00x SLOWER than it"]


def test_without_a_timed_fused_no_verdict_is_drawn_and_no_row_made(results):
    found, _, merged = results
    found[("op", (2,), "float32", "", "cpu")] = {
        "torch: a": (4e-3, None, "bench_op.py"), "related: b": (1e-3, None, "bench_op.py"),
        "fused": (None, None, "bench_op.py")}
    reporter = Reporter()
    harness.pytest_terminal_summary(reporter, Config("rows.jsonl"))
    assert not any("=>" in line or " is " in line for line in reporter.lines)
    assert merged == [] and harness.rows() == []


def test_rows_of_a_run_share_one_stamp_and_none_are_written_for_rows_given_as_empty(results):
    found, stamps, merged = results
    for width in (2, 3):
        found[("op", (width,), "float32", "", "cpu")] = {"torch: a": (4e-3, None, "bench_op.py"),
                                                         "fused": (2e-3, None, "bench_op.py")}
    reporter = Reporter()
    harness.pytest_terminal_summary(reporter, Config(""))
    assert merged == [] and not any("rows written" in line for line in reporter.lines)
    assert len(stamps) == 1


def test_rows_name_each_cases_device_and_by_default_go_to_that_devices_file(results, monkeypatch):
    found, _, merged = results
    monkeypatch.setattr(result_rows, "device_name", lambda device: f"Chip {device}")
    for device in ("cpu", "cuda"):
        found[("op", (2,), "float32", "", device)] = {"torch: a": (4e-3, None, "bench_op.py"),
                                                      "fused": (2e-3, None, "bench_op.py")}
    harness.pytest_terminal_summary(Reporter(), Config(None))
    assert [(path, [r["device"] for r in new]) for path, new in merged] == [
        (result_rows.rows_file("Chip cpu"), ["Chip cpu"]), (result_rows.rows_file("Chip cuda"), ["Chip cuda"])]
