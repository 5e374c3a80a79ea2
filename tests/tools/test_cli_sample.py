"""ddpd-sample end to end with tiny randomly initialised models saved as checkpoints."""
import json
import os
import subprocess
import sys

import pytest
import torch

from ddpd.checkpoint import save_bundle, save_checkpoint, settings_digest
from ddpd.cli.sample import ONE_LINE, main
from ddpd.cli.samplers import Settings
from ddpd.models import build_model, config_for
from hang_guard import HANG_GUARD_SECONDS, default_signals, torchrun_worker
from oracles.fixtures import single_thread  # noqa: F401  (autouse)

V, D = 27, 8  # text8 alphabet, short sequences
TINY = dict(d_model=16, n_layers=1, n_heads=2)


def _model(kind: str, seed: int):
    torch.manual_seed(seed)
    config = config_for(kind, V, D, **TINY)
    model = build_model(kind, config)
    return model, {"kind": kind, "model": config.to_dict(), "tokenizer": {"name": "text8"}, "schedule": "linear"}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    paths = {}
    for i, kind in enumerate(("planner", "mask-denoiser", "uniform-denoiser", "uniform")):
        paths[kind] = str(root / kind)
        save_checkpoint(paths[kind], *_model(kind, i))
    planner, planner_config = _model("planner", 0)
    denoiser, denoiser_config = _model("mask-denoiser", 1)
    paths["bundle"] = str(root / "bundle")
    save_bundle(paths["bundle"], planner, planner_config, denoiser, denoiser_config)
    return paths


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_bundle_ddpd_writes_jsonl(ckpts, tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    code, stdout, stderr = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "12", "--num-samples", "5",
                                   "--batch-size", "2", "--seed", "3", "--out", str(out), "--option", "A+B+C")
    assert code == 0, stderr
    records = read_jsonl(out)
    assert [r["index"] for r in records] == list(range(5))
    for r in records:
        assert len(r["tokens"]) == D and all(0 <= t < V for t in r["tokens"])
        assert r["text"] == "".join(" abcdefghijklmnopqrstuvwxyz"[t] for t in r["tokens"])
        assert r["steps"] == 12 and r["stop_step"] == 12  # option B runs the whole budget
    assert stdout.splitlines() == [r["text"] for r in records]
    assert "samples/s" in stderr and "planner 36 " in stderr  # 3 batches x 12 steps


def test_the_step_budget_defaults_to_the_length_with_models_given_by_name(ckpts, tmp_path, capsys):
    """Twice the length is the bundled default pair's budget only."""
    out = tmp_path / "s.jsonl"
    code, _, stderr = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "2", "--length", "5",
                              "--out", str(out), "--quiet")
    assert code == 0, stderr
    assert [r["steps"] for r in read_jsonl(out)] == [5, 5]


def test_quiet_prints_no_sample_and_still_writes_out(ckpts, tmp_path, capsys):
    """--quiet leaves stdout empty; --out and the summary on stderr are as without it."""
    out = tmp_path / "s.jsonl"
    code, stdout, stderr = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "4", "--num-samples", "3",
                                   "--out", str(out), "--quiet")
    assert code == 0 and stdout == "", stderr
    assert len(read_jsonl(out)) == 3 and "3 samples of 8 tokens" in stderr


@pytest.mark.parametrize("stop", [["--stop", "budget"], ["--eps", "0.55"]])
def test_samples_do_not_depend_on_batch_size(ckpts, tmp_path, capsys, stop):
    """The whole record: its "steps" used to be its batch's last stop step."""
    outs = []
    for batch in ("1", "4"):
        out = tmp_path / f"b{batch}.jsonl"
        code, _, err = run_cli(capsys, "--planner", ckpts["planner"], "--denoiser", ckpts["uniform-denoiser"],
                               "--num-samples", "4", "--batch-size", batch, "--steps", "6", "--out", str(out),
                               "--quiet", *stop)
        assert code == 0, err
        outs.append(read_jsonl(out))
    assert outs[0] == outs[1]
    assert all(r["steps"] == 6 for r in outs[0])
    if stop[0] == "--eps":  # rows that stop at different steps, so that the batch's last stop step is not theirs
        assert len({r["stop_step"] for r in outs[0]}) > 1, outs[0]


@pytest.mark.parametrize("argv", [
    ["--sampler", "ddpd", "--clock", "exact", "--steps", "40"],
    ["--sampler", "ddpd", "--k", "3", "--parallel-steps", "2", "--temperature", "0.8", "--temperature-end", "0.2"],
    ["--sampler", "tau-leaping", "--steps", "5"],
])
def test_planner_and_denoiser_samplers(ckpts, capsys, argv):
    code, stdout, stderr = run_cli(capsys, "--planner", ckpts["planner"], "--denoiser", ckpts["mask-denoiser"],
                                   "--num-samples", "3", *argv)
    assert code == 0, stderr
    assert len(stdout.splitlines()) == 3 and all(len(line) == D for line in stdout.splitlines())


@pytest.mark.parametrize("kind,argv", [
    ("mask-denoiser", ["--sampler", "tau-leaping", "--eta", "2", "--steps", "10"]),
    ("mask-denoiser", ["--sampler", "maskgit", "--steps", "4", "--choice-temperature", "1"]),
    ("uniform", ["--sampler", "tau-leaping", "--steps", "6"]),
    ("uniform", ["--sampler", "ddpd", "--option", "A", "--eps", "0.5", "--steps", "6"]),
])
def test_single_model_samplers(ckpts, tmp_path, capsys, kind, argv):
    out = tmp_path / "s.jsonl"
    code, _, stderr = run_cli(capsys, "--checkpoint", ckpts[kind], "--num-samples", "3", "--out", str(out), "--quiet",
                              "--length", "5", *argv)
    assert code == 0, stderr
    assert all(len(r["tokens"]) == 5 for r in read_jsonl(out))


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "steps"),
    (["--num-samples", "0"], "--num-samples"),
    (["--option", "AZ"], "--option"),
    # --k acts in the parallel stage only: without --parallel-steps it would be ignored
    (["--k", "2"], "--k 2 acts in the parallel stage only: give --parallel-steps N too"),
    (["--eps", "2"], "eps"),
    (["--length", "99"], "--length"),
    (["--device", "tpu"], "--device"),
    (["--sampler", "maskgit", "--policy", "error-budget"], "is a policy of --sampler ddpd, not of --sampler maskgit"),
    (["--clock", "exact", "--stop", "eps"], "--stop eps is not available with --clock exact"),
    (["--policy", "error-budget", "--clock", "exact"], "--policy needs --clock planner"),
    (["--policy", "error-budget", "--k", "2", "--parallel-steps", "2"], "--policy needs --parallel-steps 0"),
    (["--sync-every", "4"], "--sync-every is a setting of the fused run: give --fused too"),
    # the guided logits are float32: a scale past its largest finite value is refused, not made inf
    (["--guidance-scale", "4e38"], "--guidance-scale must be at most 3.40282e+38, got 4e+38"),
    # the sampling layer's refusals name the flag
    (["--k", "99", "--parallel-steps", "1"], "--k must be in [1, 8], got 99"),
    (["--clock", "exact", "--t-end", "2"], "--t-end must be in (0.0, 1.0), got 2.0"),
    (["--fused", "--sync-every", "0"], "--sync-every must be >= 1, got 0"),
    (["--compile", "fast"], "--compile must be one of inductor, aot_eager, eager, got 'fast'"),
    (["--compile", "tvm"], "--compile must be one of inductor, aot_eager, eager, got 'tvm'"),  # needs apache-tvm
    (["--compile", ""], "--compile must be one of inductor, aot_eager, eager, got ''"),  # not the default backend
])
def test_bad_arguments_fail_in_one_line(ckpts, capsys, argv, message):
    code, _, stderr = run_cli(capsys, "--checkpoint", ckpts["bundle"], *argv)
    assert code == 2
    assert len(stderr.strip().splitlines()) == 1 and message in stderr and "Traceback" not in stderr


def test_a_refusal_of_the_sampler_call_names_its_flag(ckpts, tmp_path, capsys):
    """The sampling layer checks the step bound (noise offsets stay distinct) when the sampler
    runs, past the checks of the command line: its refusal names --steps too, and nothing is
    written."""
    out = tmp_path / "s.jsonl"
    code, stdout, stderr = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", str(2**61 + 1),
                                   "--out", str(out))
    assert (code, stdout) == (2, "") and not out.exists()
    assert stderr == f"ddpd-sample: error: --steps must be in [1, {2**61}], got {2**61 + 1}\n"


def test_missing_and_corrupt_checkpoints(ckpts, tmp_path, capsys, monkeypatch):
    code, _, stderr = run_cli(capsys, "--checkpoint", str(tmp_path / "nowhere"))
    assert code == 1 and "not found" in stderr and len(stderr.strip().splitlines()) == 1
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    code, _, stderr = run_cli(capsys, "--checkpoint", str(broken))
    assert code == 1 and "config.json" in stderr and len(stderr.strip().splitlines()) == 1
    code, _, stderr = run_cli(capsys, "--checkpoint", ckpts["planner"])
    assert code == 2 and "planner only" in stderr
    # No model argument and no bundled default (whether or not the package ships one).
    monkeypatch.setenv("DDPD_PRETRAINED_DIR", str(tmp_path / "no-bundle"))
    code, _, stderr = run_cli(capsys)
    assert code == 2 and "--checkpoint" in stderr


@pytest.mark.parametrize("kept", ["planner", "denoiser"])
def test_a_bundle_missing_one_network_is_named_as_a_bundle(ckpts, tmp_path, capsys, kept):
    """A directory with planner/ or denoiser/ alone is a bundle with a part missing, not a
    single checkpoint without a config.json."""
    import shutil

    shutil.copytree(os.path.join(ckpts["bundle"], kept), tmp_path / "half" / kept)
    code, _, err = run_cli(capsys, "--checkpoint", str(tmp_path / "half"), "--sampler", "maskgit")
    missing = {"planner": "denoiser", "denoiser": "planner"}[kept]
    assert (code, err) == (1, f"ddpd-sample: error: bundle {tmp_path / 'half'}: missing the {missing}/ checkpoint\n")


def test_truncated_weights_fail_cleanly(ckpts, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(ckpts["mask-denoiser"], copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, _, stderr = run_cli(capsys, "--checkpoint", str(copy), "--sampler", "maskgit")
    assert code == 1 and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


@pytest.mark.integration
def test_argparse_errors_are_one_line():
    proc = subprocess.run([sys.executable, "-m", "ddpd.cli.sample", "--sampler", "gibbs"], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--sampler" in proc.stderr


@pytest.mark.parametrize("fused", [[], ["--fused"]])
def test_progress_bar_ticks_once_per_denoiser_pass(ckpts, monkeypatch, capsys, fused):
    import tqdm.auto

    bars = []

    class Recorder(tqdm.auto.tqdm):
        """Counts the ticks (update calls) and where the bar ended."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": False})
            self.ticks, self.disabled_by_cli = 0, kwargs.get("disable") is True
            bars.append(self)

        def update(self, n=1):
            self.ticks += 1
            return super().update(n)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    argv = ["--checkpoint", ckpts["bundle"], "--steps", "12", "--num-samples", "4", "--batch-size", "2", "--quiet"]
    assert main(argv + ["--option", "A+B", *fused]) == 0  # option B: every batch runs its 12 steps
    bar = bars.pop()
    assert (bar.total, bar.n, bar.ticks) == (24, 24, 24 + 2)  # 24 denoiser passes, then one advance per batch
    assert not bar.disabled_by_cli
    assert main(argv + ["--option", "A", "--eps", "0.9", *fused]) == 0  # option A may stop before the budget
    bar = bars.pop()
    assert bar.n == 24 and bar.ticks <= 24 + 2
    assert main(argv + ["--no-progress", *fused]) == 0
    assert bars.pop().disabled_by_cli
    # one uniform model on the planner clock: two passes a step (the bar ended at 200%)
    assert main(["--denoiser", ckpts["uniform"], *argv[2:], "--option", "A+B", *fused]) == 0
    bar = bars.pop()
    assert (bar.total, bar.n, bar.ticks) == (48, 48, 48 + 2)
    assert main(["--denoiser", ckpts["uniform"], *argv[2:], "--option", "A+B", "--one-pass", *fused]) == 0
    bar = bars.pop()
    assert (bar.total, bar.n, bar.ticks) == (24, 24, 24 + 2)
    capsys.readouterr()


# ---------------------------------------------------------------- output, signals and faults


import errno  # noqa: E402
import io  # noqa: E402
import queue  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import tracemalloc  # noqa: E402

from ddpd import files  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_out_is_streamed_batch_by_batch(ckpts, tmp_path, capsys, monkeypatch):
    out = tmp_path / "s.jsonl"
    on_disk = []
    write = files.StreamedFile.write

    def recording(self, text):
        write(self, text)
        on_disk.append(len(open(self.temp).read().splitlines()))  # flushed, readable by anyone

    monkeypatch.setattr(files.StreamedFile, "write", recording)
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "5", "--batch-size", "2",
                           "--steps", "3", "--out", str(out), "--quiet")
    assert code == 0, err
    assert on_disk == [2, 4, 5] and [r["index"] for r in read_jsonl(out)] == list(range(5))
    assert sorted(os.listdir(tmp_path)) == ["s.jsonl"]


def test_memory_does_not_grow_with_the_number_of_samples(ckpts, tmp_path, capsys):
    """The records of finished batches are written and dropped: 20x more samples may
    not raise the Python heap's peak by more than a few batches' worth (keeping them
    all would add about 1 MB here)."""
    peaks = []
    for n in ("40", "800"):
        tracemalloc.start()
        code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", n, "--batch-size", "20",
                               "--steps", "1", "--out", str(tmp_path / f"{n}.jsonl"), "--quiet", "--option", "A+B")
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert code == 0, err
    assert len(read_jsonl(tmp_path / "800.jsonl")) == 800
    assert peaks[1] - peaks[0] < 200_000, peaks


def _sample_process(ckpts, out, *extra, stdout=subprocess.PIPE):
    command = [sys.executable, "-m", "ddpd.cli.sample", "--checkpoint", ckpts["bundle"], "--steps", "8",
               "--batch-size", "5", "--out", str(out), *extra]
    return subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=default_signals)


@pytest.mark.integration
def test_a_closed_stdout_does_not_stop_the_file(ckpts, tmp_path):
    """`ddpd-sample --out s.jsonl | head -1`: the reader goes away after one line."""
    out = tmp_path / "s.jsonl"
    proc = _sample_process(ckpts, out, "--num-samples", "60")
    assert len(proc.stdout.readline().strip()) == D
    proc.stdout.close()  # what head does after its line
    err = proc.stderr.read()
    proc.wait(timeout=HANG_GUARD_SECONDS)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Broken pipe" not in err, err
    assert [r["index"] for r in read_jsonl(out)] == list(range(60))


@pytest.mark.integration
def test_a_full_stdout_keeps_the_file_and_says_so(ckpts, tmp_path):
    """`>/dev/full`: the failure unwound through the run and discarded every finished sample."""
    out = tmp_path / "s.jsonl"
    with open("/dev/full", "w") as full:
        proc = _sample_process(ckpts, out, "--num-samples", "20", stdout=full)
        err = proc.communicate(timeout=HANG_GUARD_SECONDS)[1]
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert err.endswith(f"ddpd-sample: error: cannot write stdout: No space left on device; the 20 samples are in "
                        f"{out}\n"), err
    assert [r["index"] for r in read_jsonl(out)] == list(range(20))


@pytest.mark.integration
def test_a_failing_stderr_loses_no_sample(ckpts, tmp_path):
    """`2>/dev/full` (or `2>&1 | true`) with a warning to print (too few steps): the
    warning's failure unwound through the run and discarded every sample."""
    out = tmp_path / "s.jsonl"
    command = [sys.executable, "-m", "ddpd.cli.sample", "--checkpoint", ckpts["bundle"], "--steps", "2",
               "--num-samples", "3", "--out", str(out)]
    with open("/dev/full", "w") as full:
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=full, env=ENV, timeout=HANG_GUARD_SECONDS)
    assert done.returncode == 0 and [r["index"] for r in read_jsonl(out)] == [0, 1, 2]


def test_the_tolerant_stderr_copies():
    """copy.copy of the wrapped stderr recursed forever in its __getattr__, and on Python 3.9
    failed in the stream's __getstate__."""
    import copy

    from ddpd.streams import _Tolerant

    wrapped = _Tolerant(io.StringIO())
    copy.copy(wrapped).write("x")
    assert wrapped.getvalue() == "x"
    # Python 3.9's copy.copy looks __getstate__ up on the instance: the stream's is not this object's
    with pytest.raises(AttributeError, match="__getstate__"):
        wrapped.__getattr__("__getstate__")


@pytest.mark.integration
@pytest.mark.parametrize("closed", [1, 2])
def test_a_closed_stream_at_the_start_is_no_failure(ckpts, tmp_path, closed):
    """`2>&-` (or `1>&-`): sys.stderr was None, the progress bar failed on it, exit 1 and no
    file; and the file opened next took descriptor 2."""
    out = tmp_path / "s.jsonl"
    command = [sys.executable, "-m", "ddpd.cli.sample", "--checkpoint", ckpts["bundle"], "--steps", "8",
               "--batch-size", "5", "--out", str(out), "--num-samples", "10"]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=ENV,
                          timeout=HANG_GUARD_SECONDS, preexec_fn=lambda: os.close(closed))
    assert done.returncode == 0
    assert [r["index"] for r in read_jsonl(out)] == list(range(10))
    if closed == 2:
        assert [len(line) for line in done.stdout.splitlines()] == [D] * 10  # only the samples


@pytest.mark.integration
def test_the_summary_counts_the_samples_drawn_when_the_reader_went_away(ckpts):
    """`ddpd-sample | head -1` without --out stops after the batch it could not print: the
    summary used to report every --num-samples, at a rate 30 times the real one. (The reader
    is gone before the start here, so the first batch is the only one, whatever the timing.)"""
    read, write = os.pipe()
    os.close(read)
    command = [sys.executable, "-m", "ddpd.cli.sample", "--checkpoint", ckpts["bundle"], "--steps", "4",
               "--num-samples", "60", "--batch-size", "2", "--no-progress"]
    try:
        done = subprocess.run(command, stdout=write, stderr=subprocess.PIPE, text=True, timeout=HANG_GUARD_SECONDS,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    summary = [line for line in done.stderr.splitlines() if "samples/s" in line]
    assert len(summary) == 1 and summary[0].startswith("ddpd-sample: 2 samples of 8 tokens"), done.stderr
    assert "denoiser 4 (8 row-evaluations" in summary[0], done.stderr


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signals_keep_the_finished_samples(ckpts, tmp_path, sig):
    out = tmp_path / "s.jsonl"
    proc = _sample_process(ckpts, out, "--num-samples", "1000000")
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    lines.get(timeout=HANG_GUARD_SECONDS)  # a first batch is done
    proc.send_signal(sig)
    proc.wait(timeout=HANG_GUARD_SECONDS)
    err = proc.stderr.read()
    assert proc.returncode == 128 + sig, err
    assert len(err.strip().splitlines()) == 1, err
    name = signal.Signals(sig).name
    partial = tmp_path / "s.partial.jsonl"  # never --out itself: a partial file must not pass for a complete one
    assert f"ddpd-sample: interrupted by {name}; wrote the " in err and str(partial) in err, err
    kept = int(err.split("wrote the ")[1].split()[0])
    records = read_jsonl(partial)
    assert len(records) == kept >= 5 and kept % 5 == 0
    assert [r["index"] for r in records] == list(range(kept))
    assert os.listdir(tmp_path) == ["s.partial.jsonl"]  # no temporary left


# ddpd-sample's process, signalled during its third batch and again as Python exits
_SIGNALLED_TWICE = """import atexit, os, signal, sys
sys.argv[0] = "ddpd-sample"
from ddpd.cli import sample
batch, batches = sample._batch, []
def signalled(*args):
    batches.append(batch(*args))
    if len(batches) == 3:
        os.kill(os.getpid(), signal.SIGINT)
    return batches[-1]
sample._batch = signalled
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), sum(range(100))))  # the Python after it sees it
sys.exit(sample.main(sys.argv[1:]))
"""


@pytest.mark.integration
def test_a_second_signal_as_the_tool_exits_is_no_traceback(ckpts, tmp_path):
    """Two Ctrl-C a few milliseconds apart: the second reached Python's own handler again,
    the interpreter's exit raised KeyboardInterrupt (a traceback, or exit status -2)."""
    out = tmp_path / "s.jsonl"
    proc = subprocess.run([sys.executable, "-c", _SIGNALLED_TWICE, "--checkpoint", ckpts["bundle"], "--steps", "8",
                           "--batch-size", "2", "--num-samples", "100", "--no-progress", "--quiet", "--out", str(out)],
                          capture_output=True, text=True, env=ENV, preexec_fn=default_signals,
                          timeout=HANG_GUARD_SECONDS)
    partial = tmp_path / "s.partial.jsonl"
    assert proc.stderr == f"ddpd-sample: interrupted by SIGINT; wrote the 4 finished sample(s) to {partial}\n"
    assert proc.returncode == 128 + signal.SIGINT


def test_a_signal_after_a_batch_reached_the_file_counts_it(ckpts, tmp_path, capsys, monkeypatch):
    """A signal just after a batch was written to --out and before it was counted: the tool
    said no sample was finished and discarded the file's samples."""
    out = tmp_path / "s.jsonl"
    write = files.StreamedFile.write

    def write_then_signal(self, text):
        write(self, text)
        assert callable(signal.getsignal(signal.SIGTERM)), "the tool's handler is not in place"
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before kill returns

    monkeypatch.setattr(files.StreamedFile, "write", write_then_signal)
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "8", "--batch-size", "5",
                           "--num-samples", "10", "--out", str(out), "--no-progress")
    assert code == 128 + signal.SIGTERM, err
    partial = tmp_path / "s.partial.jsonl"
    assert err == f"ddpd-sample: interrupted by SIGTERM; wrote the 5 finished sample(s) to {partial}\n"
    assert [r["index"] for r in read_jsonl(partial)] == list(range(5)) and not out.exists()


def test_an_interrupted_run_never_replaces_a_complete_out(ckpts, tmp_path, capsys, monkeypatch):
    """An interrupt published the finished samples to --out, over a complete earlier file: a
    partial file that looked complete. They go beside it, named partial."""
    out = tmp_path / "s.jsonl"
    common = ["--checkpoint", ckpts["bundle"], "--steps", "8", "--batch-size", "5", "--num-samples", "10",
              "--out", str(out), "--no-progress", "--quiet"]
    code, _, err = run_cli(capsys, *common)
    assert code == 0, err
    before = out.read_bytes()
    write = files.StreamedFile.write

    def write_then_signal(self, text):
        write(self, text)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before kill returns

    monkeypatch.setattr(files.StreamedFile, "write", write_then_signal)
    code, _, err = run_cli(capsys, *common, "--seed", "1")
    partial = tmp_path / "s.partial.jsonl"
    assert code == 128 + signal.SIGTERM, err
    assert err == f"ddpd-sample: interrupted by SIGTERM; wrote the 5 finished sample(s) to {partial}\n"
    assert out.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["s.jsonl", "s.partial.jsonl"]
    assert [r["index"] for r in read_jsonl(partial)] == list(range(5))


def test_a_second_signal_while_the_partial_result_is_published_is_ignored(ckpts, tmp_path, capsys, monkeypatch):
    """Pins that once a signal stops the run, a further one (torchrun's SIGTERM after another
    process died) is ignored: it would replace the first's line, which says where the finished
    samples went, by a bare `interrupted by SIGTERM`."""
    out = tmp_path / "s.jsonl"
    write, publish_partial = files.StreamedFile.write, files.StreamedFile.publish_partial

    def write_then_signal(self, text):
        write(self, text)
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs before kill returns

    def signalled_publish_partial(self):
        os.kill(os.getpid(), signal.SIGTERM)
        return publish_partial(self)

    monkeypatch.setattr(files.StreamedFile, "write", write_then_signal)
    monkeypatch.setattr(files.StreamedFile, "publish_partial", signalled_publish_partial)
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "8", "--batch-size", "5",
                           "--num-samples", "10", "--out", str(out), "--no-progress")
    partial = tmp_path / "s.partial.jsonl"
    assert (code, err) == (128 + signal.SIGINT,
                           f"ddpd-sample: interrupted by SIGINT; wrote the 5 finished sample(s) to {partial}\n")
    assert [r["index"] for r in read_jsonl(partial)] == list(range(5)) and not out.exists()


def test_a_signal_a_library_swallowed_still_stops_the_run(ckpts, tmp_path, capsys, monkeypatch):
    """With --compile a signal during torch.compile's guards (Python run from C++, whose
    exceptions torch turns into a failed guard) was lost: the run went on to the end and
    exited 0. It stops at the next batch, the finished ones kept."""
    from ddpd.cli import sample

    batch, calls = sample._batch, []

    def batch_swallowing_a_signal(*args):
        calls.append(1)
        if len(calls) == 1:
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before kill returns
            except KeyboardInterrupt:
                pass  # as torch's guards do
        return batch(*args)

    monkeypatch.setattr(sample, "_batch", batch_swallowing_a_signal)
    out = tmp_path / "s.jsonl"
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "8", "--batch-size", "2",
                           "--num-samples", "6", "--out", str(out), "--no-progress", "--quiet")
    partial = tmp_path / "s.partial.jsonl"
    assert code == 128 + signal.SIGTERM, err
    assert err == f"ddpd-sample: interrupted by SIGTERM; wrote the 2 finished sample(s) to {partial}\n"
    assert len(calls) == 1 and [r["index"] for r in read_jsonl(partial)] == [0, 1] and not out.exists()


def test_a_finished_run_removes_the_partial_file_of_an_earlier_stopped_one(ckpts, tmp_path, capsys, monkeypatch):
    """A complete --out was published beside the partial file of a run stopped earlier, which
    then stayed, stale (ddpd-eval removes its own). A stopped run that finished nothing keeps it."""
    out, partial = tmp_path / "s.jsonl", tmp_path / "s.partial.jsonl"
    partial.write_text('{"index": 0}\n')
    common = ["--checkpoint", ckpts["bundle"], "--steps", "4", "--batch-size", "2", "--num-samples", "2",
              "--out", str(out), "--no-progress", "--quiet"]
    with monkeypatch.context() as patch:
        patch.setattr("ddpd.cli.sample._batch", lambda *args: os.kill(os.getpid(), signal.SIGTERM))
        code, _, err = run_cli(capsys, *common)
    assert code == 128 + signal.SIGTERM and f"no sample was finished, {out} not written" in err, err
    assert sorted(os.listdir(tmp_path)) == ["s.partial.jsonl"]
    code, _, err = run_cli(capsys, *common)
    assert code == 0, err
    assert sorted(os.listdir(tmp_path)) == ["s.jsonl"] and len(read_jsonl(out)) == 2


def test_a_signal_after_every_sample_was_written_says_where_they_are(ckpts, tmp_path, capsys, monkeypatch):
    """A signal during the summary, every sample published: the line said only "interrupted"."""
    from ddpd.cli import sample

    summary = sample._summary

    def signalled_summary(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        summary(*args)

    monkeypatch.setattr(sample, "_summary", signalled_summary)
    out = tmp_path / "s.jsonl"
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "8", "--batch-size", "5",
                           "--num-samples", "10", "--out", str(out), "--no-progress")
    assert code == 128 + signal.SIGTERM
    assert err == f"ddpd-sample: interrupted by SIGTERM; wrote the 10 finished sample(s) to {out}\n"
    assert [r["index"] for r in read_jsonl(out)] == list(range(10))


def test_out_is_checked_before_any_work(ckpts, tmp_path, capsys, monkeypatch):
    def never(*args):
        raise AssertionError("models loaded before --out was checked")

    monkeypatch.setattr("ddpd.cli.sample.load_models", never)
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--out", str(tmp_path / "no" / "s.jsonl"))
    assert code == 1 and err.count("\n") == 1 and f"cannot write {tmp_path / 'no' / 's.jsonl'}" in err
    assert "does not exist" in err
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--out", str(tmp_path))
    assert code == 1 and err.count("\n") == 1 and "it is a directory" in err
    assert os.listdir(tmp_path) == []  # no stray temporary

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files.tempfile, "mkstemp", denied)
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--out", str(tmp_path / "s.jsonl"))
    assert err == f"ddpd-sample: error: cannot write {tmp_path / 's.jsonl'}: Permission denied\n" and code == 1


def test_a_second_writer_of_the_same_out_is_refused(ckpts, tmp_path, capsys):
    """Two runs writing one --out: the later rename replaced the earlier run's samples."""
    out = tmp_path / "s.jsonl"
    out.write_text('{"index": 0}\n')
    with files.OutputLock(out):  # another ddpd-sample writing it (flock: per open file)
        code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--out", str(out), "--quiet")
    assert code == 1 and err.count("\n") == 1 and f"{out} is being written by pid {os.getpid()}" in err
    assert out.read_text() == '{"index": 0}\n' and os.listdir(tmp_path) == ["s.jsonl"]
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--out", str(out), "--quiet",
                           "--num-samples", "2", "--steps", "4")
    assert code == 0 and len(out.read_text().splitlines()) == 2
    assert os.listdir(tmp_path) == ["s.jsonl"]  # the lock is gone with its run


@pytest.mark.parametrize("fd, stream", [(1, "stdout"), (2, "stderr")])
def test_an_out_that_is_the_file_of_stdout_or_stderr_is_refused(ckpts, tmp_path, capsys, fd, stream):
    """`--out /dev/stdout > r.txt`: the published file was renamed over r.txt, so the lines
    printed to stdout (stderr: the summary) went to the replaced file and were lost."""
    redirected = tmp_path / "r.txt"
    saved = os.dup(fd)
    try:
        with open(redirected, "w") as f:
            os.dup2(f.fileno(), fd)
        code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--out", f"/proc/self/fd/{fd}")
    finally:
        os.dup2(saved, fd)
        os.close(saved)
    assert code == 2 and err == (f"ddpd-sample: error: --out /proc/self/fd/{fd} is the file {stream} goes to; "
                                 "write it elsewhere\n")
    assert os.listdir(tmp_path) == ["r.txt"]


def test_a_full_disk_keeps_the_previous_output(ckpts, tmp_path, capsys, monkeypatch):
    out = tmp_path / "s.jsonl"
    out.write_text('{"index": 0}\n')

    def full(self, text):
        raise files.OutputError(self.path, OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(files.StreamedFile, "write", full)
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--out", str(out), "--quiet")
    assert code == 1 and err == f"ddpd-sample: error: cannot write {out}: No space left on device\n"
    assert out.read_text() == '{"index": 0}\n' and os.listdir(tmp_path) == ["s.jsonl"]


def test_too_few_steps_are_warned_about(ckpts, capsys):
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "3", "--num-samples", "1")
    assert code == 0 and "warning: --steps 3 can denoise at most 3 of the 8 positions to generate (one per " \
                         "step): " in err, err  # no --parallel-steps given: none is named
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "3", "--num-samples", "1",
                           "--policy", "error-budget:bound=8,max_k=8")  # commits several a step
    assert code == 0 and "warning" not in err
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "3", "--k", "3",
                           "--parallel-steps", "3", "--num-samples", "1")
    assert code == 0 and "warning" not in err
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "3", "--sampler", "tau-leaping",
                           "--num-samples", "1")
    assert code == 0 and "warning" not in err
    # the exact clock makes at most one jump per step (it was not warned about)
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "5", "--clock", "exact",
                           "--num-samples", "1")
    assert code == 0 and "warning: --steps 5 can denoise at most 5 of the 8 positions to generate (at most one " \
                         "per step)" in err, err


def test_too_few_steps_are_warned_about_from_one_step_short(ckpts, capsys):
    """The warning's bound is exact: 7 one-at-a-time steps for 8 positions are warned about, 8 are not."""
    argv = ("--checkpoint", ckpts["bundle"], "--num-samples", "1", "--quiet")
    code, _, err = run_cli(capsys, *argv, "--steps", "7")
    assert code == 0 and "warning: --steps 7 can denoise at most 7 of the 8 positions" in err, err
    code, _, err = run_cli(capsys, *argv, "--steps", "8")
    assert code == 0 and "warning" not in err, err


def test_a_checkpoint_with_a_planner_or_denoiser_is_refused_in_one_line(ckpts, capsys):
    """Which models would run is ambiguous: neither is picked over the other."""
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--denoiser", ckpts["mask-denoiser"])
    assert code == 2 and err == "ddpd-sample: error: give either --checkpoint or --planner/--denoiser, not both\n", err


def test_a_planner_without_a_denoiser_is_refused_in_one_line(ckpts, capsys):
    code, _, err = run_cli(capsys, "--planner", ckpts["planner"])
    assert code == 2 and err == "ddpd-sample: error: --planner needs a --denoiser\n", err


def test_the_too_few_steps_warning_gives_the_steps_the_parallel_stage_needs(ckpts, capsys):
    """One parallel step of --k 4 and 4 single steps reach the 8 positions: --steps 5 is enough
    (the warning asked for 8)."""
    argv = ("--checkpoint", ckpts["bundle"], "--k", "4", "--parallel-steps", "1", "--num-samples", "1")
    code, _, err = run_cli(capsys, *argv, "--steps", "2")
    assert code == 0 and "warning: --steps 2 can denoise at most 5 of the 8 positions to generate (one per step " \
                         "after --parallel-steps)" in err, err
    assert "give --steps >= 5, or --k and --parallel-steps" in err, err
    code, _, err = run_cli(capsys, *argv, "--steps", "5")
    assert code == 0 and "warning" not in err


@pytest.mark.parametrize("spec", ["error-budget:bound=8,max_k=1", "error-budget:bound=0,max_k=8"])
def test_too_few_steps_are_warned_about_under_a_policy_of_one_commit_a_step(ckpts, capsys, spec):
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "3", "--num-samples", "1",
                           "--policy", spec)
    assert code == 0 and "warning: --steps 3 can denoise at most 3 of the 8 positions to generate (one per " \
                         f"step under --policy {spec})" in err, err
    assert "noise; give --steps >= 8\n" in err, err  # no larger max_k to advise


def test_too_few_steps_are_warned_about_under_a_policy_of_max_k_commits_a_step(ckpts, capsys):
    """A step commits at most max_k positions: 3 steps of max_k 2 reach 6 of the 8."""
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "3", "--num-samples", "1",
                           "--policy", "error-budget:bound=8,max_k=2")
    assert code == 0 and "warning: --steps 3 can denoise at most 6 of the 8 positions to generate (at most 2 " \
                         "per step under --policy error-budget:bound=8,max_k=2): the samples will be partly " \
                         "noise; give --steps >= 4, or a larger max_k" in err, err
    # 8 positions at most 3 a step need 3 steps, not 8 // 3
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "2", "--num-samples", "1",
                           "--policy", "error-budget:bound=8,max_k=3")
    assert code == 0 and "can denoise at most 6 of the 8 positions" in err and "give --steps >= 3," in err, err


def test_the_docs_say_a_policy_of_several_commits_a_step_is_warned_about_too():
    """docs/cli.md said a policy that can commit several a step is never warned about; it is,
    where --steps times its max_k is below the positions to generate (the test above)."""
    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cli.md")
    with open(docs) as f:
        text = " ".join(f.read().split())
    assert "not under one that can commit several" not in text
    assert "which commits at most `max_k` positions a step, one under `error-budget` with `max_k=1` or with " \
           "`bound=0` and no `spread`: where `--steps` times that is below them" in text


def test_networks_of_different_lengths_are_warned_about(ckpts, tmp_path, capsys):
    torch.manual_seed(0)
    long = build_model("planner", config_for("planner", V, 2 * D, **TINY))
    save_checkpoint(str(tmp_path / "long"), long,
                    {"kind": "planner", "model": long.config.to_dict(), "tokenizer": {"name": "text8"}})
    argv = ["--planner", str(tmp_path / "long"), "--denoiser", ckpts["mask-denoiser"], "--num-samples", "1",
            "--out", str(tmp_path / "s.jsonl")]
    code, _, err = run_cli(capsys, *argv)
    assert code == 0 and err.count("warning") == 1
    assert (f"ddpd-sample: warning: --planner {tmp_path / 'long'} takes sequences of {2 * D} tokens, --denoiser "
            f"{ckpts['mask-denoiser']} of {D}: using {D} (--length sets it)\n") in err, err
    assert len(read_jsonl(tmp_path / "s.jsonl")[0]["tokens"]) == D
    code, _, err = run_cli(capsys, *argv, "--length", str(D))
    assert code == 0 and "warning" not in err


@pytest.mark.parametrize("argv", [["--temperature", "-0.5"], ["--temperature", "inf"], ["--temperature", "nan"],
                                  ["--temperature-end", "-1"], ["--threads", "0"], ["--threads", "100000"],
                                  ["--out", ""],
                                  ["--top-k", "0"],
                                  ["--top-p", "0"], ["--top-p", "1.5"], ["--top-p", "nan"], ["--min-p", "-0.1"],
                                  ["--min-p", "2"]])
def test_temperatures_truncations_and_threads_must_be_sensible(ckpts, capsys, argv):
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], *argv)
    assert code == 2 and err.count("\n") == 1 and argv[0] in err, err


@pytest.mark.parametrize("sampler", [["--sampler", "ddpd"], ["--sampler", "tau-leaping"]])
def test_greedy_and_truncated_draws(ckpts, tmp_path, capsys, sampler):
    """--temperature 0 is the greedy run, which --top-k 1 draws too; --top-p changes the samples."""
    def tokens(*argv):
        out = tmp_path / "s.jsonl"
        code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "4", "--steps", "8",
                               "--quiet", "--out", str(out), *sampler, *argv)
        assert code == 0, err
        return [r["tokens"] for r in read_jsonl(out)]

    greedy = tokens("--temperature", "0")
    assert tokens("--top-k", "1") == greedy and tokens("--top-k", "1", "--fused") == greedy
    assert tokens("--top-p", "0.2", "--min-p", "0.1") != tokens()


def test_thread_policy(ckpts, capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "1", "--quiet")
    assert code == 0 and torch.get_num_threads() == 1 and "1 CPU thread, float32)" in err
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "1", "--quiet",
                           "--threads", "2")
    assert code == 0 and torch.get_num_threads() == 2 and "2 CPU threads, float32)" in err
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # honoured as it is: not overridden
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "1", "--quiet")
    assert code == 0 and torch.get_num_threads() == 2
    for unusable in ("abc", "0", "-1"):  # OpenMP reads these as every core: the opposite of the default
        monkeypatch.setenv("OMP_NUM_THREADS", unusable)
        code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "1", "--quiet")
        assert code == 2 and f"OMP_NUM_THREADS must be a positive int (or unset, or --threads given), got " \
                              f"'{unusable}'" in err, err
        code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "1", "--quiet",
                               "--threads", "1")
        assert code == 0, err
    torch.set_num_threads(1)


def test_building_the_extension_is_not_counted_as_sampling(ckpts, capsys, monkeypatch):
    from ddpd.ops import _ext

    clock = [0.0]
    load = _ext.load

    def slow_build():
        if clock[0] == 0.0:
            clock[0] += 1000.0  # the first call compiles
        return load()

    monkeypatch.setattr(_ext, "load", slow_build)
    monkeypatch.setattr("ddpd.cli.sample.time.perf_counter", lambda: clock[0])
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "2", "--fused", "--quiet")
    assert code == 0 and clock[0] == 1000.0 and " in 0.00 s " in err, err


def test_an_extension_that_cannot_be_built_is_one_line(ckpts, capsys, monkeypatch):
    from ddpd.ops import _ext

    def broken():
        raise RuntimeError("ddpd: the C++ extension is unavailable (ddpd._C was not built) and compiling it in "
                           "/x failed: Ninja is required to load C++ extensions\n" + "compiler output\n" * 70)

    monkeypatch.setattr(_ext, "load", broken)
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--fused")
    assert code == 1 and err.count("\n") == 1 and "Ninja is required" in err


def test_out_of_memory_is_one_line(ckpts, capsys, monkeypatch):
    def allocate(args, models, tokenizer, prompts):
        def sample(n, first):
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                               "memory: you tried to allocate 800000000000 bytes.")
        return sample, Settings(8, 27, 8)

    monkeypatch.setattr("ddpd.cli.sample.make_sampler", allocate)
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--batch-size", "100000000")
    assert code == 1 and err.count("\n") == 1 and "out of memory" in err and "--batch-size" in err


def test_non_finite_weights_are_refused(tmp_path, capsys):
    """A checkpoint whose weights were spoiled after its save (a save refuses them)."""
    import hashlib

    from safetensors.torch import load_file, save_file

    model, config = _model("mask-denoiser", 0)
    save_checkpoint(str(tmp_path / "m"), model, config)
    weights = tmp_path / "m" / "model.safetensors"
    tensors = load_file(weights)
    tensors["head.bias"].fill_(float("inf"))
    save_file(tensors, weights)
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    meta["sha256"]["model.safetensors"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    (tmp_path / "m" / "config.json").write_text(json.dumps(meta))
    code, _, err = run_cli(capsys, "--checkpoint", str(tmp_path / "m"), "--sampler", "maskgit")
    assert code == 1 and err.count("\n") == 1 and "NaN or infinite weights in head.bias" in err


@pytest.mark.integration
@pytest.mark.parametrize("processes", [1, 2])
def test_networks_that_return_nan_are_warned_about_once(ckpts, tmp_path, capsys, processes):
    """Finite weights that overflow float32 (embeddings of 3e37) give NaN logits: the samples
    are written, and one warning sums the passes of every batch and process."""
    model, config = _model("mask-denoiser", 0)
    with torch.no_grad():
        model.backbone.embed.weight.mul_(3e37)
    save_checkpoint(str(tmp_path / "m"), model, config)
    argv = ["--checkpoint", str(tmp_path / "m"), "--sampler", "maskgit", "--steps", "4", "--num-samples", "5",
            "--batch-size", "2", "--out", str(tmp_path / "s.jsonl")]
    if processes == 1:
        code, _, err = run_cli(capsys, *argv)
    else:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                               "-m", "ddpd.cli.sample", *argv], capture_output=True, text=True,
                              timeout=HANG_GUARD_SECONDS, env={**os.environ, "OMP_NUM_THREADS": "1"})
        code, err = done.returncode, done.stderr
    assert code == 0, err
    assert len(read_jsonl(tmp_path / "s.jsonl")) == 5
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert warnings == ["ddpd-sample: warning: the denoiser returned NaN or +inf in 12 of 12 passes: NaN is read as "
                        "-inf (a planner position as clean, a token as never drawn, token 0 where nothing else is "
                        "left), so these samples are not the model's; run the networks in float32 (dtype / --dtype) "
                        "or check their weights"], err


CLOSED_GROUP_WORKER = """
import weakref
import torch.distributed as dist
from ddpd.training.distributed import Distributed
group = Distributed("cpu")
import torch.distributed.nn.functional  # as torch._dynamo does, which building a network loads
world = weakref.ref(dist.group.WORLD)
group.all_gather(group.rank)
group.close()
assert world() is None, "the process group outlived close()"
"""


@pytest.mark.integration
def test_a_closed_group_leaves_no_gloo_thread_to_the_interpreter_exit(tmp_path):
    """torch.distributed.nn.functional keeps group.WORLD as default arguments: first imported
    after the group was made, it kept the group, and gloo's threads, alive past close(), until
    the interpreter's finalization, where a worker taking the GIL aborted the process ("terminate
    called without an active exception", 1 torchrun of the test above in ~30)."""
    script = tmp_path / "worker.py"
    script.write_text(CLOSED_GROUP_WORKER)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                           str(script)], capture_output=True, text=True, timeout=HANG_GUARD_SECONDS,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr


def test_models_that_do_not_belong_together_are_named(ckpts, tmp_path, capsys):
    model, config = _model("uniform-denoiser", 2)
    save_checkpoint(str(tmp_path / "cosine"), model, {**config, "schedule": "cosine"})
    code, _, err = run_cli(capsys, "--planner", ckpts["planner"], "--denoiser", str(tmp_path / "cosine"))
    assert code == 2 and err.count("\n") == 1
    assert f"--denoiser {tmp_path / 'cosine'} has schedule 'cosine', but --planner {ckpts['planner']} has " \
           "'linear'" in err, err


# ---------------------------------------------------------------- one sampler table, --fused and --dtype

from ddpd.cli import samplers as table  # noqa: E402

# every row of the table with the checkpoints it needs, and the DDPD rows on the exact clock too
ROWS = [(row.name, ["--planner", "{planner}", "--denoiser", "{" + row.model + "}"] if row.planner else
         ["--checkpoint", "{" + row.model + "}"],
         ["--sampler", row.family, *(["--eta", "1"] if row.function == "tau_leaping_mask" else [])])
        for row in table.TABLE]
ROWS += [(name + " exact clock", models, argv + ["--clock", "exact"]) for name, models, argv in ROWS
         if argv[1] == "ddpd"]


@pytest.mark.parametrize("name,models,argv", ROWS, ids=[r[0] for r in ROWS])
def test_every_sampler_runs_fused_and_draws_what_the_reference_draws(ckpts, tmp_path, capsys, name, models, argv):
    """--fused means every sampler in both tools: the same samples as the reference path."""
    models = [m.format(**ckpts) for m in models]
    records = []
    for fused in ([], ["--fused", "--sync-every", "2"]):
        out = tmp_path / f"{len(fused)}.jsonl"
        code, _, err = run_cli(capsys, *models, *argv, "--steps", "10", "--num-samples", "5", "--batch-size", "3",
                               "--seed", "11", "--out", str(out), "--quiet", *fused)
        assert code == 0, err
        assert (", fused;" in err) == bool(fused)
        records.append(read_jsonl(out))
    assert [r["tokens"] for r in records[0]] == [r["tokens"] for r in records[1]]
    assert [r["stop_step"] for r in records[0]] == [r["stop_step"] for r in records[1]]


def test_a_bundle_gives_its_denoiser_to_a_sampler_without_planner(ckpts, capsys):
    """--sampler maskgit with a bundle runs on its denoiser; a planner named by --planner is not
    dropped silently."""
    code, stdout, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--sampler", "maskgit", "--steps", "4",
                                "--num-samples", "2", "--policy", "threshold:0.9")
    assert code == 0 and len(stdout.splitlines()) == 2, err
    code, _, err = run_cli(capsys, "--planner", ckpts["planner"], "--denoiser", ckpts["mask-denoiser"], "--sampler",
                           "maskgit")
    assert code == 2 and "--sampler maskgit needs one mask-denoiser" in err


@pytest.mark.parametrize("eta", ["2", "0.5"])
def test_eta_is_refused_where_tau_leaping_runs_with_a_planner(ckpts, capsys, eta):
    """A bundle's tau-leaping is P x D, which has no eta: --eta was ignored."""
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--sampler", "tau-leaping", "--eta", eta)
    assert code == 2 and err.count("\n") == 1
    assert "--eta is a setting of mask tau-leaping (one mask-denoiser); with planner 'planner' and denoiser " \
           "'mask-denoiser' --sampler tau-leaping runs tau-planned-mask, which has none" in err, err


def test_the_table_names_what_each_sampler_needs(ckpts, capsys):
    assert table.FAMILIES == ("ddpd", "tau-leaping", "maskgit")  # --sampler's choices, in the table's order
    assert table.needs("maskgit") == "one mask-denoiser"
    assert table.needs("ddpd") == ("a planner with a mask-denoiser, a planner with a uniform-denoiser or one uniform "
                                   "model")
    # any sampler (ddpd-eval's refusal): each need once, though two families share it
    assert table.needs() == ("a planner with a mask-denoiser, a planner with a uniform-denoiser, one uniform model "
                             "or one mask-denoiser")
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["uniform-denoiser"], "--sampler", "tau-leaping")
    assert code == 2 and err.count("\n") == 1
    assert "--sampler tau-leaping needs a planner with a mask-denoiser, a planner with a uniform-denoiser, one " \
           "mask-denoiser or one uniform model; got denoiser 'uniform-denoiser'" in err, err
    kinds = ("planner", "mask-denoiser", "uniform-denoiser", "uniform")
    assert list(table.variants(kinds, [0.0, 15.0])) == [
        "ddpd-A-mask", "ddpd-AB-mask", "ddpd-ABC-mask", "ddpd-A-uniform", "ddpd-AB-uniform", "ddpd-ABC-uniform",
        "ddpd-A-uniform-model", "ddpd-AB-uniform-model", "ddpd-ABC-uniform-model", "ddpd-A-uniform-model-one-pass",
        "ddpd-AB-uniform-model-one-pass", "ddpd-ABC-uniform-model-one-pass", "tau-planned-mask",
        "tau-planned-uniform", "dfm-eta0", "dfm-eta15", "dfm-uni", "maskgit"]
    assert list(table.variants(("mask-denoiser",), [2.5])) == ["dfm-eta2.5", "maskgit"]
    # two etas that :g would write alike (1e+06) keep a variant each
    assert list(table.variants(("mask-denoiser",), [1e6, 1000001.0])) == ["dfm-eta1e+06", "dfm-eta1000001.0",
                                                                          "maskgit"]
    assert list(table.variants(("planner",), [0.0])) == []
    # the module's documented table is the table
    documented = [[cell.strip().split(" (")[0] for cell in line.split("|")[1:5]]
                  for line in table.__doc__.splitlines() if line.startswith("| ")][1:]
    assert documented == [[row.family, row.name.replace("{option}", "{A,AB,ABC}"),
                           ("planner + " if row.planner else "") + row.model, row.function] for row in table.TABLE]


def test_truncation_labels_name_each_cut_exactly():
    """ddpd-eval's sampler names keep cuts apart that :g would write alike."""
    assert table.truncation_label(Truncation()) == ""
    assert table.truncation_label(Truncation(top_k=5, top_p=0.9)) == " top-k=5 top-p=0.9"
    assert table.truncation_label(Truncation(top_k=1000000)) == " top-k=1000000"
    assert table.truncation_label(Truncation(min_p=0.9000001)) == " min-p=0.9000001"


# every ddpd-eval name, with the sampler it calls and the keywords only that sampler takes, on
# settings of eps 0.25 and eta 0: a variant changes its own fields and keeps the run's others
VARIANT_CALLS = {
    "ddpd-A-mask": ("ddpd_sample", {"ddpd": ("eps", "sigmoid"), "denoiser_type": "mask"}),
    "ddpd-AB-mask": ("ddpd_sample", {"ddpd": ("budget", "sigmoid"), "denoiser_type": "mask"}),
    "ddpd-ABC-mask": ("ddpd_sample", {"ddpd": ("budget", "softmax"), "denoiser_type": "mask"}),
    "ddpd-AB-uniform": ("ddpd_sample", {"ddpd": ("budget", "sigmoid"), "denoiser_type": "uniform"}),
    "ddpd-ABC-uniform-model": ("ddpd_sample_uniform", {"ddpd": ("budget", "softmax")}),
    "ddpd-A-uniform-model-one-pass": ("ddpd_sample_uniform", {"ddpd": ("eps", "sigmoid", True)}),
    "ddpd-ABC-uniform-model-one-pass": ("ddpd_sample_uniform", {"ddpd": ("budget", "softmax", True)}),
    "tau-planned-mask": ("tau_leaping_planned", {"denoiser_type": "mask"}),
    "tau-planned-uniform": ("tau_leaping_planned", {"denoiser_type": "uniform"}),
    "dfm-eta2.5": ("tau_leaping_mask", {"eta": 2.5}),
    "dfm-uni": ("tau_leaping_uniform", {}),
}


@pytest.mark.parametrize("name", VARIANT_CALLS)
def test_each_eval_variant_calls_its_sampler_with_its_own_settings(monkeypatch, name):
    """A ddpd-eval name runs its row's sampler on its models with its option letters or eta, and
    the run's settings and the rows' prompts and labels (samples 3 and 4 of 2 prompts, 4 labels)."""
    from ddpd import sampling

    seen = []
    for function in SAMPLING_FUNCTIONS:
        monkeypatch.setattr(sampling, function, lambda *args, _f=function, **kwargs: seen.append((_f, args, kwargs)))
    models = {kind: kind for kind in ("planner", "mask-denoiser", "uniform-denoiser", "uniform")}
    x_init = torch.tensor([[0] * D, [1] * D])
    common = dict(steps=3, temperature=Temperature(0.5, 0.25), schedule="cosine", device=torch.device("cpu"),
                  noise="noise", execution=Execution(fused=True, dtype="float32"), truncation=Truncation(3))
    settings = Settings(D, V, 3, temperature=0.5, temperature_end=0.25, schedule="cosine", device=torch.device("cpu"),
                        execution=common["execution"], truncation=common["truncation"], ddpd=DDPDOptions(eps=0.25),
                        x_init=x_init, frozen=x_init == 0, labels=torch.tensor([5, 6, 7, 8]), guidance_scale=2.0,
                        conditional_planner=True)
    variant = table.variants(tuple(models), [2.5])[name]
    variant.call(models, settings, 2, "noise", 3)
    [(function, args, kwargs)] = seen
    expected_function, own = VARIANT_CALLS[name]
    assert function == expected_function
    assert args == ((("planner",) if variant.sampler.planner else ()) + (variant.sampler.model, 2, D, V))
    if "ddpd" in own:
        stop, selection, *one_pass = own["ddpd"]
        own = {**own, "ddpd": DDPDOptions(eps=0.25, stop=stop, selection=selection, one_pass=bool(one_pass))}
    assert {key: kwargs[key] for key in ("ddpd", "eta", "denoiser_type", "policy") if key in kwargs} == own
    assert {key: kwargs[key] for key in common} == common
    assert kwargs["prompt"].x_init.tolist() == [[1] * D, [0] * D]
    assert kwargs["prompt"].frozen.tolist() == [[False] * D, [True] * D]
    guidance = kwargs["guidance"]
    assert (guidance.labels.tolist(), guidance.scale) == ([8, 5], 2.0)
    assert guidance.conditional_planner == variant.sampler.planner  # a planner it does not run takes no labels


def test_eval_variants_on_the_settings_defaults_draw_at_temperature_one_with_maskgits_policy(monkeypatch):
    """ddpd-eval sets no --temperature-end, --choice-temperature or --policy: its maskgit is MaskGIT's
    own (choice temperature 4.5) at a constant temperature (1, or the sweep's), and a policy given
    replaces it."""
    from ddpd import sampling

    seen = []
    monkeypatch.setattr(sampling, "mask_sample", lambda *args, **kwargs: seen.append(kwargs))
    variant = table.variants(("mask-denoiser",), [0.0])["maskgit"]
    variant.call({"mask-denoiser": "mask-denoiser"}, Settings(D, V, 3), 2, "noise", 0)
    threshold = policies.ConfidenceThreshold(0.9)
    variant.call({"mask-denoiser": "mask-denoiser"},
                 Settings(D, V, 3, temperature=0.5, choice_temperature=2.0, policy=threshold), 2, "noise", 0)
    defaults, given = seen
    assert (defaults["temperature"], defaults["schedule"], defaults["truncation"]) == (Temperature(1.0, None),
                                                                                      "linear", Truncation())
    assert defaults["policy"] == policies.MaskGIT(4.5) and "prompt" not in defaults and "guidance" not in defaults
    assert given["policy"] is threshold and given["temperature"] == Temperature(0.5, 0.5)  # its sweep's, constant


def test_an_eval_variant_called_again_applies_its_option_to_each_calls_settings(monkeypatch):
    """ddpd-eval calls one variant at every step budget and temperature of its sweep: each call
    takes the option letters on that call's own settings, the first call changing nothing."""
    from ddpd import sampling

    seen = []
    monkeypatch.setattr(sampling, "ddpd_sample", lambda *args, **kwargs: seen.append(kwargs["ddpd"]))
    variant = table.variants(("planner", "mask-denoiser"), [])["ddpd-ABC-mask"]
    models = {"planner": "planner", "mask-denoiser": "mask-denoiser"}
    for eps in (0.25, 0.5):
        variant.call(models, Settings(D, V, 3, ddpd=DDPDOptions(eps=eps)), 1, "noise", 0)
    assert seen == [DDPDOptions(eps=eps, stop="budget", selection="softmax") for eps in (0.25, 0.5)]
    assert variant.change == {"ddpd": {"stop": "budget", "selection": "softmax"}}


def test_labels_alone_guide_at_scale_one_and_not_the_planner():
    """Settings given labels only: guidance scale 1 (the conditional model alone) and an
    unconditional planner, whether or not the sampler runs one."""
    settings = Settings(D, V, 3, labels=torch.tensor([5, 6, 7]))
    for planner in (True, False):
        guidance = settings.rows(2, 2, planner)["guidance"]
        assert (guidance.labels.tolist(), guidance.scale, guidance.conditional_planner) == ([7, 5], 1.0, False)


def test_dtype_casts_the_networks_and_is_reported(ckpts, tmp_path, capsys, monkeypatch):
    import ddpd.models

    cast = []
    prepare = ddpd.models.prepare_for_sampling

    def spy(model, dtype, device):
        cast.append(dtype)
        return prepare(model, dtype, device)

    monkeypatch.setattr(ddpd.models, "prepare_for_sampling", spy)
    outs = {}
    for dtype in ("auto", "float32", "bfloat16"):
        outs[dtype] = tmp_path / f"{dtype}.jsonl"
        code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "3", "--steps", "8",
                               "--dtype", dtype, "--out", str(outs[dtype]), "--quiet", "--fused")
        assert code == 0, err
        expected = "float32" if dtype == "auto" else dtype  # auto: float32 on the CPU
        assert f"1 CPU thread, {expected}), fused;" in err, err
        assert cast[-2:] == [getattr(torch, expected)] * 2  # planner and denoiser
    assert outs["auto"].read_bytes() == outs["float32"].read_bytes()
    records = read_jsonl(outs["bfloat16"])
    assert len(records) == 3 and all(len(r["tokens"]) == D and all(0 <= t < V for t in r["tokens"])
                                     for r in records)
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", ckpts["bundle"], "--dtype", "float64"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--dtype" in err and err.count("\n") == 1


def test_compiled_networks_draw_the_samples_of_eager_ones(ckpts, tmp_path, capsys):
    """--compile eager: Dynamo traces both networks (the fused run calls the planner's
    forward and the denoiser's hidden) and the samples are those of the plain run."""
    from torch._dynamo.utils import counters

    outs = {}
    torch._dynamo.reset()
    counters.clear()
    try:
        for backend in (None, "eager"):
            outs[backend] = tmp_path / f"{backend}.jsonl"
            code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "5", "--steps", "8",
                                   "--batch-size", "4", "--out", str(outs[backend]), "--quiet", "--fused",
                                   *(("--compile", backend) if backend else ()))
            assert code == 0, err
        assert counters["stats"]["unique_graphs"] >= 2 and not counters["graph_break"]
    finally:
        torch._dynamo.reset()
    assert outs[None].read_bytes() == outs["eager"].read_bytes()


# ---------------------------------------------------------------- several processes


@pytest.mark.integration
def test_two_processes_write_what_one_process_writes(ckpts, tmp_path, capsys):
    """torchrun with two gloo processes: batches dealt out in turn, gathered by process 0,
    which prints and writes them in order: the file is byte for byte the one-process file."""
    infills = tmp_path / "infills.txt"
    infills.write_text("ab_d\n\nx__y zz\n")
    argv = ["--checkpoint", ckpts["bundle"], "--num-samples", "7", "--batch-size", "2", "--steps", "9", "--seed", "5",
            "--infills", str(infills), "--fused", "--no-progress"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "ddpd.cli.sample", *argv, "--out", str(tmp_path / "two.jsonl")]
    proc = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=HANG_GUARD_SECONDS)
    assert proc.returncode == 0, proc.stderr
    code, stdout, err = run_cli(capsys, *argv, "--out", str(tmp_path / "one.jsonl"))
    assert code == 0, err
    assert (tmp_path / "two.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    assert proc.stdout == stdout and len(stdout.splitlines()) == 7  # one printed list, in order
    summary = [line for line in proc.stderr.splitlines() if line.startswith("ddpd-sample: 7 samples")]
    assert len(summary) == 1 and "2 processes of 1 CPU thread, float32), fused;" in summary[0], proc.stderr
    records = read_jsonl(tmp_path / "two.jsonl")
    assert [r["prompt"] for r in records] == ["ab_d", "", "x__y zz"] * 2 + ["ab_d"]
    assert all(r["text"].startswith("ab") and r["text"][3] == "d" for r in records[::3])


# ---------------------------------------------------------------- prompts and infilling


@pytest.mark.parametrize("fused", [[], ["--fused"]])
@pytest.mark.parametrize("name,models,argv", ROWS, ids=[r[0] for r in ROWS])
def test_every_sampler_keeps_the_prompt(ckpts, tmp_path, capsys, name, models, argv, fused):
    out = tmp_path / "s.jsonl"
    code, stdout, err = run_cli(capsys, *[m.format(**ckpts) for m in models], *argv, "--infill", "a_c ",
                                "--steps", "8", "--num-samples", "3", "--out", str(out), *fused)
    assert code == 0, err
    records = read_jsonl(out)
    assert len(records) == len(stdout.splitlines()) == 3
    for line, record in zip(stdout.splitlines(), records):  # zip(strict=) needs Python 3.10
        assert line == record["text"] and record["prompt"] == "a_c "
        assert record["tokens"][0] == 1 and record["tokens"][2:4] == [3, 0]  # 'a', 'c', ' '


def test_prompt_and_prompt_files(ckpts, tmp_path, capsys):
    code, stdout, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--prompt", "the ", "--num-samples", "4",
                                "--steps", "4")
    assert code == 0, err
    assert len(stdout.splitlines()) == 4 and all(line.startswith("the ") for line in stdout.splitlines())
    assert "warning" not in err  # 4 steps reach the 4 positions the prompt leaves free
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ab\nxyz\n")
    out = tmp_path / "s.jsonl"
    code, stdout, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--prompts", str(prompts), "--out",
                                str(out), "--steps", "8")
    assert code == 0, err
    records = read_jsonl(out)
    assert [r["prompt"] for r in records] == ["ab", "xyz"]  # --num-samples: the number of lines
    code, stdout, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--prompts", str(prompts), "--out",
                                str(out), "--steps", "8", "--num-samples", "5", "--batch-size", "2")
    assert code == 0, err
    assert [r["text"][:2] for r in read_jsonl(out)] == ["ab", "xy", "ab", "xy", "ab"]  # line i mod 2
    prompts.write_bytes(b"\xef\xbb\xbfab\r\nxyz\r\n")  # a byte-order mark and CRLF lines: the same file
    code, stdout, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--prompts", str(prompts), "--out",
                                str(out), "--steps", "8")
    assert code == 0, err
    assert [r["prompt"] for r in read_jsonl(out)] == ["ab", "xyz"]


@pytest.mark.parametrize("argv,message", [
    (["--prompt", "The"], "--prompt 'The': cannot encode the text: text must contain only space and a-z"),
    (["--infill", "a_b_c_d_e"], "--infill 'a_b_c_d_e' is 9 tokens long, more than the 8 of a sample (--length)"),
    (["--prompt", "abcd", "--length", "3"], "--prompt 'abcd' is 4 tokens long, more than the 3 of a sample"),
    # a prompt is named by its first 40 characters, a longer one by 37 and an ellipsis
    (["--prompt", "ab" * 20], f"--prompt '{'ab' * 20}' is 40 tokens long"),
    (["--prompt", "ab" * 20 + "a"], f"--prompt '{'ab' * 18}a...' is 41 tokens long"),
    (["--prompt", "abcdefghij" * 5], f"--prompt '{'abcdefghij' * 3}abcdefg...' is 50 tokens long"),
    (["--prompts", "{missing}"], "No such file or directory"),
    (["--prompts", "{latin1}"], "prompts {latin1}: not UTF-8 text (invalid continuation byte at byte 3)\n"),
    (["--infills", "{empty}"], "holds no line"),
    (["--prompts", "{bad}"], "line 2: cannot encode the text"),
    (["--prompts", "{form_feed}"], "line 1: cannot encode the text: text must contain only space and a-z (text8 "
                                   "format), got '\\x0c' (U+000C) at position 2"),
    (["--infill", "ab_cD"], "got 'D' (U+0044) at position 4; 1 such"),  # positions in the whole text
    (["--infill", "A_B_C"], "got 'A' (U+0041) at position 0; 3 such"),
    (["--prompt", "a", "--infill", "b"], "not allowed with argument"),
])
def test_prompts_that_cannot_be_used_are_named_in_one_line(ckpts, tmp_path, capsys, argv, message):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "bad.txt").write_text("fine\nNot fine\n")
    (tmp_path / "form_feed.txt").write_text("ab\x0ccd\n")  # one line, not two: only line breaks split lines
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    paths = {name: str(tmp_path / f"{name}.txt") for name in ("missing", "empty", "bad", "form_feed", "latin1")}
    argv, message = [a.format(**paths) for a in argv], message.format(**paths)
    try:
        code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], *argv)
    except SystemExit as exit_info:  # argparse
        code, err = exit_info.code, capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_a_prompt_needs_a_tokenizer(tmp_path, capsys):
    model, config = _model("mask-denoiser", 0)
    del config["tokenizer"]
    save_checkpoint(str(tmp_path / "m"), model, config)
    code, _, err = run_cli(capsys, "--checkpoint", str(tmp_path / "m"), "--sampler", "maskgit", "--prompt", "ab")
    assert code == 2 and "--prompt needs a tokenizer, and the checkpoints record none" in err


def test_samples_without_a_tokenizer_are_printed_as_token_ids(tmp_path, capsys):
    """Without a tokenizer a sample's line is its token ids separated by spaces, those of --out."""
    model, config = _model("mask-denoiser", 0)
    del config["tokenizer"]
    save_checkpoint(str(tmp_path / "m"), model, config)
    code, stdout, err = run_cli(capsys, "--checkpoint", str(tmp_path / "m"), "--sampler", "maskgit", "--steps", "2",
                                "--num-samples", "2", "--out", str(tmp_path / "s.jsonl"))
    assert code == 0, err
    records = read_jsonl(tmp_path / "s.jsonl")
    assert [r["text"] for r in records] == [None, None]
    assert stdout.splitlines() == [" ".join(map(str, r["tokens"])) for r in records]


def _gpt2_denoiser(path) -> str:
    """A tiny mask denoiser over GPT-2's tokens, saved at `path`."""
    pytest.importorskip("tiktoken")
    torch.manual_seed(0)
    config = config_for("mask-denoiser", 50257, D, **TINY)
    save_checkpoint(str(path), build_model("mask-denoiser", config),
                    {"kind": "mask-denoiser", "model": config.to_dict(), "tokenizer": {"name": "gpt2"}})
    return str(path)


def test_a_sample_with_line_breaks_is_printed_on_one_line(tmp_path, capsys):
    """GPT-2 text holds newlines: a sample was printed over several lines, so that the printed
    lines were not the samples (`| head -1` gave part of one)."""
    _gpt2_denoiser(tmp_path / "m")
    out = tmp_path / "s.jsonl"
    code, stdout, err = run_cli(capsys, "--checkpoint", str(tmp_path / "m"), "--sampler", "maskgit", "--prompt",
                                "a\nb\\c\r", "--num-samples", "2", "--steps", "2", "--out", str(out))
    assert code == 0, err
    records = read_jsonl(out)
    assert [r["text"][:6] for r in records] == ["a\nb\\c\r"] * 2  # the file keeps the text as decoded
    assert stdout.splitlines() == [r["text"].replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
                                   for r in records]
    assert all(line.startswith("a\\nb\\\\c\\r") for line in stdout.splitlines())


def test_text_an_ascii_stdout_cannot_hold_is_printed_escaped(tmp_path, monkeypatch):
    """PYTHONIOENCODING=ascii (or a Latin-1 locale): GPT-2 text ended ddpd-sample with "'ascii'
    codec can't encode character", exit status 2, and no --out file though every sample was drawn."""
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", stdout)
    out = tmp_path / "s.jsonl"
    assert main(["--checkpoint", _gpt2_denoiser(tmp_path / "m"), "--sampler", "maskgit", "--prompt", "\u00b1 \u3057",
                 "--num-samples", "2", "--steps", "2", "--out", str(out)]) == 0
    stdout.flush()
    printed = stdout.buffer.getvalue().decode("ascii").splitlines()
    texts = [r["text"] for r in read_jsonl(out)]
    assert printed == [t.translate(ONE_LINE).encode("ascii", "backslashreplace").decode("ascii") for t in texts]
    assert all(line.startswith("\\xb1 \\u3057") for line in printed)


class _UnknownCodec(io.StringIO):
    """A stdout whose encoding names no codec Python knows (a wrapper's own label)."""

    encoding = "x-no-such-codec"


@pytest.mark.parametrize("stream", [io.StringIO, _UnknownCodec])
def test_a_stdout_without_a_known_encoding_gets_the_text_as_it_is(stream, monkeypatch):
    """io.StringIO (a tool's main() called from Python) has no encoding: its text is not
    escaped as for ASCII; an encoding Python cannot look up leaves the text to the stream."""
    from ddpd.streams import Stdout

    stdout = stream()
    monkeypatch.setattr(sys, "stdout", stdout)
    Stdout().print("\u00b1 \u3057")
    assert stdout.getvalue() == "\u00b1 \u3057\n"


# ---------------------------------------------------------------- class labels and guidance


def _conditional(kind: str, seed: int, classes: int = 2):
    """A class-conditional network whose labels matter: its adaLN weights (zero when
    built, so that a fresh model ignores the label) drawn at random."""
    torch.manual_seed(seed)
    config = config_for(kind, V, D, num_classes=classes, **TINY)
    model = build_model(kind, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "modulation" in name or "label_embed" in name:
                p.normal_(0.0, 1.0)
    return model, {"kind": kind, "model": config.to_dict(), "tokenizer": {"name": "text8"}, "schedule": "linear"}


@pytest.fixture(scope="module")
def classes(tmp_path_factory):
    root = tmp_path_factory.mktemp("classes")
    paths = {}
    for i, kind in enumerate(("planner", "mask-denoiser", "uniform")):
        paths[kind] = str(root / kind)
        save_checkpoint(paths[kind], *_conditional(kind, 10 + i))
    paths["planner3"] = str(root / "planner3")
    save_checkpoint(paths["planner3"], *_conditional("planner", 20, classes=3))
    return paths


@pytest.fixture
def calls(monkeypatch):
    """The keyword arguments of every sampler call."""
    from ddpd import sampling

    seen = []
    for name in ("ddpd_sample", "ddpd_sample_uniform", "mask_sample"):
        real = getattr(sampling, name)

        def spy(*args, _real=real, **kwargs):
            seen.append(kwargs)
            return _real(*args, **kwargs)
        monkeypatch.setattr(sampling, name, spy)
    return seen


def test_labels_and_guidance_reach_the_sampler(classes, ckpts, tmp_path, capsys, calls):
    out = tmp_path / "s.jsonl"
    code, _, err = run_cli(capsys, "--planner", classes["planner"], "--denoiser", classes["mask-denoiser"],
                           "--labels", "1", "0", "1", "--guidance-scale", "2.5", "--num-samples", "5",
                           "--batch-size", "2", "--steps", "6", "--out", str(out), "--quiet")
    assert code == 0, err
    assert [c["guidance"].labels.tolist() for c in calls] == [[1, 0], [1, 1], [0]]  # sample i: label i mod 3
    assert all(c["guidance"].scale == 2.5 and c["guidance"].conditional_planner for c in calls)
    assert [r["label"] for r in read_jsonl(out)] == [1, 0, 1, 1, 0]
    calls.clear()
    # an unconditional planner with a class-conditional denoiser: the labels go to the denoiser only
    code, _, err = run_cli(capsys, "--planner", ckpts["planner"], "--denoiser", classes["mask-denoiser"],
                           "--labels", "0", "--num-samples", "2", "--steps", "6", "--quiet")
    assert code == 0, err
    assert calls[0]["guidance"].labels.tolist() == [0, 0] and calls[0]["guidance"].scale == 1.0
    assert not calls[0]["guidance"].conditional_planner
    calls.clear()
    code, _, err = run_cli(capsys, "--checkpoint", classes["mask-denoiser"], "--sampler", "maskgit", "--steps", "3",
                           "--num-samples", "2", "--quiet")  # no --labels: the null label, no guidance
    assert code == 0, err
    assert "guidance" not in calls[0]


@pytest.mark.parametrize("model,argv", [("mask-denoiser", ["--sampler", "maskgit"]),
                                        ("mask-denoiser", ["--sampler", "tau-leaping", "--eta", "1"]),
                                        ("uniform", ["--sampler", "ddpd", "--clock", "exact"]),
                                        ("uniform", ["--sampler", "tau-leaping"])])
def test_samples_follow_the_label_and_the_guidance(classes, tmp_path, capsys, model, argv):
    """Same seed, other label or other guidance: other samples (these networks' labels
    matter); the same label and guidance: the same samples, fused or not."""
    def tokens(*extra):
        out = tmp_path / "s.jsonl"
        code, _, err = run_cli(capsys, "--checkpoint", classes[model], *argv, "--steps", "8", "--num-samples", "6",
                               "--out", str(out), "--quiet", *extra)
        assert code == 0, err
        return [r["tokens"] for r in read_jsonl(out)]

    zero, one = tokens("--labels", "0"), tokens("--labels", "1")
    assert zero != one
    assert tokens("--labels", "0", "--guidance-scale", "3") != zero
    assert tokens("--labels", "0", "--guidance-scale", "3", "--fused") == tokens("--labels", "0",
                                                                                  "--guidance-scale", "3")
    assert tokens("--labels", "0", "1") == [zero[0], one[1], zero[2], one[3], zero[4], one[5]]


@pytest.mark.parametrize("argv,message", [
    (["--planner", "{planner}", "--denoiser", "{mask-denoiser}", "--labels", "2"],
     "--labels must be classes in [0, 2) of --denoiser {mask-denoiser}, got 2"),
    (["--planner", "{planner3}", "--denoiser", "{mask-denoiser}", "--labels", "0"],
     "--planner {planner3} has 3 classes, but --denoiser {mask-denoiser} has 2"),
    (["--checkpoint", "{mask-denoiser}", "--guidance-scale", "2"], "--guidance-scale needs --labels"),
    (["--checkpoint", "{mask-denoiser}", "--labels", "0", "--guidance-scale", "-1"], "--guidance-scale must be"),
    (["--checkpoint", "{plain}", "--labels", "0"], "is not class-conditional (trained without --num-classes)"),
])
def test_labels_that_cannot_be_used_are_named_in_one_line(classes, ckpts, capsys, argv, message):
    paths = {**classes, "plain": ckpts["mask-denoiser"]}
    code, _, err = run_cli(capsys, *[a.format(**paths) for a in argv], "--sampler", "maskgit" if "--checkpoint"
                           in argv else "ddpd")
    assert code == 2 and err.count("\n") == 1 and message.format(**paths) in err, err


def test_a_bundle_planner_the_sampler_does_not_run_may_have_other_classes(classes, tmp_path, capsys, calls):
    """--sampler maskgit runs a bundle's denoiser alone: the planner's classes do not matter."""
    from ddpd.checkpoint import load_model

    bundle = str(tmp_path / "bundle")
    save_bundle(bundle, *load_model(classes["planner3"]), *load_model(classes["mask-denoiser"]))
    code, _, err = run_cli(capsys, "--checkpoint", bundle, "--sampler", "maskgit", "--labels", "1",
                           "--steps", "3", "--num-samples", "2", "--quiet")
    assert code == 0, err
    assert calls[0]["guidance"].labels.tolist() == [1, 1]


@pytest.mark.integration
def test_a_process_killed_mid_run_keeps_the_finished_samples(ckpts, tmp_path):
    """kill -9 of process 1: process 0's next gather fails. It used to end in a gloo traceback
    with the finished samples thrown away; now it publishes them and says why in one line
    (or, when torchrun's SIGTERM reaches it first, as any interrupted run)."""
    out = tmp_path / "s.jsonl"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "ddpd.cli.sample", "--checkpoint", ckpts["bundle"], "--num-samples", "100000", "--batch-size",
               "1", "--steps", "8", "--no-progress", "--out", str(out)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=default_signals)
    try:
        for _ in range(4):  # four rounds gathered: both processes are sampling
            assert proc.stdout.readline(), proc.stderr.read()
        os.kill(torchrun_worker(proc.pid, 1), signal.SIGKILL)
        _, err = proc.communicate(timeout=HANG_GUARD_SECONDS)
    finally:
        proc.kill()
    assert "[rank0]" not in err, err  # no traceback of process 0 (torchrun reports the killed one)
    lines = [line for line in err.splitlines() if line.startswith("ddpd-sample:")]
    assert len(lines) == 1, err
    assert "another process of the group failed or was killed" in lines[0] or "interrupted by SIGTERM" in lines[0], err
    written = int(lines[0].split("wrote the ")[1].split()[0])
    partial = tmp_path / "s.partial.jsonl"
    assert lines[0].endswith(f" to {partial}"), err
    assert [r["index"] for r in read_jsonl(partial)] == list(range(written)) and written >= 4


@pytest.mark.integration
def test_a_signal_while_the_samples_are_published_keeps_them(ckpts, tmp_path, capsys, monkeypatch):
    """Every sample is finished when the file is published: a Ctrl-C during its final fsync and
    rename used to discard all of them (exit 130, no file). The signal now waits for the
    publication, then stops the tool as any signal does."""
    out = tmp_path / "s.jsonl"
    publish = files.StreamedFile.publish

    def interrupted(self, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # handled at once, in this (the main) thread
        publish(self, **kwargs)

    monkeypatch.setattr(files.StreamedFile, "publish", interrupted)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # not ignored, whoever runs the tests
    try:
        code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "4", "--batch-size", "2",
                               "--steps", "2", "--out", str(out), "--quiet")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored after the run
    finally:
        signal.signal(signal.SIGINT, outer)
    assert code == 128 + signal.SIGINT and err.endswith(f"ddpd-sample: interrupted by SIGINT; wrote the 4 finished "
                                                        f"sample(s) to {out}\n"), err
    assert [r["index"] for r in read_jsonl(out)] == list(range(4))


@pytest.mark.integration
def test_a_signal_ignored_at_the_start_stays_ignored(ckpts, tmp_path):
    """`nohup ddpd-sample ...` ignores SIGHUP: the run outlives the terminal (the tool used to
    install its own handler and stop with exit 129)."""
    out = tmp_path / "s.jsonl"
    command = [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
               "from ddpd.cli.sample import main; sys.exit(main(sys.argv[1:]))",
               "--checkpoint", ckpts["bundle"], "--steps", "8", "--batch-size", "5", "--num-samples", "15",
               "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=default_signals)
    assert len(proc.stdout.readline().strip()) == D  # a first batch is done: the handlers are in place
    proc.send_signal(signal.SIGHUP)
    rest, err = proc.communicate(timeout=HANG_GUARD_SECONDS)
    assert proc.returncode == 0, err
    assert [r["index"] for r in read_jsonl(out)] == list(range(15))


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(training="long"), "config.json's training is 'long', not an object"),
    (lambda c: c.update(training={"seq_len": "8"}), "config.json's training.seq_len is '8', not a positive int"),
    (lambda c: (c.update(training=None), c["model"].pop("max_seq_len")), None),  # the models' defaults
    (lambda c: c.update(tokenizer="text8"), "config.json cannot be used: tokenizer config must be a dict, got str"),
    (lambda c: c.update(schedule="bogus"), "config.json cannot be used: schedule must be one of"),
])
def test_an_edited_config_is_one_line_or_its_defaults(ckpts, tmp_path, capsys, edit, message):
    """A hand-edited training section or a missing max_seq_len (its digest recomputed, or a
    config of a ddpd that wrote none) gave a raw AttributeError / KeyError."""
    import shutil

    denoiser = tmp_path / "denoiser"
    shutil.copytree(ckpts["mask-denoiser"], denoiser)
    config = json.loads((denoiser / "config.json").read_text())
    edit(config)
    config["settings_sha256"] = settings_digest(config)  # edited with care: the digest passes
    (denoiser / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(capsys, "--planner", ckpts["planner"], "--denoiser", str(denoiser), "--num-samples", "1",
                           "--steps", "2", "--quiet")
    if message is None:
        assert code == 0, err
    else:
        assert code == 1 and err.count("\n") == 1 and message in err and str(denoiser) in err, err


@pytest.mark.parametrize("field, value, message", [
    ("tokenizer", "text8", "tokenizer config must be a dict, got str"),
    ("tokenizer", {"name": "bpe"}, "tokenizer config 'name' must be 'text8' or 'gpt2', got 'bpe'"),
    ("schedule", "bogus", "schedule must be one of ['cosine', 'linear'] or a Schedule, got 'bogus'"),
])
def test_a_damaged_tokenizer_or_schedule_names_its_checkpoint(ckpts, tmp_path, capsys, field, value, message):
    """A single checkpoint's damaged tokenizer or schedule was a usage error (exit 2) that
    named no checkpoint."""
    import shutil

    denoiser = tmp_path / "denoiser"
    shutil.copytree(ckpts["mask-denoiser"], denoiser)
    config = {**json.loads((denoiser / "config.json").read_text()), field: value}
    (denoiser / "config.json").write_text(json.dumps({**config, "settings_sha256": settings_digest(config)}))
    code, _, err = run_cli(capsys, "--checkpoint", str(denoiser), "--sampler", "tau-leaping", "--num-samples", "1",
                           "--steps", "2", "--quiet")
    assert code == 1 and err == f"ddpd-sample: error: {denoiser}: config.json cannot be used: {message}\n"


@pytest.mark.parametrize("option,fields", [
    ("A", {"stop": "eps", "selection": "sigmoid"}),
    ("A+B", {"stop": "budget", "selection": "sigmoid"}),
    ("A+C", {"stop": "eps", "selection": "softmax"}),
    ("a+b+c", {"stop": "budget", "selection": "softmax"}),  # the letters in either case
])
def test_option_letters_set_the_stop_and_the_selection(option, fields):
    """B runs the whole budget and C selects by softmax, each on its own (docs/cli.md)."""
    from ddpd.cli.sample import parse_option

    assert parse_option(option) == fields


@pytest.mark.parametrize("option", ["", "+", "++"])
def test_an_option_without_letters_is_refused(ckpts, capsys, option):
    """--option with no letter at all names no choice: refused, not read as A."""
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--option", option)
    assert code == 2 and err.count("\n") == 1
    assert f"--option must combine the letters A, B, C (e.g. A+B+C), got {option!r}" in err, err


def test_maskgit_default_choice_temperature():
    """Without --choice-temperature, MaskGIT's default policy runs at the policy's own default (4.5)."""
    from ddpd.cli.sample import build_parser, check_command_line
    from ddpd.sampling.policies import MaskGIT

    args = build_parser().parse_args(["--sampler", "maskgit"])
    check_command_line(args)
    assert args.choice_temperature == MaskGIT().choice_temperature == 4.5


def test_the_t_end_default_is_ddpd_options_own():
    """--t-end's default, written out so that the parser imports no torch, is DDPDOptions' T_END."""
    from ddpd.cli.sample import build_parser
    from ddpd.sampling.options import T_END, DDPDOptions

    assert build_parser().get_default("t_end") == T_END == DDPDOptions().t_end


@pytest.mark.parametrize("argv,function,expected", [
    (["--sampler", "maskgit", "--policy", "threshold: 0.5"], "mask_sample", "ConfidenceThreshold(threshold=0.5)"),
    (["--sampler", "maskgit", "--policy", "maskgit:choice_temperature=2"], "mask_sample",
     "MaskGIT(choice_temperature=2.0)"),
    (["--policy", "error-budget:bound=0.5,max_k=3,known_noise=1"], "ddpd_sample",
     "ErrorBudget(bound=0.5, max_k=3, order='risk', spread='none', known_noise=True, plan_every=1, "
     "choice_temperature=0.0, revise_above=None)"),
    # the name with spaces around it, which parse_policy strips: it was taken for a maskgit policy
    (["--policy", " error-budget :bound=0.5"], "ddpd_sample",
     "ErrorBudget(bound=0.5, max_k=16, order='risk', spread='none', known_noise=False, plan_every=1, "
     "choice_temperature=0.0, revise_above=None)"),
    (["--sampler", "maskgit", "--policy", "threshold :0.5"], "mask_sample", "ConfidenceThreshold(threshold=0.5)"),
])
def test_the_policy_reaches_the_sampler_it_names(ckpts, capsys, monkeypatch, argv, function, expected):
    """--policy is the policy the sampler runs, not its default one."""
    import ddpd.sampling

    seen, sampler = [], getattr(ddpd.sampling, function)

    def recording(*args, **kwargs):
        seen.append(kwargs["policy"] if "policy" in kwargs else kwargs["ddpd"].policy)
        return sampler(*args, **kwargs)

    monkeypatch.setattr(ddpd.sampling, function, recording)
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "4", "--num-samples", "1", *argv)
    assert code == 0, err
    assert [repr(policy) for policy in seen] == [expected]


def test_a_zero_end_temperature_anneals_to_greedy(ckpts, capsys):
    code, stdout, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "8", "--num-samples", "2",
                                "--temperature-end", "0")
    assert code == 0, err
    assert len(stdout.splitlines()) == 2


def test_prompts_of_a_whole_sample_and_infill_files(ckpts, tmp_path, capsys):
    """A prompt as long as a sample is every position fixed (not refused); --infills, like
    --prompts, gives one sample a line by default."""
    code, stdout, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--prompt", "abcdefgh", "--num-samples", "2")
    assert code == 0, err
    assert stdout.splitlines() == ["abcdefgh", "abcdefgh"]
    infills = tmp_path / "infills.txt"
    infills.write_text("a_c\nx_z\ny\n")
    out = tmp_path / "s.jsonl"
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--infills", str(infills), "--out", str(out),
                           "--steps", "8", "--quiet")
    assert code == 0, err
    records = read_jsonl(out)
    assert [r["prompt"] for r in records] == ["a_c", "x_z", "y"]
    assert [(r["text"][0], r["text"][2]) for r in records[:2]] == [("a", "c"), ("x", "z")]


def test_an_infill_freezes_its_text_and_leaves_its_gaps_and_the_rest_to_generate():
    """Each gap and each position after the text is -1 and free; the text's tokens are frozen where
    they stand (text8: a 1, b 2, c 3)."""
    from ddpd.cli.sample import encode_prompts
    from ddpd.training.data import tokenizer_from_config

    x_init, frozen = encode_prompts((["a_c", "_b"], True, ["--infills f line 1", "--infills f line 2"]),
                                    tokenizer_from_config({"name": "text8"}), 5)
    assert x_init.tolist() == [[1, -1, 3, -1, -1], [-1, 2, -1, -1, -1]]
    assert frozen.tolist() == [[True, False, True, False, False], [False, True, False, False, False]]


@pytest.mark.parametrize("argv,line", [
    # option B: 12 planner and 12 denoiser passes a sample, each step committing one token
    (["--option", "A+B+C", "--steps", "12"], "network passes per sample 24.0 (planner 12.0, denoiser 12.0), 0.50 "
                                             "tokens committed per pass"),
    # MaskGIT commits the 8 positions in 4 denoiser passes
    (["--sampler", "maskgit", "--steps", "4"], "network passes per sample 4.0 (planner 0.0, denoiser 4.0), 2.00 "
                                               "tokens committed per pass"),
])
def test_summary_of_passes_per_sample(ckpts, capsys, argv, line):
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "5", "--batch-size", "2",
                           "--quiet", *argv)
    assert code == 0, err
    assert f"ddpd-sample: {line}\n" in err, err


def test_one_pass_runs_the_uniform_model_once_a_step_and_nothing_else(ckpts, capsys):
    """--one-pass: DDPDOptions(one_pass=True), a pass a step (12 steps, 5 samples: 12 a sample);
    refused where no single uniform model runs, or on the exact clock (its pass serves both)."""
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["uniform"], "--num-samples", "5", "--batch-size", "2",
                           "--quiet", "--option", "A+B", "--steps", "12", "--one-pass")
    assert code == 0, err
    assert "network passes per sample 12.0 (one uniform model), 1.00 tokens committed per pass\n" in err, err
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--one-pass", "--steps", "4")
    assert code == 2 and err == ("ddpd-sample: error: --one-pass needs one uniform model (--model uniform, or a "
                                 "uniform checkpoint); with planner 'planner' and denoiser 'mask-denoiser' a step's "
                                 "plan and draws are two networks' passes\n"), err
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["uniform"], "--one-pass", "--clock", "exact")
    assert code == 2 and err.startswith("ddpd-sample: error: --one-pass is the planner clock's"), err
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["uniform"], "--one-pass", "--sampler", "tau-leaping")
    assert code == 2 and "--one-pass is a setting of --sampler ddpd" in err, err


def test_summary_names_the_single_uniform_model(ckpts, capsys):
    """Its planning and denoising calls are one model's (two a step on the planner clock, 12 steps,
    5 samples in batches of 2, 2 and 1: 3 x 24 calls), not a planner that never ran."""
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["uniform"], "--num-samples", "5", "--batch-size", "2",
                           "--quiet", "--option", "A+B", "--steps", "12")
    assert code == 0, err
    assert "forward passes: uniform model 72 (120 row-evaluations, 0 saved by early stopping)\n" in err, err
    assert "network passes per sample 24.0 (one uniform model), 0.50 tokens committed per pass\n" in err, err
    assert "planner" not in err.split("forward passes:")[1], err


@pytest.mark.parametrize("device,processes,where", [
    ("cpu", 1, "2 CPU threads"),
    ("cpu", 2, "2 processes of 2 CPU threads"),
    ("cuda:0", 2, "2 processes on cuda"),
])
def test_the_summary_gives_samples_per_second_and_where_they_ran(capsys, device, processes, where):
    """The rate is samples over seconds (10 in 4 s: 2.50 a second), and the processes are named from two on."""
    from types import SimpleNamespace

    from ddpd.cli.sample import COUNTS, PER_ROW, _summary

    args = SimpleNamespace(device_obj=torch.device(device), length=D, dtype_name="float32", fused=False)
    _summary(args, 10, dict.fromkeys(COUNTS + PER_ROW, 0), 4.0, 2, processes)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"ddpd-sample: 10 samples of {D} tokens in 4.00 s (2.50 samples/s, {where}, float32); "
                            "forward passes: planner 0 "), first


def test_too_few_steps_for_the_prompt_that_leaves_the_most_free(ckpts, tmp_path, capsys):
    """Of prompts of different lengths, the shortest leaves the most positions to generate: the
    budget is weighed against it (7 here), not against the longest prompt's 2."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("abcdef\na\n")
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--prompts", str(prompts), "--steps", "4",
                           "--quiet")
    assert code == 0 and "warning: --steps 4 can denoise at most 4 of the 7 positions to generate" in err, err


def test_a_tokenizer_of_another_vocabulary_is_refused(tmp_path, capsys):
    """A network of 30 symbols whose checkpoint names the 27-symbol text8 tokenizer cannot be decoded."""
    torch.manual_seed(0)
    config = config_for("mask-denoiser", 30, D, **TINY)
    save_checkpoint(str(tmp_path / "m"), build_model("mask-denoiser", config),
                    {"kind": "mask-denoiser", "model": config.to_dict(), "tokenizer": {"name": "text8"}})
    code, stdout, err = run_cli(capsys, "--checkpoint", str(tmp_path / "m"), "--sampler", "maskgit", "--steps", "2")
    assert code == 2 and stdout == "" and err == "ddpd-sample: error: the tokenizer has 27 symbols but the models 30\n"


# ---------------------------------------------------------------- each flag reaches the setting it names

from ddpd.sampling import DDPDOptions, Execution, Temperature, Truncation, policies  # noqa: E402

SAMPLING_FUNCTIONS = ("ddpd_sample", "ddpd_sample_uniform", "tau_leaping_planned", "tau_leaping_mask",
                      "tau_leaping_uniform", "mask_sample")


@pytest.fixture
def sampled(monkeypatch):
    """(function name, keyword arguments) of every sampler call."""
    from ddpd import sampling

    seen = []
    for name in SAMPLING_FUNCTIONS:
        def spy(*args, _name=name, _real=getattr(sampling, name), **kwargs):
            seen.append((_name, kwargs))
            return _real(*args, **kwargs)
        monkeypatch.setattr(sampling, name, spy)
    return seen


# what a run of the test bundle without flags passes: --steps the length D (twice it for the bundled
# model only), float32 on the CPU, the defaults of docs/cli.md
DEFAULTS = {"steps": D, "temperature": Temperature(1.0, None), "execution": Execution(dtype="float32"),
            "truncation": Truncation(), "ddpd": DDPDOptions(), "schedule": "linear"}


@pytest.mark.parametrize("argv,changed", [
    ([], {}),
    (["--steps", "5"], {"steps": 5}),
    (["--temperature", "0.5", "--temperature-end", "0.25"], {"temperature": Temperature(0.5, 0.25)}),
    (["--top-k", "3", "--top-p", "0.9", "--min-p", "0.05"], {"truncation": Truncation(3, 0.9, 0.05)}),
    (["--fused"], {"execution": Execution(fused=True, sync_every=8, dtype="float32")}),
    (["--fused", "--sync-every", "3"], {"execution": Execution(fused=True, sync_every=3, dtype="float32")}),
    (["--dtype", "bfloat16"], {"execution": Execution(dtype="bfloat16")}),
    (["--option", "A+C"], {"ddpd": DDPDOptions(stop="eps", selection="softmax")}),
    (["--option", "A+B"], {"ddpd": DDPDOptions(stop="budget", selection="sigmoid")}),
    (["--stop", "budget", "--selection", "softmax"], {"ddpd": DDPDOptions(stop="budget", selection="softmax")}),
    (["--eps", "0.25"], {"ddpd": DDPDOptions(eps=0.25)}),
    (["--k", "3", "--parallel-steps", "2"], {"ddpd": DDPDOptions(k=3, parallel_steps=2)}),
    (["--clock", "exact", "--t-end", "0.75"], {"ddpd": DDPDOptions(clock="exact", t_end=0.75)}),
])
def test_each_flag_reaches_the_setting_it_names(ckpts, capsys, sampled, argv, changed):
    """docs/cli.md's flags as the sampler receives them: a flag that set another field, or
    none, would sample something else without a word."""
    code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "1", "--quiet", *argv)
    assert code == 0, err
    [(function, kwargs)] = sampled
    assert function == "ddpd_sample" and kwargs["denoiser_type"] == "mask"
    assert {key: kwargs[key] for key in DEFAULTS} == {**DEFAULTS, **changed}


@pytest.mark.parametrize("models,argv,function,expected", [
    (["--planner", "{planner}", "--denoiser", "{uniform-denoiser}"], [], "ddpd_sample", {"denoiser_type": "uniform"}),
    (["--planner", "{planner}", "--denoiser", "{uniform-denoiser}"], ["--sampler", "tau-leaping"],
     "tau_leaping_planned", {"denoiser_type": "uniform"}),
    (["--checkpoint", "{bundle}"], ["--sampler", "tau-leaping"], "tau_leaping_planned", {"denoiser_type": "mask"}),
    (["--checkpoint", "{mask-denoiser}"], ["--sampler", "tau-leaping", "--eta", "2"], "tau_leaping_mask",
     {"eta": 2.0}),
    (["--checkpoint", "{uniform}"], ["--option", "A+B+C"], "ddpd_sample_uniform",
     {"ddpd": DDPDOptions(stop="budget", selection="softmax")}),
    (["--checkpoint", "{uniform}"], ["--sampler", "tau-leaping"], "tau_leaping_uniform", {}),
    (["--checkpoint", "{mask-denoiser}"], ["--sampler", "maskgit"], "mask_sample", {"policy": policies.MaskGIT(4.5)}),
    (["--checkpoint", "{bundle}"], ["--sampler", "maskgit", "--choice-temperature", "2"], "mask_sample",
     {"policy": policies.MaskGIT(2.0)}),
])
def test_the_models_and_sampler_flags_choose_the_sampler_and_its_own_settings(ckpts, capsys, sampled, models, argv,
                                                                             function, expected):
    """The table of docs/cli.md: the sampler each set of models runs, with the keywords only it takes."""
    code, _, err = run_cli(capsys, *[m.format(**ckpts) for m in models], "--num-samples", "1", "--steps", "4",
                           "--quiet", *argv)
    assert code == 0, err
    [(called, kwargs)] = sampled
    assert called == function and {key: kwargs[key] for key in expected} == expected


def test_sample_i_draws_from_philox_row_i_of_the_seed(ckpts, capsys, sampled):
    """--seed is the noise's seed (0 without it) and each batch starts at its first sample's row."""
    for argv, seed in (([], 0), (["--seed", "7"], 7)):
        sampled.clear()
        code, _, err = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--num-samples", "5", "--batch-size", "2",
                               "--steps", "4", "--quiet", *argv)
        assert code == 0, err
        assert [(kwargs["noise"].seed, kwargs["noise"].first_row) for _, kwargs in sampled] == [(seed, 0), (seed, 2),
                                                                                                  (seed, 4)]


def test_the_schedule_of_the_checkpoints_reaches_the_sampler(tmp_path, capsys, sampled):
    """The noise schedule is the models' (config.json's "schedule"), not the linear default."""
    model, config = _model("uniform", 3)
    save_checkpoint(str(tmp_path / "cosine"), model, {**config, "schedule": "cosine"})
    code, _, err = run_cli(capsys, "--checkpoint", str(tmp_path / "cosine"), "--num-samples", "1", "--steps", "4",
                           "--quiet")
    assert code == 0, err
    assert [(function, kwargs["schedule"]) for function, kwargs in sampled] == [("ddpd_sample_uniform", "cosine")]


def test_the_option_hint_follows_only_an_option(capsys):
    """A refusal of --stop names --option where --option set it, and only there."""
    from ddpd.cli.sample import main

    for argv, hint in ((["--stop", "eps"], ""), (["--option", "A"], " (--option A sets --stop and --selection)")):
        assert main(["--clock", "exact", *argv]) == 2
        assert capsys.readouterr().err == ("ddpd-sample: error: --stop eps is not available with --clock exact, which "
                                           f"runs to --t-end; use --stop budget or --clock planner{hint}\n")


def test_a_config_without_max_seq_len_samples_at_the_models_default_length(ckpts, tmp_path, capsys):
    """A config.json that gives no max_seq_len (an older ddpd's) has the length load_model builds
    the network with, TransformerConfig's default: the default --length and its upper bound."""
    import shutil

    from ddpd.models.config import TransformerConfig

    denoiser, longest = tmp_path / "denoiser", TransformerConfig.max_seq_len
    shutil.copytree(ckpts["mask-denoiser"], denoiser)
    config = json.loads((denoiser / "config.json").read_text())
    del config["model"]["max_seq_len"]
    (denoiser / "config.json").write_text(json.dumps({**config, "settings_sha256": settings_digest(config)}))
    argv = ["--checkpoint", str(denoiser), "--sampler", "maskgit", "--num-samples", "1", "--steps", "1", "--quiet"]
    code, _, err = run_cli(capsys, *argv, "--out", str(tmp_path / "s.jsonl"))
    assert code == 0, err
    assert len(read_jsonl(tmp_path / "s.jsonl")[0]["tokens"]) == longest
    code, _, err = run_cli(capsys, *argv, "--length", str(longest + 1))
    assert code == 2 and f"--length must be in [1, {longest}] (the models' max_seq_len), got {longest + 1}" in err, err
