"""benchmarks/gpu_sampling.py (the sampling part of benchmarks/gpu_check.sh) times whole runs
on a GPU; gpu_check.sh's dry run runs its every part on the CPU (tests/tools/test_gpu_check_script.py).
Here, without running a sampler: its timer, its rows and how main runs the parts."""
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def script(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_sampling

    monkeypatch.setattr(gpu_sampling, "ROWS", [])
    return gpu_sampling


def test_the_clock_times_with_cuda_events_only_on_a_gpu(script, monkeypatch):
    calls = []
    monkeypatch.setattr(script, "median_seconds", lambda fn, cuda, repeats, warmup: calls.append(
        (fn, cuda, repeats, warmup)) or 0.5)
    assert script.Clock(torch.device("cpu"))(print) == 0.5
    assert script.Clock(torch.device("cuda"))(len, repeats=1, warm=False) == 0.5
    assert calls == [(print, False, 3, 1), (len, True, 1, 0)]


def test_peak_memory_on_the_cpu_runs_the_call_once_and_is_0(script):
    calls = []
    assert script.peak_memory(lambda: calls.append(1), torch.device("cpu")) == 0.0 and calls == [1]


def test_each_whole_run_but_the_default_is_a_row_against_the_default(script, monkeypatch):
    made = []
    monkeypatch.setattr(script.result_rows, "row", lambda *args, **kwargs: made.append((args, kwargs)) or len(made))
    seconds = {"reference fp32": 4.0, script.DEFAULT: 1.0, "fused fp32": 2.0}
    script.record_runs({"commit": "c"}, "gpu", (2, 16, 27), "params", seconds)
    assert script.ROWS == [1, 2]
    for (args, kwargs), variant in zip(made, ("reference fp32", "fused fp32")):
        assert args == ("ddpd_sample", (2, 16, 27), "bfloat16", 1.0, variant, seconds[variant])
        assert kwargs == dict(params="params", mode="run", device="gpu", source="benchmarks/gpu_sampling.py",
                              stamp={"commit": "c"})


def test_without_cuda_and_without_dry_run_the_script_says_so(script, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert script.main([]) == 1
    assert "no CUDA device (use --dry-run" in capsys.readouterr().err


def _parts(script, monkeypatch, failing=()):
    """Parts that record their call (and the device) and raise where named in `failing`."""
    ran = []

    def part(name):
        def run(args, device, clock):
            ran.append((name, device.type, clock.cuda))
            if name in failing:
                raise RuntimeError(f"{name} broke")
        run.__name__ = name
        return run

    for name in ("bundled", "gpt2_pair", "compiled"):
        monkeypatch.setattr(script, name, part(name))
    return ran


def test_a_part_that_fails_is_reported_and_the_others_still_run(script, monkeypatch, capsys):
    ran = _parts(script, monkeypatch, failing=("bundled",))
    assert script.main(["--dry-run"]) == 1
    assert ran == [("bundled", "cpu", False), ("gpt2_pair", "cpu", False)]  # no --compile: no compiled part
    assert "gpu_sampling: bundled FAILED: RuntimeError: bundled broke" in capsys.readouterr().out
    ran = _parts(script, monkeypatch)
    assert script.main(["--dry-run", "--compile"]) == 0
    assert [name for name, _, _ in ran] == ["bundled", "gpt2_pair", "compiled"]


@pytest.mark.parametrize("argv, cuda, target", [
    (["--dry-run"], False, None),  # a dry run writes rows only where --rows names a file
    (["--dry-run", "--rows", "ROWS"], False, "ROWS"),
    ([], True, "DEVICE"),  # on a GPU, by default the device's file
])
def test_the_rows_go_to_rows_or_on_a_gpu_to_the_devices_file(script, monkeypatch, capsys, tmp_path, argv, cuda,
                                                              target):
    ran = _parts(script, monkeypatch)
    merged = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(script.result_rows, "rows_path", lambda device: tmp_path / f"DEVICE-{device}")
    monkeypatch.setattr(script.result_rows, "merge", lambda path, rows: merged.append((path, rows)) or 3)
    script.ROWS.append({"op": "ddpd_sample"})
    argv = [str(tmp_path / a) if a == "ROWS" else a for a in argv]
    assert script.main(argv) == 0
    expected = ("cuda", True) if cuda else ("cpu", False)  # the device, and whether the clock uses CUDA events
    assert {(device, events) for _, device, events in ran} == {expected}
    if target is None:
        assert merged == [] and "rows written" not in capsys.readouterr().out
    else:
        path = tmp_path / ("ROWS" if target == "ROWS" else "DEVICE-cuda")
        assert merged == [(path, [{"op": "ddpd_sample"}])]
        assert f"gpu_sampling: 3 rows written to {path}" in capsys.readouterr().out


def test_the_kernel_profile_runs_the_steps_once_to_warm_and_once_profiled(script, capsys):
    """On the CPU, the CPU ops: their count and time are over the `steps` the call runs."""
    calls = []

    def fn():
        calls.append(1)
        for _ in range(4):
            torch.ones(8).add_(1)

    script.kernels(fn, 2, torch.device("cpu"), 3, "bfloat16", top=3)
    lines = capsys.readouterr().out.splitlines()
    assert calls == [1, 1] and len(lines) == 4
    assert lines[0].startswith("CPU ops of the fused bfloat16 run without graphs, batch 3: ")
    assert lines[0].endswith("ms a step; the 3 that take the most:")
    # each op runs 4 times a call, over 2 steps: 2 a step (the warm-up call is not counted)
    assert [float(line.split()[4]) for line in lines[1:]] == [2.0] * 3
    times = [float(line.split()[0]) for line in lines[1:]]
    assert times == sorted(times, reverse=True)  # the ops that take the most first
    script.kernels(fn, 2, torch.device("cpu"), 3, "bfloat16", top=100)  # every op: their counts add up
    head, *ops = capsys.readouterr().out.splitlines()
    assert f": {sum(float(line.split()[4]) for line in ops):.0f} a step, " in head
    milliseconds = float(head.split(" ms a step")[0].split()[-1])
    assert abs(milliseconds - sum(float(line.split()[0]) for line in ops) / 1e3) < 2e-3  # per step, rounded
