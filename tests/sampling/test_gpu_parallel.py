"""benchmarks/gpu_parallel.py (the parallel-decoding part of benchmarks/gpu_check.sh) runs only
where a GPU is lent: its dry run (tiny shapes on the CPU, every code path: whole runs, the
extrapolated default, the emulated CUDA-graph path) runs here through gpu_check.sh."""
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddpd.sampling import ErrorBudget

ROOT = Path(__file__).resolve().parents[2]
SAMPLERS = ("ddpd default (one at a time)", "ddpd policy 1", "ddpd policy 2", "maskgit", "maskgit, eager",
            "mask threshold:0.9")
BUDGETS = (4, 8)  # the dry run's network-pass budgets (gpu_parallel.DRY_RUN)


@pytest.mark.integration
def test_gpu_check_runs_the_parallel_decoding_dry_run(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, TMPDIR=str(tmp_path))
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--only", "parallel"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    report = (tmp_path / "ddpd-gpu-check-dry-run.txt").read_text()
    assert run.returncode == 0, report[-4000:] + run.stderr[-2000:]
    assert "## parallel decoding: passed" in report and "gpu_parallel: 0 failed" in report
    assert "FAILED" not in report and "Traceback" not in report and "NOT VALID" not in report
    for part in ("timings", "host cost", "sampling", "kernel profile"):  # --only parallel: nothing else
        assert f"## {part}" not in report
    # the GPU tests of the timed code, printed (not run) without a GPU, before the timings
    assert report.index("## gpu tests of the timed code (limit") < report.index("## parallel decoding (limit")
    assert re.search(r"ddpd policy 1: error-budget:bound=0,max_k=256,.*plan_every=1000", report)
    assert re.search(r"ddpd policy 2: error-budget:bound=1,max_k=256,.*plan_every=4", report)
    sections = report.split("## ")
    for model, length in (("bundled text8", 16), ("GPT-2-size", 32)):
        section = next(s for s in sections if s.startswith(model))
        rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
                if re.match(r"\| \d+ \|", line)]
        assert len(rows) == 2 * 10, section  # batches 1, 2: the default, 2 budgets x 4 parallel samplers, eager maskgit
        assert {row[1] for row in rows} == set(SAMPLERS)
        for batch, sampler, steps, passes, per_pass, rate, tokens, ratio, note in rows:
            assert sampler in SAMPLERS and float(rate) > 0 and float(per_pass) > 0
            assert abs(float(tokens) - float(rate) * length) <= 1  # tokens/s = samples/s x L
            if sampler.startswith("ddpd default"):
                # ddpd-sample's default: 2 x L steps with the bundled model, L with other models
                assert ratio == "1.00x" and int(steps) == (2 if model == "bundled text8" else 1) * length
                assert ("extrapolated" in note) == (model == "GPT-2-size")
            else:
                assert 0 < float(passes) <= max(BUDGETS) + 1  # measured: a planner pass may end a budget
        extrapolated = [float(r[3]) for r in rows if r[1].startswith("ddpd default") and model == "GPT-2-size"]
        assert all(p == 2 * length for p in extrapolated)  # random weights: every step of L, 2 passes each


@pytest.mark.integration
def test_gpu_parallel_takes_only_an_error_budget_policy():
    """--policy is DDPD's policy, an error-budget spec: a mask-loop policy or a bad field is a usage error."""
    script = str(ROOT / "benchmarks" / "gpu_parallel.py")
    for spec, words in (("threshold:0.9", "must be an error-budget spec"), ("error-budget:bound=-1", "bound")):
        run = subprocess.run([sys.executable, script, "--dry-run", "--policy", spec], capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 2 and "--policy" in run.stderr and words in run.stderr, run.stderr


class PipedStdout(io.StringIO):
    """stdout as a pipe to tee holds it: what is printed reaches the log only when flushed."""

    def __init__(self):
        super().__init__()
        self.flushed = ""

    def flush(self):
        self.flushed = self.getvalue()


def test_each_row_is_flushed_as_soon_as_it_is_measured(monkeypatch):
    """A run killed by its timeout keeps every row measured before, even where Python buffers
    its output (run without PYTHONUNBUFFERED)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_parallel

    stream, flushed_rows = PipedStdout(), []
    monkeypatch.setattr(sys, "stdout", stream)

    def one_row(clock, pair, name, run, batch, steps, warm_steps, first):  # measures nothing
        flushed_rows.append(len(re.findall(r"^\| \d+ \|", stream.flushed, re.M)))
        return gpu_parallel.Row(name, steps, 1.0, steps, 1.0)

    monkeypatch.setattr(gpu_parallel, "one_row", one_row)
    pair = gpu_parallel.Pair("toy", torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), 4, 5)
    gpu_parallel.table(pair, None, [ErrorBudget()], gpu_parallel.Sizes(budgets=(2,), batches=(1, 2)))
    # 2 batches x (the default, the policy, MaskGIT, the threshold, eager MaskGIT)
    assert flushed_rows == list(range(len(flushed_rows))) and len(flushed_rows) == 2 * 5
    assert len(re.findall(r"^\| \d+ \|", stream.flushed, re.M)) == len(flushed_rows)


def test_the_main_comparison_is_measured_first(monkeypatch):
    """A run cut short answers the main question first: at batch 64, then 1, the default against
    the first policy and MaskGIT at the smallest budget (matched passes); the rest after."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_parallel

    measured = []

    def one_row(clock, pair, name, run, batch, steps, warm_steps, first):  # measures nothing
        measured.append((batch, name, steps))
        return gpu_parallel.Row(name, steps, 1.0, steps, 1.0)

    monkeypatch.setattr(gpu_parallel, "one_row", one_row)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    pair = gpu_parallel.Pair("toy", torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), 4, 5)
    policies = [ErrorBudget(0.0, 8, plan_every=1000), ErrorBudget(1.0, 8, plan_every=4)]
    gpu_parallel.table(pair, None, policies, gpu_parallel.Sizes(budgets=(4, 8)))
    main = [(batch, name) for batch in (64, 1) for name in ("ddpd default (one at a time)", "ddpd policy 1", "maskgit")]
    assert [(batch, name) for batch, name, _ in measured[:6]] == main
    assert [steps for _, name, steps in measured[:6] if name == "maskgit"] == [4, 4]
    assert len(measured) == 2 * 10 and len(set(measured)) == 2 * 10  # then every other configuration, once


@pytest.mark.parametrize("bundled", [True, False])
def test_the_default_run_takes_ddpd_samples_default_steps(monkeypatch, bundled):
    """2 x L steps with the bundled model, L with any other pair, as ddpd-sample chooses."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_parallel
    from ddpd.cli.sample import default_steps

    pair = gpu_parallel.Pair("toy", torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), 4, 5, bundled=bundled)
    (name, steps, _), *_ = gpu_parallel.samplers(pair, [ErrorBudget()], (2,), "off")
    assert name.startswith("ddpd default") and steps == default_steps(4, bundled) == (8 if bundled else 4)
