"""The GPU check (benchmarks/gpu_check.sh) runs only where a GPU is lent, rarely: its
dry run (tiny shapes on the CPU, the same code paths and checks) runs here, so the
script that a device run depends on cannot rot unnoticed."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_gpu_check_dry_run_runs_every_part(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, TMPDIR=str(tmp_path))
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    report = (tmp_path / "ddpd-gpu-check-dry-run.txt").read_text()
    for part in ("timings", "host cost", "sampling", "kernel profile"):
        assert f"## {part}: passed" in report, report[-4000:]
    assert "called: sample_from_hidden" in report  # the profiled calls, made without a profiler
    for part in ("build", "extension", "gpu tests"):  # printed, not run, without a GPU
        assert f"## {part} (limit" in report
    assert "gpu_timings: 0 failed case(s)" in report
    # the comparisons as rows (benchmarks/rows.py): each op against its torch candidates, and
    # the default sampling run against the other whole runs
    rows = [json.loads(line) for line in (tmp_path / "ddpd-gpu-check-dry-run.jsonl").read_text().splitlines()]
    ops = {"sample_categorical", "sample_from_hidden", "multinomial", "planner_select", "step", "ddpd_sample"}
    assert ops <= {row["op"] for row in rows}, rows
    for row in rows:
        assert row["median"] > 0 and row["baseline_median"] > 0, row
        assert row["baseline"].startswith(("torch: ", "related: ")) or row["op"] == "ddpd_sample", row
        # each of the three is rounded to 6 digits (rows._digits): up to 5e-6 of relative error each
        assert abs(row["ratio"] - row["baseline_median"] / row["median"]) < 2e-5 * row["ratio"], row
    assert "check: the fused fp32 run draws the reference run's samples" in report
    assert "FAILED" not in report and "Traceback" not in report
    assert "## torch.compile of both networks" in report
    # the short profile before the long sampling part: a run out of time loses the long one
    assert report.index("## kernel profile (limit") < report.index("## sampling (limit")


@pytest.mark.integration
def test_gpu_timings_only_runs_the_sections_it_names():
    """gpu_timings.py --only 'launch configurations': the two launch sweeps, no other section."""
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_timings.py"), "--dry-run", "--only",
                          "launch configurations"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    sections = [line for line in run.stdout.splitlines() if line.startswith("# ") and not line.endswith(" s")]
    assert sections == ["# sample_from_hidden launch configurations", "# sample_categorical launch configurations"]
    assert "categorical config" in run.stdout and "warps=1" in run.stdout


@pytest.mark.integration
def test_gpu_timings_refuses_an_only_word_that_names_no_section():
    """A misspelt --only word ran no section and exited 0: refused before anything is timed,
    with the sections' titles."""
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_timings.py"), "--dry-run", "--only",
                          "rotary,launch configuration,philox uniform"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2, (run.stdout + run.stderr)[-4000:]
    assert "'philox uniform'" in run.stderr and "'rotary'" not in run.stderr, run.stderr
    assert "philox_uniform" in run.stderr  # the titles, to pick from
    assert "copy bandwidth" not in run.stdout and "# rotary" not in run.stdout, run.stdout


@pytest.mark.integration
def test_gpu_timings_time_the_step_against_each_gathered_draw(tmp_path):
    """The gathered torch step is timed with each token draw of baselines.CATEGORICAL: which
    is fastest depends on the device, and the ratio is against the fastest."""
    rows_file = tmp_path / "rows.jsonl"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_timings.py"), "--dry-run", "--only",
                          "sampler step", "--rows", str(rows_file)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    baselines = {row["baseline"] for row in map(json.loads, rows_file.read_text().splitlines())}
    assert baselines == {"torch: paper listing", "torch: gathered, softmax + torch.multinomial",
                         "torch: gathered, Gumbel-argmax", "torch: gathered, inverse CDF"}, baselines


@pytest.mark.integration
def test_gpu_timings_time_compact_fixed_against_a_sync_free_torch_compaction(tmp_path):
    """nonzero + index_select sends its count to the host on CUDA and returns as many rows as are
    active, another job: related code, never the fastest torch code; the sorted compaction does
    compact_fixed's, without a sync."""
    rows_file = tmp_path / "rows.jsonl"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_timings.py"), "--dry-run", "--only",
                          "compact", "--rows", str(rows_file)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    baselines = {row["baseline"] for row in rows if row["op"] == "compact_fixed"}
    assert baselines == {"related: nonzero + index_select", "torch: sort + index_select"}, baselines


VERSUS = """
import gpu_timings, torch
bench = gpu_timings.Bench(torch.device("cpu"))
bench.copy_gbs = 1.0
times = {"ours": (0.010, 0.005), "a": (0.020, 0.019), "b": (0.030, 0.010)}  # ms: eager, graph
bench.eager_ms = lambda fn, rep_ms=100: times[fn()][0]
bench.graph_ms = lambda fn: times[fn()][1]
bench.versus(gpu_timings.timed_case("op", (1,), torch.float32), "case", lambda: "ours",
             {"a": lambda: "a", "b": lambda: "b"}, 1, "x")
"""


@pytest.mark.integration
def test_gpu_timings_compare_each_mode_with_its_own_fastest_torch_code():
    """Eager's fastest candidate (a) is not graph replay's (b): the graph ratio is against b."""
    run = subprocess.run([sys.executable, "-c", VERSUS], cwd=ROOT / "benchmarks", capture_output=True, text=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    line, = [line for line in run.stdout.splitlines() if line.startswith("case")]
    assert "best torch (a / b)" in line and " 2.00x eager  2.00x graph" in line, line


@pytest.mark.integration
def test_gpu_check_answers_help_without_running():
    """--help prints the usage and the script's comment (what it runs, its budget), and runs nothing."""
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: ") and "GPU check of ddpd" in done.stdout and "## build" not in done.stdout


@pytest.mark.integration
def test_gpu_check_names_the_sources_it_ran(tmp_path):
    """The report names a hash of the sources, the one --tree-hash prints for the checkout (a
    device's copy of .git can be older than the files it ran), and a changed file changes it."""
    script = str(ROOT / "benchmarks" / "gpu_check.sh")
    first = subprocess.run(["bash", script, "--tree-hash"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and first.stderr == "" and len(first.stdout.strip()) == 12, first
    copy = tmp_path / "copy"
    for part in ("ddpd", "kernels", "csrc", "benchmarks", "tests"):  # the hashed folders, without a .git
        shutil.copytree(ROOT / part, copy / part, symlinks=True,  # ddpd/kernels: a link where it is one
                        ignore=shutil.ignore_patterns("*.so", "__pycache__", "results"))
    run = lambda: subprocess.run(["bash", str(copy / "benchmarks" / "gpu_check.sh"), "--tree-hash"],  # noqa: E731
                                 capture_output=True, text=True, timeout=120).stdout
    assert run() == first.stdout
    (copy / "ddpd" / "ops" / "rng.py").write_text((copy / "ddpd" / "ops" / "rng.py").read_text() + "\n")
    assert run() != first.stdout
    env = dict(os.environ, PYTHON=sys.executable, TMPDIR=str(tmp_path))
    dry = subprocess.run(["bash", script, "--dry-run", "--only", "host"], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-4000:]
    report = (tmp_path / "ddpd-gpu-check-dry-run.txt").read_text()
    assert f"# sources {first.stdout.strip()} " in report


@pytest.mark.integration
def test_gpu_check_only_runs_the_named_parts(tmp_path):
    """--only host: the build (printed in a dry run) and the host cost part, nothing else;
    a part it does not know is a usage error."""
    env = dict(os.environ, PYTHON=sys.executable, TMPDIR=str(tmp_path))
    script = str(ROOT / "benchmarks" / "gpu_check.sh")
    run = subprocess.run(["bash", script, "--dry-run", "--only", "host"], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    report = (tmp_path / "ddpd-gpu-check-dry-run.txt").read_text()
    assert "## host cost: passed" in report and "## build (limit" in report
    assert "profile of sample_categorical" in report
    for part in ("gpu tests", "timings", "sampling", "kernel profile"):
        assert f"## {part}" not in report
    bad = subprocess.run(["bash", script, "--only", "tests,everything"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("usage: ")


def test_no_gpu_test_is_taken_for_an_interpreter_test():
    """On a GPU the conftest skips tests that run Triton kernels on CPU tensors, which it
    recognises by name (`*_triton`, `*_kernel`): a GPU test calling such a name would be
    skipped there unseen (one calling load_flash_kernel was, until NOT_TRITON)."""
    import importlib.util

    import conftest

    files = sorted(path for path in (ROOT / "tests").glob("*/test_*.py") if "pytest.mark.gpu" in path.read_text())
    taken = []
    for path in files:
        name = path.stem
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module_gpu = "gpu" in str(getattr(module, "pytestmark", ""))
        for attribute, fn in vars(module).items():
            if attribute.startswith("test_") and (module_gpu or "gpu" in str(getattr(fn, "pytestmark", ""))):
                item = type("Item", (), {"function": fn})()
                if conftest._launches_triton_on_cpu(item):
                    taken.append(f"{name}::{attribute}")
    assert files and not taken, taken


def test_an_old_setuptools_takes_the_carried_wheel_or_says_the_build_will_fail(tmp_path):
    """benchmarks/carried_setuptools.sh, which both device scripts source before they build."""
    def use(python: str, wheel: bool) -> subprocess.CompletedProcess:
        (tmp_path / ".whl").mkdir(exist_ok=True)
        if wheel:
            (tmp_path / ".whl" / "setuptools-99.0.0-py3-none-any.whl").write_bytes(b"not a wheel")
        script = f". {ROOT / 'benchmarks' / 'carried_setuptools.sh'}; use_carried_setuptools {python}"
        return subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True)

    assert use(sys.executable, wheel=False).returncode == 0  # this setuptools builds: nothing to do
    old = tmp_path / "old-python"  # a Python whose setuptools is older than 77
    old.write_text("#!/bin/sh\nexit 1\n")
    old.chmod(0o755)
    refused = use(str(old), wheel=False)
    assert refused.returncode == 1 and "no .whl/setuptools-*.whl carried" in refused.stdout
    assert use(str(old), wheel=True).returncode == 1  # the wheel cannot be installed with it: said, not hidden


# A stand-in for python on a CUDA machine: it answers gpu_check.sh's questions about the device,
# runs nothing of ddpd (the build, the tests and the benchmarks print a line each) and records
# every call in calls.txt. FAKE_PYTEST_RC is the tests' exit status; FAKE_KILL=1 makes the
# parallel benchmark, after its first row reached the log under $OUT (or 5 s without it), kill
# every process of the run, as a call's timeout or the lease's end does.
FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$*" >>"$FAKE_DIR/calls.txt"
case "$*" in
    *cuda.is_available*) exit 0 ;;
    *get_device_name*) echo fake-gpu ;;
    *get_device_capability*) echo 9.0 ;;
    --version) echo "Python 3.fake" ;;
    *"rows.py --tree-hash"*) echo 0123456789ab ;;
    *"import xdist"*) exit 1 ;;
    "-m pytest"*) echo "fake gpu tests ran"; exit "${FAKE_PYTEST_RC:-0}" ;;
    *gpu_parallel.py*)
        echo "| 64 | ddpd default (one at a time) | 512 | fake row |"
        if [ -n "${FAKE_KILL:-}" ]; then
            for _ in $(seq 50); do grep -qs "fake row" "$OUT"/*.txt && break; sleep 0.1; done
            # the run's process group (the session's, the test started one) and timeout's own
            kill -KILL -- "-$(cut -d ' ' -f 6 /proc/$$/stat)" 0
        fi ;;
    *gpu_timings.py*) echo '{"op": "fake"}' >>benchmarks/results/fake-gpu.jsonl ;;
esac
exit 0
"""


def _fake_gpu_run(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Run a copy of gpu_check.sh (its results in the copy) with FAKE_PYTHON as $PYTHON and $OUT
    a folder; return the finished process and $OUT."""
    copy, out = tmp_path / "copy", tmp_path / "out"
    (copy / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    out.mkdir()
    for name in ("gpu_check.sh", "carried_setuptools.sh"):
        shutil.copy(ROOT / "benchmarks" / name, copy / "benchmarks" / name)
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    full = dict(os.environ, PYTHON=str(python), OUT=str(out), FAKE_DIR=str(tmp_path), PATH=os.environ["PATH"])
    full.update(env)
    # a session of its own: FAKE_KILL kills the run's process group, not the test's
    run = subprocess.run(["bash", str(copy / "benchmarks" / "gpu_check.sh"), *args], cwd=tmp_path, env=full,
                         capture_output=True, text=True, timeout=120, start_new_session=True)
    return run, out


@pytest.mark.integration
def test_a_killed_run_hands_back_the_log_it_wrote_under_out(tmp_path):
    """The log goes to $OUT as the run goes: a call cut short by its timeout still returns
    every row measured before."""
    run, out = _fake_gpu_run(tmp_path, "--only", "parallel", FAKE_KILL="1")
    assert run.returncode == -9, run.stdout[-2000:] + run.stderr[-2000:]  # killed, as the lease's end kills it
    log = (out / "fake-gpu-parallel.txt").read_text()
    assert "## parallel decoding (limit" in log and "fake row" in log


@pytest.mark.integration
@pytest.mark.parametrize("parts, written", [("parallel", False), ("timings", True)])
def test_the_rows_file_is_handed_back_only_when_this_run_wrote_it(tmp_path, parts, written):
    """The parallel part writes no rows: the committed rows file is not handed back as this run's."""
    rows = tmp_path / "copy" / "benchmarks" / "results" / "fake-gpu.jsonl"
    rows.parent.mkdir(parents=True)
    rows.write_text('{"op": "an older run"}\n')
    run, out = _fake_gpu_run(tmp_path, "--only", parts)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert (out / "fake-gpu.jsonl").exists() == written
    if written:
        assert "its rows copied to" in run.stdout and '"fake"' in (out / "fake-gpu.jsonl").read_text()
    else:
        assert "rows copied" not in run.stdout and "wrote no rows" in run.stdout, run.stdout


@pytest.mark.integration
def test_the_parallel_part_first_runs_the_gpu_tests_of_what_it_times(tmp_path):
    """The commit policies under CUDA graphs and the Philox kernel are tested on the GPU before
    they are timed; their failure is reported and the timings still run."""
    run, out = _fake_gpu_run(tmp_path, "--only", "parallel", FAKE_PYTEST_RC="1")
    log = (out / "fake-gpu-parallel.txt").read_text()
    assert run.returncode == 1 and "## gpu tests of the timed code: FAILED (exit 1)" in log, log
    assert "## parallel decoding: passed" in log and "fake row" in log
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    tests = next(i for i, call in enumerate(calls) if call.startswith("-m pytest"))
    assert tests < next(i for i, call in enumerate(calls) if "gpu_parallel.py" in call)
    for words in ("tests/sampling/test_sampling_gpu.py", "tests/ops/test_op_gpu.py", "-m gpu", "philox", "budget",
                  "maskgit", "threshold"):
        assert words in calls[tests], calls[tests]
    assert "## gpu tests of the timed code (limit 45 s)" in log


@pytest.mark.integration
def test_the_extension_part_requires_the_cuda_kernels(tmp_path):
    """Without its CUDA kernels ddpd._C leaves the ops to their torch references on the GPU,
    which the timings would report as ddpd's: the extension part asks for them."""
    run, _ = _fake_gpu_run(tmp_path, "--only", "parallel")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "-m ddpd.ops --cuda" in (tmp_path / "calls.txt").read_text().splitlines()


@pytest.mark.integration
def test_both_device_scripts_follow_one_lease_plan(tmp_path):
    """docs/text8/README.md's lease plan runs the two device scripts in one lease; both headers
    point to it, and the parallel part's limits shrink to fit its budget there."""
    readme = (ROOT / "docs" / "text8" / "README.md").read_text()
    plan = " ".join(readme.split("\n### One GPU lease for both device scripts\n")[1].split())
    for words in ("`BUDGET_S=480 bash docs/text8/gpu_train.sh`, with a `timeout_s` of 540",
                  "`DDPD_GPU_BUDGET_S=240 bash benchmarks/gpu_check.sh --only parallel`, with a `timeout_s` of 270"):
        assert words in plan, words
    assert "allow it" not in readme
    # the image's setuptools is unknown until a call reports it: a build that refuses it costs a call
    assert "carrying `data` and `.whl`" in plan and "carrying `.whl` again" in plan
    for script in ("docs/text8/gpu_train.sh", "benchmarks/gpu_check.sh"):
        header = (ROOT / script).read_text().split("\nset -uo pipefail")[0]
        prose = " ".join(re.sub(r"\n#\s*", " ", header).split())  # the comment's lines as one
        assert 'docs/text8/README.md, "One GPU lease for both device scripts"' in prose, script
    run, out = _fake_gpu_run(tmp_path, "--only", "parallel", DDPD_GPU_BUDGET_S="240")
    log = (out / "fake-gpu-parallel.txt").read_text()
    limits = dict(re.findall(r"^## (.+) \(limit (\d+) s\)$", log, re.M))
    assert list(limits) == ["build", "extension", "gpu tests of the timed code", "parallel decoding"], log
    assert 200 < int(limits["parallel decoding"]) <= 240 and "budget 240 s" in log


# The CPU parts of benchmarks/gpu_timings.py, called in this process: the timings themselves
# need a GPU, the rows, checks and section choice around them do not.
@pytest.fixture(scope="module")
def timings():
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_timings

    return gpu_timings


@pytest.fixture
def bench(timings):
    import torch

    made = timings.Bench(torch.device("cpu"))
    made.copy_gbs = 1.0
    made.peak_bytes = lambda fn: None  # no memory probe: the rows and lines are what is checked
    return made


def test_a_timed_case_names_its_dtype_without_the_torch_prefix(timings):
    import torch

    assert timings.timed_case("norm", (2, 3), torch.bfloat16, "adaLN") == dict(
        op="norm", shape=(2, 3), dtype="bfloat16", params="adaLN")


def test_rows_give_seconds_and_leave_out_what_was_not_timed(timings, bench):
    import torch

    timed = timings.timed_case("op", (1,), torch.float32)
    bench.record(timed, None, {"a": 1.0}, "graph")  # ours not timed (no graph on the CPU)
    bench.record(timed, 2.0, {"a": 4.0, "b": None}, "graph")
    row, = bench.rows
    assert (row["baseline"], row["mode"], row["median"], row["baseline_median"]) == ("torch: a", "graph", 2e-3, 4e-3)
    assert row["dtype"] == "float32" and row["source"] == "benchmarks/gpu_timings.py"


def test_versus_writes_eager_and_graph_rows_apart(timings, bench):
    import torch

    times = {"ours": (0.010, 0.005), "a": (0.020, 0.019), "b": (0.030, None)}  # ms: eager, graph
    bench.eager_ms = lambda fn, rep_ms=100: times[fn()][0]
    bench.graph_ms = lambda fn: times[fn()][1]
    bench.versus(timings.timed_case("op", (1,), torch.float32), "case", lambda: "ours",
                 {"a": lambda: "a", "b": lambda: "b"}, 1, "x")
    got = sorted((row["mode"], row["baseline"], row["median"], row["baseline_median"]) for row in bench.rows)
    assert got == [("eager", "torch: a", 1e-5, 2e-5), ("eager", "torch: b", 1e-5, 3e-5),
                   ("graph", "torch: a", 5e-6, 1.9e-5)]


def test_without_graphs_versus_names_one_fastest_candidate_and_no_graph_figures(timings, bench, capsys):
    import torch

    times = {"ours": 0.010, "a": 0.020, "b": 0.030}  # ms, eager only: no graph replay on the CPU
    bench.eager_ms = lambda fn, rep_ms=100: times[fn()]
    bench.versus(timings.timed_case("op", (1,), torch.float32), "case", lambda: "ours",
                 {"a": lambda: "a", "b": lambda: "b"}, 1, "x")
    out = capsys.readouterr().out.splitlines()
    line, = [line for line in out if line.startswith("case")]
    assert "best torch (a) " in line and " 2.00x eager   n/a graph" in line and line.endswith("host cost n/a"), line
    assert "  also torch b:    30.0 /     n/a us" in out and {row["mode"] for row in bench.rows} == {"eager"}


def test_compare_is_against_the_fastest_candidate_and_rows_related_code_apart(timings, bench, capsys):
    import torch

    times = {"ours": 0.010, "a": 0.040, "b": 0.020, "other job": 0.005}  # ms
    bench.eager_ms = lambda fn, rep_ms=100: times[fn()]
    bench.copy_gbs = 400.0
    ours_ms, theirs = bench.compare(timings.timed_case("op", (1,), torch.float32), "case", lambda: "ours",
                                    {"a": lambda: "a", "b": lambda: "b"}, 2_000_000,
                                    related={"other job": lambda: "other job"})
    assert ours_ms == 0.010 and theirs == {"a": 0.040, "b": 0.020}
    line, = [line for line in capsys.readouterr().out.splitlines() if line.startswith("case")]
    assert "best torch (b)" in line and "   2.00x" in line and "200.0 GB/s  50.0% of copy" in line, line
    assert sorted(row["baseline"] for row in bench.rows) == ["related: other job", "torch: a", "torch: b"]


def test_a_check_allows_floats_within_1e_4_and_equal_nans_only(timings):
    import torch

    nan = float("nan")
    assert timings.differs(0, torch.tensor([1.0, nan]), torch.tensor([1.00005, nan])) is None
    assert timings.differs(1, torch.tensor([1.0, 2.0]), torch.tensor([1.001, 2.0])) == "output 1: 1 of 2 differ"
    assert timings.differs(0, torch.tensor([1.0]), torch.tensor([nan])) == "output 0: 1 of 1 differ"
    assert timings.differs(0, torch.tensor([3, 4]), torch.tensor([3, 5])) == "output 0: 1 of 2 differ"
    assert timings.differs(2, torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64)) == \
        "output 2: torch.float32[1] vs torch.float64[1]"


def test_a_check_skips_fields_not_asked_for_and_counts_a_mismatch(bench, capsys):
    import torch

    t = torch.arange(3)
    bench.check("same", (t, None, [t]), (t, t))
    bench.check("extra", (t, t), (t,))
    bench.check("other", (t,), (t + 1,))
    out = capsys.readouterr().out
    assert "check same: same outputs as the reference" in out
    assert "check extra: MISMATCH with the reference: 2 outputs vs 1" in out
    assert "check other: MISMATCH with the reference: output 0: 3 of 3 differ" in out
    assert bench.failures == 2


def test_a_bit_for_bit_check_runs_only_on_a_device(bench, capsys):
    import torch

    bench.check_bits("cpu", "rotary", torch.zeros(2), torch.ones(2))  # the CPU ran the reference
    bench.cuda = True
    bench.check_bits("equal", "rotary", torch.ones(2), torch.ones(2))
    bench.check_bits("unequal", "rotary", torch.zeros(2), torch.ones(2))
    out = capsys.readouterr().out
    assert "check cpu: none (on the CPU rotary runs the reference)" in out
    assert "check equal: the reference's values bit for bit" in out and "check unequal: MISMATCH" in out
    assert bench.failures == 1


def test_a_case_that_raises_is_printed_and_counted_and_the_run_goes_on(bench, capsys):
    with bench.case("broken"):
        raise ValueError("no such shape")
    with bench.case("fine"):
        pass
    out = capsys.readouterr().out
    assert "broken: ERROR" in out and "ValueError: no such shape" in out and "fine" not in out
    assert bench.failures == 1


def test_the_copy_bandwidth_counts_a_read_and_a_write(timings, bench, capsys):
    bench.median_ms = lambda fn, rep_ms=100: 0.5
    timings.copy_bandwidth(bench, 2**18)  # 1 MiB read and 1 MiB written in 0.5 ms
    assert bench.copy_gbs == pytest.approx(2 * 2**20 / 0.5e6)
    assert timings.mib(3 * 2**20) == "     3.0 MiB" and timings.mib(None) == "     n/a"


def test_without_a_gpu_only_a_dry_run_runs(timings, monkeypatch, capsys):
    monkeypatch.setattr(timings.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["gpu_timings.py"])
    assert timings.main() == 2
    assert "no CUDA device visible to torch (use --dry-run" in capsys.readouterr().err


def test_a_dry_run_runs_each_shape_of_the_named_sections_and_exits_1_on_a_failed_case(timings, monkeypatch,
                                                                                      tmp_path, capsys):
    ran = []

    def fine(bench, size):
        ran.append(size)

    def broken(bench, size):
        ran.append(size)
        raise RuntimeError("broken case")

    merged = []
    monkeypatch.setattr(timings, "PLAN", [("alpha one", fine, "a"), ("beta two", broken, "b"), ("gamma", fine, "c")])
    monkeypatch.setitem(timings.SHAPES, "dry", dict(a=[(1,), (2,)], b=[(3,), (4,)], c=[(5,)], copy_floats=16))
    monkeypatch.setattr(timings.result_rows, "merge", lambda path, rows: merged.append(path) or len(rows))
    monkeypatch.setattr(sys, "argv", ["gpu_timings.py", "--dry-run", "--only", "alpha,,beta"])
    assert timings.main() == 1
    assert ran == [1, 2, 3, 4] and merged == []  # a dry run writes rows only where --rows says
    assert "gpu_timings: 2 failed case(s)" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["gpu_timings.py", "--dry-run", "--only", "gamma", "--rows",
                                      str(tmp_path / "rows.jsonl")])
    assert timings.main() == 0
    assert ran[4:] == [5] and merged == [tmp_path / "rows.jsonl"]


def test_each_case_names_its_rows_by_op_shape_dtype_and_parameters(timings, bench):
    """The rows file keeps one row per case and baseline (rows.merge): a case named as another
    op's, or without its parameters, would replace that case's rows."""
    import torch

    bench.eager_ms = bench.median_ms = lambda fn, rep_ms=100: 1.0  # only the rows' names are checked
    timings.time_multinomial(bench, 4, 27, 2, False)
    timings.time_planner_ops(bench, 2, 16)
    timings.time_philox_uniform(bench, 2, 8)
    timings.time_sample_categorical_controls(bench, 2, 300, torch.float32, "top_k")
    timings.time_rotary(bench, 1, 2, 4, 8, torch.bfloat16)
    timings.time_norm(bench, 1, 4, 8, False, torch.bfloat16)
    named = {(row["op"], tuple(row["shape"]), row["dtype"], row["params"]) for row in bench.rows}
    assert named == {("multinomial", (4, 27), "float32", "k=2 without replacement"),
                     ("planner_select", (2, 16), "float32", ""), ("planner_select_mask", (2, 16), "float32", ""),
                     ("planner_mask", (2, 16), "float32", ""), ("philox_uniform", (2, 8), "float32", "N x M"),
                     ("sample_categorical", (2, 300), "float32", "T=0.8 top_k"),
                     ("rotary", (1, 2, 4, 8), "bfloat16", "B x heads x L x d"), ("norm", (1, 4, 8), "bfloat16", "")}
    assert bench.failures == 0  # each op drew what its reference draws
