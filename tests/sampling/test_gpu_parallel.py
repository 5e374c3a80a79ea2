"""benchmarks/gpu_parallel.py (the parallel-decoding part of benchmarks/gpu_check.sh) runs only
where a GPU is lent: its dry run (tiny shapes on the CPU, every code path: whole runs, the
extrapolated default, the emulated CUDA-graph path) runs here through gpu_check.sh."""
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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


def _script(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_parallel

    return gpu_parallel


def _result(steps: int, batch: int = 2, vocab: int = 5, stop=None):
    """A SampleResult's fields the script reads: every row ran `steps` steps of 2 passes each."""
    return SimpleNamespace(tokens=torch.zeros(batch, 3, dtype=torch.long) + vocab - 1,
                           passes=torch.full((batch,), 2 * steps), tokens_per_pass=1.5,
                           stop_step=torch.full((batch,), steps) if stop is None else torch.tensor(stop))


class StepClock:
    """Runs what it times once and answers the seconds scripted for the run's steps."""

    def __init__(self, seconds: dict):
        self.seconds, self.calls = seconds, []

    def __call__(self, fn, repeats=3, warm=True):
        self.calls.append((repeats, warm))
        fn()
        return self.seconds[self.last]


def _pair(gpu_parallel, extrapolate=None):
    return gpu_parallel.Pair("toy", torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), 4, 5, extrapolate)


@pytest.mark.parametrize("token", [-1, 5])
def test_a_token_outside_the_vocabulary_fails_the_run(monkeypatch, token):
    gpu_parallel = _script(monkeypatch)
    result = _result(4)
    result.tokens[1, 2] = token
    with pytest.raises(AssertionError, match=r"outside \[0, 5\)"):
        gpu_parallel.checked(result, _pair(gpu_parallel))
    result.tokens[1, 2] = 0  # both ends of the vocabulary are tokens
    assert gpu_parallel.checked(result, _pair(gpu_parallel)) is result


def test_a_run_is_timed_once_after_a_warm_up_of_at_most_warm_steps(monkeypatch):
    gpu_parallel = _script(monkeypatch)
    clock, calls = StepClock({6: 3.0, 10: 4.0}), []

    def run(batch, steps):
        calls.append((batch, steps))
        clock.last = steps
        return _result(steps, batch)

    assert gpu_parallel.measure(clock, _pair(gpu_parallel), run, 2, 10, 3)[0] == 4.0
    assert gpu_parallel.measure(clock, _pair(gpu_parallel), run, 2, 6, 8)[0] == 3.0
    assert calls == [(2, 3), (2, 10), (2, 6), (2, 6)] and clock.calls == [(1, False)] * 2


@pytest.mark.parametrize("stop, long_seconds, note", [
    (None, 3.0, ""),
    ((8, 5), 3.0, ", NOT VALID: rows stopped early"),  # one row of two stopped before the 8 steps
    (None, 1.0, ", NOT VALID: the longer run was not slower"),
])
def test_the_default_row_is_extrapolated_from_two_shorter_runs(monkeypatch, stop, long_seconds, note):
    """A run of n steps costs fixed + n x step: runs of 4 and 8 steps taking 1 s and 3 s give
    1 + 12 x 0.5 = 7 s for 16 steps; the estimate is flagged where rows stopped early or the
    longer run was not slower."""
    gpu_parallel = _script(monkeypatch)
    clock = StepClock({4: 1.0, 8: long_seconds})

    def run(batch, steps):
        clock.last = steps
        return _result(steps, batch, stop=stop if steps == 8 else None)

    row = gpu_parallel.one_row(clock, _pair(gpu_parallel, (4, 8)), "default", run, 2, 16, 8, first=True)
    assert row.sampler == "default" and row.steps == 16 and row.tokens_per_pass == 1.5
    assert row.passes == 2 * 16  # the longer run's passes a step, over all 16 steps
    assert row.note == "extrapolated from runs of 4 and 8 steps" + note
    if long_seconds == 3.0:
        assert row.samples_per_s == pytest.approx(2 / 7.0)


def test_only_the_first_configuration_of_a_pair_is_extrapolated(monkeypatch):
    gpu_parallel = _script(monkeypatch)
    clock = StepClock({16: 4.0})

    def run(batch, steps):
        clock.last = steps
        return _result(steps, batch)

    row = gpu_parallel.one_row(clock, _pair(gpu_parallel, (4, 8)), "policy", run, 2, 16, 8, first=False)
    assert (row.sampler, row.steps, row.samples_per_s, row.passes, row.note) == ("policy", 16, 0.5, 32.0, "")
    whole = gpu_parallel.one_row(clock, _pair(gpu_parallel), "default", run, 2, 16, 8, first=True)
    assert whole.note == "" and whole.samples_per_s == 0.5


def test_each_row_is_compared_with_the_default_at_its_batch_and_a_failure_is_reported(monkeypatch):
    """x default is the row's samples/s over the default's at the same batch; a configuration
    that raises is a FAILED row and a count, and the others are still measured."""
    gpu_parallel = _script(monkeypatch)
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stream)

    def one_row(clock, pair, name, run, batch, steps, warm_steps, first):
        if name == "maskgit, eager":
            raise RuntimeError("out of memory")
        return gpu_parallel.Row(name, steps, (1.0 if first else 3.0) * batch, steps, 1.0)

    monkeypatch.setattr(gpu_parallel, "one_row", one_row)
    sizes = gpu_parallel.Sizes(budgets=(2,), batches=(1, 4))
    assert gpu_parallel.table(_pair(gpu_parallel), None, [ErrorBudget()], sizes) == 2
    lines = stream.getvalue().splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if re.match(r"\| \d+ \|", line)]
    for batch in ("1", "4"):
        ratios = {row[1]: row[7] for row in rows if row[0] == batch}
        assert ratios["ddpd default (one at a time)"] == "1.00x" and ratios["ddpd policy 1"] == "3.00x"
        assert ratios["maskgit, eager"] == "-"
    failed = [row for row in rows if row[1] == "maskgit, eager"]
    assert len(failed) == 2 and all(row[-1] == "FAILED: RuntimeError: out of memory" for row in failed)
    assert any(row[0] == "4" and row[5] == "12.00" and row[6] == "48" for row in rows)  # tokens/s = samples/s x L


def test_each_policy_runs_at_the_steps_its_budget_of_passes_allows(monkeypatch):
    gpu_parallel = _script(monkeypatch)
    from ddpd.sampling.policies import ddpd_steps

    policies = [ErrorBudget(0.0, 8, plan_every=1000), ErrorBudget(1.0, 8, plan_every=2)]
    runs = gpu_parallel.samplers(_pair(gpu_parallel), policies, (4, 8), "off")
    assert len(runs) == 1 + 2 * 2 + 2 * 2 + 1  # the default, 2 policies and 2 mask policies at 2 budgets, eager
    table = [(name, n) for name, n, _ in runs]
    for number, policy in enumerate(policies, 1):
        assert sorted(n for name, n in table if name == f"ddpd policy {number}") == sorted(
            ddpd_steps(p, policy) for p in (4, 8))
    assert sorted(n for name, n in table if name == "maskgit") == [4, 8]
    assert sorted(n for name, n in table if name == "mask threshold:0.9") == [4, 8]
    assert [n for name, n in table if name == "maskgit, eager"] == [4]


def test_the_eager_maskgit_run_takes_no_cuda_graphs(monkeypatch):
    gpu_parallel = _script(monkeypatch)
    seen = {}

    def mask_sample(denoiser, batch, length, vocab, steps, policy, seed, device, execution):
        seen[execution.graphs] = (batch, length, vocab, steps, type(policy).__name__, seed, execution.fused)

    monkeypatch.setattr(gpu_parallel, "mask_sample", mask_sample)
    runs = {name: run for name, _, run in gpu_parallel.samplers(_pair(gpu_parallel), [ErrorBudget()], (4,), "auto")}
    runs["maskgit, eager"](2, 4)
    runs["maskgit"](3, 4)
    assert seen == {"off": (2, 4, 5, 4, "MaskGIT", 0, True), "auto": (3, 4, 5, 4, "MaskGIT", 0, True)}


def test_without_cuda_and_without_dry_run_the_script_says_so(monkeypatch, capsys):
    gpu_parallel = _script(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_parallel.main([]) == 1
    assert "no CUDA device (use --dry-run" in capsys.readouterr().err


def test_a_model_that_fails_to_build_is_reported_and_the_other_still_runs(monkeypatch, capsys):
    gpu_parallel = _script(monkeypatch)
    tables = []

    def bundled(device, sizes):
        raise OSError("no bundle")

    monkeypatch.setattr(gpu_parallel, "bundled", bundled)
    monkeypatch.setattr(gpu_parallel, "gpt2_pair", lambda device, dry_run: (device.type, dry_run))
    monkeypatch.setattr(gpu_parallel, "table", lambda pair, clock, policies, sizes: tables.append((pair, sizes)) or 0)
    assert gpu_parallel.main(["--dry-run", "--policy", "error-budget:bound=2,max_k=4"]) == 1
    out = capsys.readouterr().out
    assert "gpu_parallel: FAILED: OSError: no bundle" in out and "gpu_parallel: 1 failed" in out
    assert tables == [(("cpu", True), gpu_parallel.DRY_RUN)]
    assert "ddpd policy 1: error-budget:bound=2" in out and "ddpd policy 2" not in out
    assert "4x at batch 1, 3x at batch 64" in out
    monkeypatch.setattr(gpu_parallel, "bundled", lambda device, sizes: "bundled")
    assert gpu_parallel.main(["--dry-run"]) == 0 and "gpu_parallel: 0 failed" in capsys.readouterr().out


@pytest.mark.parametrize("spec, words", [("threshold:0.9", "--policy must be an error-budget spec"),
                                         ("maskgit", "--policy must be an error-budget spec"),
                                         ("error-budget:bound=-1", "--policy: ")])
def test_a_mask_loop_policy_or_a_bad_field_is_a_usage_error(monkeypatch, capsys, spec, words):
    gpu_parallel = _script(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        gpu_parallel.main(["--dry-run", "--policy", spec])
    assert exit_.value.code == 2 and words in capsys.readouterr().err


def test_a_gpu_run_measures_the_full_sizes_and_exits_1_however_many_failed(monkeypatch, capsys):
    gpu_parallel = _script(monkeypatch)
    built = []

    def table(pair, clock, policies, sizes):
        built.append((pair, sizes))
        return 2

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_parallel, "bundled", lambda device, sizes: ("bundled", device.type))
    monkeypatch.setattr(gpu_parallel, "gpt2_pair", lambda device, dry_run: ("gpt2", dry_run))
    monkeypatch.setattr(gpu_parallel, "table", table)
    assert gpu_parallel.main([]) == 1 and "gpu_parallel: 4 failed" in capsys.readouterr().out
    assert built == [(("bundled", "cuda"), gpu_parallel.Sizes()), (("gpt2", False), gpu_parallel.Sizes())]


def test_the_ddpd_runs_are_option_a_on_the_mask_denoiser_fused_and_seeded(monkeypatch):
    gpu_parallel = _script(monkeypatch)
    seen = {}

    def ddpd_sample(planner, denoiser, batch, length, vocab, steps, denoiser_type, seed, device, ddpd, execution):
        seen[ddpd.policy] = (batch, length, vocab, steps, denoiser_type, seed, device.type, ddpd.stop,
                             execution.fused, execution.graphs)

    monkeypatch.setattr(gpu_parallel, "ddpd_sample", ddpd_sample)
    policy = ErrorBudget(1.0, 8)
    for name, steps, run in gpu_parallel.samplers(_pair(gpu_parallel), [policy], (4,), "emulate")[:2]:
        run(2, steps)
    assert seen == {None: (2, 4, 5, 4, "mask", 0, "cpu", "eps", True, "emulate"),
                    policy: (2, 4, 5, gpu_parallel.ddpd_steps(4, policy), "mask", 0, "cpu", "eps", True, "emulate")}
