"""The training loop: objectives wiring, loss decrease, exact resume, data parallel, CLI."""
import datetime
import errno
import gc
import json
import math
import os
import pathlib
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import ddpd.checkpoint as ckpt
from ddpd import files
from ddpd.assets import BOOKS
from ddpd.checkpoint import CheckpointError, load_checkpoint, load_model, load_train_state, read_config
from ddpd.cli.train import main
from ddpd.process import corrupt
from ddpd.training.trainer import ResumeConflict, TrainConfig, Trainer, learning_rate, stream_seed
from hang_guard import HANG_GUARD_SECONDS, default_signals, torchrun_worker

# tiny runs of a few steps keep TINY's warmup; the warning it gives is tested where it is meant
pytestmark = pytest.mark.filterwarnings(r"ignore:warmup=\d+ >= steps=\d+:UserWarning")

KINDS = ("planner", "mask-denoiser", "uniform-denoiser", "uniform", "ar")
TINY = dict(steps=20, batch_size=16, seq_len=32, d_model=32, n_layers=1, n_heads=2, lr=3e-3, warmup=4,
            eval_every=20, eval_batches=4, save_every=20, seed=0)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models train fastest on one thread, and a fresh process (OMP_NUM_THREADS=1)
    then runs the same kernels for the bitwise comparisons."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


ONE_THREAD_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The shipped books corpus (198 k characters), copied: tests may change their copy."""
    path = tmp_path_factory.mktemp("data") / "books.txt"
    path.write_text(BOOKS.read_text())
    return str(path)


def config(corpus, out, kind="planner", **changes):
    return TrainConfig(kind=kind, data=corpus, out=str(out), **{**TINY, **changes})


def test_each_stream_of_each_process_has_its_own_63_bit_seed():
    """The data, noise, dropout and evaluation streams of every process draw from seeds of
    their own, in [0, 2**63), the same ones on every call."""
    keys = [(seed, rank, stream) for seed in (0, 1, 2**63 - 1) for rank in range(4)
            for stream in ("data", "noise", "dropout", "eval")]
    seeds = [stream_seed(*key) for key in keys]
    assert all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds)
    assert len(set(seeds)) == len(keys) and seeds == [stream_seed(*key) for key in keys]


def test_learning_rate_schedule(corpus, tmp_path):
    """Steps 0 to 99: up to lr at step 9, min_lr at step 99 (the last step ran above it, and
    the peak was held two steps)."""
    cfg = config(corpus, tmp_path, steps=100, warmup=10, lr=1e-3, min_lr=1e-4)
    lrs = [learning_rate(step, cfg) for step in range(100)]
    assert lrs[:10] == pytest.approx([1e-3 * (s + 1) / 10 for s in range(10)])
    assert lrs[10] < 1e-3 and lrs[99] == pytest.approx(1e-4)
    assert lrs[54] == pytest.approx(1e-4 + 0.5 * 9e-4)  # cosine midpoint
    assert all(a > b for a, b in zip(lrs[9:], lrs[10:]))


def test_learning_rate_decays_by_max_time(corpus, tmp_path):
    """With max_time the cosine follows the clock when it runs out before the steps."""
    cfg = config(corpus, tmp_path, steps=1000, warmup=10, lr=1e-3, min_lr=1e-4, max_time=60.0)
    assert learning_rate(5, cfg, seconds=30.0) == pytest.approx(6e-4)  # warmup is by steps
    assert learning_rate(20, cfg, seconds=30.0) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert learning_rate(20, cfg, seconds=60.0) == pytest.approx(1e-4)
    assert learning_rate(1000, cfg, seconds=1.0) == pytest.approx(1e-4)  # steps ran out first


def test_learning_rate_ends_at_its_floor(corpus, tmp_path):
    """min_lr defaults to lr / 10; min_lr = lr holds the rate constant after the warmup; past
    max_time the rate stays at min_lr (the cosine does not climb again)."""
    cfg = config(corpus, tmp_path, steps=100, warmup=10, lr=1e-3)
    assert cfg.final_lr == pytest.approx(1e-4) and learning_rate(99, cfg) == pytest.approx(1e-4)
    flat = config(corpus, tmp_path, steps=100, warmup=10, lr=1e-3, min_lr=1e-3)
    assert [learning_rate(step, flat) for step in range(9, 100)] == pytest.approx([1e-3] * 91)
    timed = config(corpus, tmp_path, steps=1000, warmup=10, lr=1e-3, min_lr=1e-4, max_time=60.0)
    assert learning_rate(20, timed, seconds=90.0) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match=r"lr must be in \(0, "):
        config(corpus, tmp_path, lr=0.0)


def test_min_lr_0_decays_to_0_and_a_negative_min_lr_is_refused(corpus, tmp_path):
    """min_lr may be 0 (the rate ends at 0); below 0 it is refused."""
    cfg = config(corpus, tmp_path, steps=10, warmup=2, lr=1e-3, min_lr=0.0)
    assert cfg.final_lr == 0.0 and learning_rate(9, cfg) == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError, match=r"min_lr must be in \[0, lr=0.001\], got -0.0001"):
        config(corpus, tmp_path, lr=1e-3, min_lr=-1e-4)


def test_warmup_0_starts_at_the_peak(corpus, tmp_path):
    cfg = config(corpus, tmp_path, steps=4, warmup=0, lr=1e-3, min_lr=1e-4)
    lrs = [learning_rate(step, cfg) for step in range(4)]
    assert lrs[0] == pytest.approx(1e-3) and lrs[3] == pytest.approx(1e-4) and lrs[1] > lrs[2]
    assert learning_rate(0, config(corpus, tmp_path, steps=1, warmup=0, lr=1e-3)) == pytest.approx(1e-3)


def test_each_step_runs_at_its_learning_rate_with_its_gradient_clipped(corpus, tmp_path):
    """Optimizer step s runs at learning_rate(s) with a global gradient norm of at most
    grad_clip; grad_clip = 0 leaves the gradient as it is."""
    norms = {}
    for clip in (1e-3, 0.0):
        trainer = Trainer(config(corpus, tmp_path / str(clip), steps=3, warmup=1, grad_clip=clip, eval_every=3,
                                 eval_batches=1))
        lrs, norms[clip], step = [], [], trainer.optimizer.step

        def recording(*args, trainer=trainer, lrs=lrs, seen=norms[clip], step=step, **kwargs):
            lrs.append(trainer.optimizer.param_groups[0]["lr"])
            seen.append(float(torch.linalg.vector_norm(torch.stack(
                [torch.linalg.vector_norm(p.grad) for p in trainer.model.parameters() if p.grad is not None]))))
            return step(*args, **kwargs)

        trainer.optimizer.step = recording
        trainer.train()
        trainer.close()
        assert lrs == pytest.approx([learning_rate(s, trainer.config) for s in range(3)])
    assert max(norms[1e-3]) <= 1e-3 * (1 + 1e-5) and min(norms[0.0]) > 1e-2, norms
    # clipped to grad_clip, not below it: the mean's gradient is clipped, not the sum's over the terms
    assert norms[1e-3] == pytest.approx([1e-3] * 3, rel=1e-4), norms


def test_weight_decay_shrinks_the_matrices_alone(corpus, tmp_path):
    """--weight-decay is the matrices': a step of zero gradient (AdamW's moments stay 0)
    multiplies each matrix by 1 - lr * weight_decay and leaves the biases and norms as they
    were."""
    trainer = Trainer(config(corpus, tmp_path / "out", weight_decay=0.5, warmup=1, lr=0.1, grad_clip=0.0))
    trainer.objective = lambda network, x1, *args: (network(x1).sum() * 0.0, torch.tensor(1))
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer._optimizer_step()
    trainer.close()
    assert {p.dim() for p in before.values()} == {1, 2}
    for name, p in trainer.model.named_parameters():
        expected = before[name] * (1 - 0.1 * 0.5) if p.dim() >= 2 else before[name]
        torch.testing.assert_close(p.detach(), expected, msg=name)


def test_a_run_that_is_all_warmup_is_warned_of(corpus, tmp_path):
    """The default warmup (100) with --steps 50: the rate rose to half its peak and stopped
    there, never decaying, without a word."""
    for steps, warned in ((4, True), (5, False)):
        lines = []
        Trainer(config(corpus, tmp_path / str(steps), steps=steps, warmup=4), log=lines.append).close()
        assert any("warning: warmup=4 >= steps=4: the learning rate rises through the whole run" in line
                   for line in lines) == warned, lines


def test_the_warmup_warning_names_settings_from_the_api_and_flags_from_ddpd_train(corpus, tmp_path, capsys):
    """It said "(give --warmup below --steps)" to a user of the Python API, and "warmup 1 >=
    steps 1 ... min_lr" to one of ddpd-train: each now reads in its own words."""
    lines = []
    Trainer(config(corpus, tmp_path / "api", steps=4, warmup=4), log=lines.append).close()
    assert [line for line in lines if line.startswith("warning")] == [
        "warning: warmup=4 >= steps=4: the learning rate rises through the whole run and never decays to min_lr "
        "(give warmup=N below steps=4)"], lines
    code, out, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "cli", *TINY_CLI,
                             "--steps", 1, "--no-progress")
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("warning")] == [
        "warning: --warmup 1 >= --steps 1: the learning rate rises through the whole run and never decays to "
        "--min-lr (give --warmup N below --steps 1)"], out


def test_a_run_cut_by_the_clock_within_its_warmup_is_warned_of(corpus, tmp_path, monkeypatch):
    """--max-time 0.5 with the default warmup (100) stopped at step 53 at half the peak rate,
    which never decayed, without a word: the warmup goes by steps, not by the clock."""
    clock = iter(range(10_000))  # a step takes one second
    monkeypatch.setattr("ddpd.training.trainer.time.perf_counter", lambda: float(next(clock)))
    for warmup, warned in ((4, True), (3, False)):
        lines = []
        trainer = Trainer(config(corpus, tmp_path / str(warmup), steps=20, warmup=warmup, max_time=3.0),
                          log=lines.append)
        trainer.train()
        trainer.close()
        assert trainer.step == 3
        assert any("warning: max_time ran out at step 3, within the warmup" in line for line in lines) == warned, lines
        assert any(f"within the warmup of {warmup} steps: the learning rate rose" in line for line in lines) == warned


def test_a_run_cut_by_the_clock_as_its_warmup_ends_is_not_warned_of(corpus, tmp_path, monkeypatch):
    """Cut at step 3 of a warmup of 3 steps, the run reached its peak rate and the clock's decay
    had begun: no warning that the rate never decayed."""
    clock = iter(range(10_000))  # a step takes one second
    monkeypatch.setattr("ddpd.training.trainer.time.perf_counter", lambda: float(next(clock)))
    lines = []
    with Trainer(config(corpus, tmp_path, steps=20, warmup=3, max_time=3.0), log=lines.append) as trainer:
        trainer.train()
    assert trainer.step == 3
    assert [line for line in lines if line.startswith(("stopped", "warning"))] == [
        "stopped by max_time (3 s of training) at step 3 of 20"], lines


def test_a_run_whose_clock_runs_out_at_its_last_step_is_not_stopped_by_it(corpus, tmp_path, monkeypatch):
    """The clock ran out as the last step ended: the run completed its steps, so the log does
    not say max_time stopped it."""
    clock = iter(range(10_000))  # a step takes one second
    monkeypatch.setattr("ddpd.training.trainer.time.perf_counter", lambda: float(next(clock)))
    lines = []
    with Trainer(config(corpus, tmp_path, steps=3, warmup=1, max_time=3.0, eval_every=3), log=lines.append) as trainer:
        trainer.train()
    assert trainer.step == 3 and trainer.out_of_time
    assert not [line for line in lines if line.startswith(("stopped", "warning"))], lines


def test_the_clock_s_stop_names_settings_from_the_api_and_flags_from_ddpd_train(corpus, tmp_path, capsys,
                                                                               monkeypatch):
    """A run --max-time cut within its warmup said "stopped by max_time" and "max_time ran out ...
    min_lr" in ddpd-train's log, and "(give --warmup below the steps --max-time allows)" to a user
    of the Python API: each now reads in its own words."""
    clock = iter(range(10_000))  # a step takes one second
    monkeypatch.setattr("ddpd.training.trainer.time.perf_counter", lambda: float(next(clock)))
    lines = []
    with Trainer(config(corpus, tmp_path / "api", steps=20, warmup=4, max_time=3.0), log=lines.append) as trainer:
        trainer.train()
    code, out, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "cli", *TINY_CLI,
                             "--steps", 20, "--warmup", 4, "--max-time", 3, "--no-progress")
    assert code == 0, err
    said = "ran out at step 3, within the warmup of 4 steps: the learning rate rose through the whole run and never " \
           "decayed to"
    assert [line for line in lines if line.startswith(("stopped", "warning"))] == [
        "stopped by max_time (3 s of training) at step 3 of 20",
        f"warning: max_time {said} min_lr (give warmup=N below the steps max_time allows)"], lines
    assert [line for line in out.splitlines() if line.startswith(("stopped", "warning"))] == [
        "stopped by --max-time (3 s of training) at step 3 of 20",
        f"warning: --max-time {said} --min-lr (give --warmup N below the steps --max-time allows)"], out


def test_warnings_reach_a_user_of_the_silent_default(corpus, tmp_path, capsys):
    """With log=None and no progress bar the Trainer prints no log lines, and its warnings
    about the settings were lost with them: they come as Python warnings."""
    with pytest.warns(UserWarning, match=r"^warmup=4 >= steps=4: the learning rate rises through the whole run"):
        Trainer(config(corpus, tmp_path, steps=4, warmup=4)).close()
    assert capsys.readouterr() == ("", "")


def test_warnings_go_above_the_progress_bar_when_one_is_drawn(corpus, tmp_path, capsys, recwarn):
    """With a progress bar and log=None the warnings are log lines above the bar, as every
    other line of the run, not Python warnings."""
    Trainer(config(corpus, tmp_path, steps=4, warmup=4), progress=True).close()
    assert "warning: warmup=4 >= steps=4: the learning rate rises through the whole run" in capsys.readouterr().out
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


def test_the_last_record_of_a_run_cut_by_the_clock_is_saved(corpus, tmp_path, monkeypatch):
    """Stopped by max_time at a save step between two records: the step was saved, then
    recorded, and the record never reached the checkpoint (ddpd-eval training read the
    step-0 loss as the final one)."""
    clock = iter(range(10_000))  # a step takes one second
    monkeypatch.setattr("ddpd.training.trainer.time.perf_counter", lambda: float(next(clock)))
    trainer = Trainer(config(corpus, tmp_path / "out", steps=20, max_time=5.0, eval_every=7, save_every=5))
    history = trainer.train()
    assert trainer.step == 5 and [h["step"] for h in history] == [0, 5]
    _, meta = load_train_state(tmp_path / "out")
    assert meta["history"] == json.loads(json.dumps(history)) and meta["pending_losses"] == meta["pending_terms"] == []


def test_a_run_cut_by_the_clock_after_steps_without_a_term_records_its_last_step(corpus, tmp_path, monkeypatch):
    """Steps without a loss term since the last record left nothing pending: the clock's
    last record was skipped, and the checkpoint of step 4 ended its history at step 3."""
    clock = iter(range(10_000))  # a step takes one second
    monkeypatch.setattr("ddpd.training.trainer.time.perf_counter", lambda: float(next(clock)))
    trainer = Trainer(config(corpus, tmp_path / "out", "mask-denoiser", steps=20, max_time=4.0, eval_every=3))
    objective = trainer.objective

    def empty_after_step_3(network, *args):
        if network.training and trainer.step >= 3:
            return network(args[0], torch.zeros(args[0].shape[0])).sum() * 0.0, torch.tensor(0)
        return objective(network, *args)

    trainer.objective = empty_after_step_3
    history = trainer.train()
    assert trainer.step == 4 and [h["step"] for h in history] == [0, 3, 4] and history[-1]["train_loss"] is None
    assert load_train_state(tmp_path / "out")[1]["history"][-1]["step"] == 4


def test_a_step_without_a_term_is_no_loss_of_0(corpus, tmp_path):
    """A step where nothing was corrupted (tiny batches) counted as a loss of 0 in the
    recorded training loss."""
    trainer = Trainer(config(corpus, tmp_path / "out", "mask-denoiser", steps=4, eval_every=4))
    objective, losses = trainer.objective, []

    def every_other_empty(network, *args):
        if not network.training:
            return objective(network, *args)
        if trainer.step % 2:
            return network(args[0], torch.zeros(args[0].shape[0])).sum() * 0.0, torch.tensor(0)
        loss_sum, count = objective(network, *args)
        losses.append((loss_sum.item(), float(count)))
        return loss_sum, count

    trainer.objective = every_other_empty
    history = trainer.train()
    pooled = sum(total for total, _ in losses) / sum(count for _, count in losses)
    assert len(losses) == 2 and history[-1]["train_loss"] == pytest.approx(pooled, rel=1e-6)


def test_the_train_loss_pools_the_terms_of_its_steps(corpus, tmp_path):
    """A denoiser's recorded training loss was the mean of its steps' ratios, while the
    validation loss pools its batches: with small batches a step of few corrupted positions
    weighed as much as one of many, and the training loss read below the validation loss."""
    trainer = Trainer(config(corpus, tmp_path / "out", "mask-denoiser", batch_size=2, steps=6, eval_every=6))
    objective, steps = trainer.objective, []

    def recorded(network, *args):
        loss_sum, count = objective(network, *args)
        if network.training:
            steps.append((loss_sum.item(), float(count)))
        return loss_sum, count

    trainer.objective = recorded
    history = trainer.train()
    pooled = sum(total for total, _ in steps) / sum(count for _, count in steps)
    assert len({count for _, count in steps}) > 1 and sum(t / n for t, n in steps) / 6 != pytest.approx(pooled)
    assert history[-1]["train_loss"] == pytest.approx(pooled, rel=1e-6)


def test_a_run_records_and_saves_at_its_end_and_stops_at_its_steps(corpus, tmp_path):
    """The last step is recorded and saved whether or not eval_every and save_every divide the
    steps; train(stop_at) saves at stop_at; a stop_at beyond the steps ends at the steps; the
    untrained baseline is recorded once; the token count holds every micro-batch."""
    out = tmp_path / "out"
    trainer = Trainer(config(corpus, out, steps=5, eval_every=3, save_every=4, grad_accum=2))
    trainer.train(stop_at=0)
    trainer.train(stop_at=2)
    assert load_train_state(out)[1]["step"] == 2
    trainer.train(stop_at=50)
    assert trainer.step == 5 and [h["step"] for h in trainer.history] == [0, 3, 5]
    assert load_train_state(out)[1]["step"] == 5
    assert trainer.train_tokens == 5 * TINY["batch_size"] * 2 * TINY["seq_len"]
    trainer.close()


def test_max_time_stops_and_checkpoints(corpus, tmp_path, monkeypatch):
    clock = iter(range(10_000))  # every perf_counter call advances one second: a step takes one
    monkeypatch.setattr("ddpd.training.trainer.time.perf_counter", lambda: float(next(clock)))
    # warmup 2: a run the clock stops within its warmup warns, which is not what this test is about
    trainer = Trainer(config(corpus, tmp_path / "out", steps=20, max_time=3.0, eval_every=10, warmup=2))
    history = trainer.train()
    assert trainer.step == 3 and [h["step"] for h in history] == [0, 3]
    _, saved = load_model(tmp_path / "out")
    assert saved["step"] == 3
    trainer.close()
    resumed = Trainer(config(corpus, tmp_path / "out", steps=20, max_time=3.0, eval_every=10, warmup=2), resume=True)
    assert resumed.train_seconds == 3.0 and resumed.train() == history  # the clock is already spent


def test_under_max_time_each_step_runs_at_the_rate_of_the_clock(corpus, tmp_path, monkeypatch):
    """The cosine follows the clock in the loop too: cut at 4 s of 100 steps, the fourth step
    ran at the rate of 3 s of 4, far below the rate of step 3 of 100."""
    clock = iter(range(10_000))  # a step takes one second
    monkeypatch.setattr("ddpd.training.trainer.time.perf_counter", lambda: float(next(clock)))
    cfg = config(corpus, tmp_path, steps=100, warmup=1, lr=1e-3, min_lr=1e-4, max_time=4.0, eval_every=100,
                 save_every=100)
    with Trainer(cfg) as trainer:
        trainer.train()
        assert trainer.step == 4
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(learning_rate(3, cfg, seconds=3.0))
    assert learning_rate(3, cfg, seconds=3.0) < 0.5 * learning_rate(3, cfg)


def test_a_resumed_run_counts_the_tokens_and_throughput_of_the_steps_before_it(corpus, tmp_path, monkeypatch):
    """The token count goes on where the run stopped, as the clock does: the throughput a
    resumed run records is that of the whole run, not of its steps since the resume."""
    clock = iter(range(10_000))  # a step takes one second
    monkeypatch.setattr("ddpd.training.trainer.time.perf_counter", lambda: float(next(clock)))
    out, per_step = tmp_path / "p", TINY["batch_size"] * TINY["seq_len"]
    with Trainer(config(corpus, out, steps=4, save_every=2, eval_every=4)) as trainer:
        trainer.train(stop_at=2)
    assert load_train_state(out)[1]["train_tokens"] == 2 * per_step
    with Trainer(config(corpus, out, steps=4, save_every=2, eval_every=4), resume=True) as resumed:
        assert (resumed.train_tokens, resumed.train_seconds) == (2 * per_step, 2.0)
        history = resumed.train()
    assert resumed.train_tokens == 4 * per_step and history[-1]["tokens_per_s"] == per_step


@pytest.mark.parametrize("changes, message", [
    ({"kind": "gan"}, "kind must be one of"), ({"steps": 0}, "steps must be >= 1"),
    ({"lr": -1.0}, r"lr must be in \(0, 3.40282e\+37\]"), ({"lr": float("inf")}, "lr must be in"),
    ({"lr": 1e38}, "lr must be in"),  # AdamW's float32 step overflowed: a traceback
    ({"grad_clip": float("nan")}, "grad_clip must be finite and >= 0"),
    ({"weight_decay": float("inf")}, "weight_decay must be finite and >= 0"),
    ({"seed": 2**64}, r"seed must be in \[0, 9223372036854775807\]"), ({"ema": 1.0}, r"ema must be in \[0.0, 1.0\)"),
    ({"tiktoken": "x.tiktoken"}, "needs tokenizer='gpt2'"), ({"schedule": "square"}, "schedule must be one of"),
    ({"batch_size": 2.5}, "batch_size must be an int"), ({"min_lr": 1.0}, "min_lr must be in"),
    ({"max_time": 0.0}, "max_time must be a finite number of seconds > 0"),
    ({"max_time": float("inf")}, "max_time must be a finite number of seconds > 0, got inf"),  # not JSON
    ({"batch_size": 10**9}, "batch_size 1000000000: a micro-batch of 1000000000 x 32 tokens needs at least 4,053 GiB")])
def test_config_validation(corpus, tmp_path, changes, message):
    with pytest.raises((TypeError, ValueError), match=message):
        config(corpus, tmp_path, **changes)


def test_paths_may_be_path_objects(corpus, tmp_path):
    """data=Path(...) was refused as no path string."""
    cfg = TrainConfig(kind="planner", data=pathlib.Path(corpus), out=tmp_path / "p", **TINY)
    assert (cfg.data, cfg.out) == (config(corpus, tmp_path / "p").data, str(tmp_path / "p"))
    with pytest.raises(TypeError, match="out must be a non-empty path, got 3"):
        TrainConfig(kind="planner", data=corpus, out=3, **TINY)


def test_a_schedule_object_is_refused_before_training(corpus, tmp_path):
    """A Schedule object was accepted, trained the whole run, then failed at the first save
    (config.json records the schedule's name), writing nothing."""
    from ddpd.process import LinearSchedule

    with pytest.raises(TypeError, match=r"schedule must be a schedule's name \('linear', 'cosine'\), got "
                                        "LinearSchedule"):
        config(corpus, tmp_path / "p", schedule=LinearSchedule())
    assert not os.path.exists(tmp_path / "p")


@pytest.mark.parametrize("name, value", [("lr", "3e-4"), ("dropout", "0.1"), ("min_lr", "1e-5"),
                                         ("max_time", "60"), ("weight_decay", None), ("lr", True),
                                         ("max_time", True)])
def test_a_setting_that_is_not_a_number_is_refused_naming_it(corpus, tmp_path, name, value):
    """A str (YAML reads 3e-4 as one) met the range checks as a bare TypeError naming no
    setting; a bool passed as 1 (lr 1, a max_time of one second)."""
    with pytest.raises(TypeError, match=f"^{name} must be a number, got "):
        config(corpus, tmp_path / "p", **{name: value})


def test_numpy_numbers_are_recorded_as_json_numbers(corpus, tmp_path):
    """A numpy float32 lr passed every check, trained the whole run, then failed at its
    first save: config.json could not hold it."""
    import numpy as np

    cfg = config(corpus, tmp_path / "p", lr=np.float32(1e-3), max_time=np.float32(60.0))
    assert (type(cfg.lr), type(cfg.max_time)) == (float, float)
    json.dumps(cfg.to_dict())


INT_SETTINGS = ("steps", "batch_size", "seq_len", "d_model", "n_layers", "n_heads", "grad_accum", "eval_every",
                "eval_batches", "save_every", "warmup", "seed", "num_classes")


def test_numpy_integers_are_taken_and_recorded_as_ints(corpus, tmp_path):
    """A numpy integer setting (a step count computed with numpy) was refused as not an int;
    taken, it is kept as an int, which config.json holds and which equals the int-built config."""
    import numpy as np

    plain = config(corpus, tmp_path / "p")
    cfg = config(corpus, tmp_path / "p", **{name: np.int64(getattr(plain, name)) for name in INT_SETTINGS})
    assert [type(getattr(cfg, name)) for name in INT_SETTINGS] == [int] * len(INT_SETTINGS)
    assert cfg == plain and json.loads(json.dumps(cfg.to_dict())) == plain.to_dict()
    for value, given in ((True, "bool True"), (8.0, "float 8.0"), (np.float64(8), "float64")):
        with pytest.raises(TypeError, match=f"^steps must be an int, got {given}"):
            config(corpus, tmp_path / "p", steps=value)


def test_a_torch_device_is_recorded_by_its_name(corpus, tmp_path):
    """A torch.device, which every other device argument takes, trained the whole run, then
    failed at its first save: config.json could not hold it."""
    cfg = config(corpus, tmp_path / "p", device=torch.device("cpu"))
    assert cfg.device == "cpu"
    json.dumps(cfg.to_dict())


def test_an_evaluation_runs_without_dropout(corpus, tmp_path):
    """evaluate() scores the weights with dropout off, even those of a network in training
    mode: two evaluations of the same weights agree."""
    with Trainer(config(corpus, tmp_path, dropout=0.5)) as trainer:
        assert trainer.model.training and trainer.evaluate() == trainer.evaluate()


def test_a_validation_set_without_a_term_has_no_loss(corpus, tmp_path):
    """A denoiser's validation noise that corrupts no position (a tiny set: 1 seed in 17 at
    16 characters) gave a validation loss of 0, logged and recorded as such."""
    lines = []
    with Trainer(config(corpus, tmp_path / "p", kind="mask-denoiser", steps=2, eval_every=1),
                 log=lines.append) as trainer:
        objective = trainer.objective

        def no_validation_term(model, batch, generator, labels, *training):  # training passes label_dropout
            return objective(model, batch, generator, labels, *training) if training else (torch.zeros(()), 0)

        trainer.objective = no_validation_term
        history = trainer.train()
    assert [h["val_loss"] for h in history] == [None, None, None]
    assert all(line.split("val loss")[1].startswith("      -") for line in lines if line.startswith("step")), lines


class Spy(torch.nn.Module):
    """Records what the objective feeds a network and returns zero logits."""

    def __init__(self, out_dim):
        super().__init__()
        self.out_dim, self.calls = out_dim, []

    def forward(self, x, t=None):
        self.calls.append((x, t))
        shape = x.shape if self.out_dim == 1 else (*x.shape, self.out_dim)
        return torch.zeros(shape, requires_grad=True)


def test_times_are_uniform_and_each_validation_batch_draws_its_own(corpus, tmp_path, monkeypatch):
    """t ~ U(0, 1) per sequence (thm:training_objective); the validation batches draw their own
    times (one noise stream per batch, not one stream restarted for each); evaluate() leaves
    the network in the mode it found it in."""
    import ddpd.training.trainer as trainer_module

    times = []
    monkeypatch.setattr(trainer_module, "corrupt", lambda x1, t, *a, **k: (times.append(t), corrupt(x1, t, *a, **k))[1])
    trainer = Trainer(config(corpus, tmp_path / "out", "mask-denoiser", eval_batches=3))
    x1 = torch.randint(0, 27, (4000, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trainer.objective(trainer.model, x1, torch.Generator().manual_seed(1))
    t = times.pop()
    assert 0 <= float(t.min()) and float(t.max()) < 1 and t.shape == (4000,)
    # 4000 draws: the mean's standard deviation is 0.0046, a decile's count's 19
    assert abs(float(t.mean()) - 0.5) < 0.02 and abs(int((t > 0.9).sum()) - 400) < 80
    for training in (True, False):
        trainer.model.train(training)
        trainer.evaluate()
        assert trainer.model.training == training
    assert len(times) == 6 and not torch.equal(times[0], times[1]) and not torch.equal(times[1], times[2])
    trainer.close()


@pytest.mark.parametrize("kind", KINDS)
def test_objective_feeds_the_right_noise(corpus, tmp_path, kind):
    trainer = Trainer(config(corpus, tmp_path / kind, kind))
    x1 = next(trainer.train_batches)
    spy = Spy(1 if kind == "planner" else 27)
    loss_sum, count = trainer.objective(spy, x1, torch.Generator().manual_seed(0))
    loss = loss_sum / count
    (x, t), = spy.calls
    if kind == "ar":
        assert t is None and torch.equal(x[:, 0], torch.full((16,), 27)) and torch.equal(x[:, 1:], x1)
        assert loss.item() == pytest.approx(math.log(27)) and count == x1.numel()
        return
    changed = x != x1
    if kind == "mask-denoiser":
        assert torch.equal(x[changed], torch.full_like(x[changed], 27))  # masks only
    else:
        assert int(x.max()) < 27 and changed.any()  # uniform noise, within the vocabulary
    assert (t is None) == (kind == "planner")
    if t is not None:
        assert t.shape == (16,) and float(t.min()) >= 0 and float(t.max()) < 1
    expected = math.log(2) if kind == "planner" else math.log(27)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    if kind == "mask-denoiser":  # the loss's terms: the corrupted positions
        assert count == changed.sum()
    elif kind == "uniform-denoiser":  # a uniform draw may give back the clean token
        assert changed.sum() <= count < x1.numel()
    else:
        assert count == x1.numel()


class FixedLogits(torch.nn.Module):
    """Returns the same logits whatever it is fed: the loss then depends on the targets alone."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, x, t=None):
        return self.logits.clone().requires_grad_()


@pytest.mark.parametrize("kind", ["planner", "mask-denoiser", "uniform-denoiser", "uniform"])
def test_objective_scores_each_kind_against_its_own_targets(corpus, tmp_path, monkeypatch, kind):
    """thm:training_objective: the planner's BCE targets are z_t (not x_t != x1, which misses a
    uniform draw that gave back the clean token), the denoisers' CE targets are x1 at z_t = N,
    the uniform model's x1 everywhere. Zero logits score every target alike (log 2, log V): with
    fixed random ones the value is worked out here from the corruption the objective drew."""
    import ddpd.training.trainer as trainer_module

    drawn = []
    monkeypatch.setattr(trainer_module, "corrupt", lambda *a, **k: drawn.append(corrupt(*a, **k)) or drawn[-1])
    trainer = Trainer(config(corpus, tmp_path / kind, kind))
    x1 = next(trainer.train_batches)
    shape = x1.shape if kind == "planner" else (*x1.shape, 27)
    logits = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    loss_sum, count = trainer.objective(FixedLogits(logits), x1, torch.Generator().manual_seed(0))
    trainer.close()
    (x_t, z_t), = drawn
    if kind == "planner":  # -log sigmoid(l) where noise, -log(1 - sigmoid(l)) where clean
        per_position, where = torch.where(z_t, F.softplus(-logits), F.softplus(logits)), torch.ones_like(z_t)
    else:  # -log softmax(l)[x1]
        per_position = torch.logsumexp(logits, -1) - logits.gather(-1, x1[..., None])[..., 0]
        where = torch.ones_like(z_t) if kind == "uniform" else z_t
    if kind != "mask-denoiser":  # the case that tells z_t from x_t != x1 is there
        assert (z_t & (x_t == x1)).any()
    assert float(count) == int(where.sum())
    assert loss_sum.item() == pytest.approx(float(per_position[where].sum()), rel=1e-5)


def test_the_denoiser_is_told_the_time_its_input_was_corrupted_at(corpus, tmp_path):
    """The t fed to the network is the t of the corruption: under the linear schedule a row is
    masked at a fraction 1 - t of its positions (alpha_t = t), up to the binomial spread."""
    trainer = Trainer(config(corpus, tmp_path / "out", "mask-denoiser"))
    x1 = torch.randint(0, 27, (2000, 64), generator=torch.Generator().manual_seed(0))
    spy = Spy(27)
    trainer.objective(spy, x1, torch.Generator().manual_seed(1))
    trainer.close()
    (x_t, t), = spy.calls
    masked = (x_t == 27).float().mean(-1)
    # each row's fraction has a standard deviation of at most 1/16; the mean gap is about 0.05
    # (0.5 were the corruption drawn at 1 - t)
    assert float((masked - (1 - t)).abs().mean()) < 0.08


def test_training_crops_the_first_90_percent_and_validation_the_next_5(corpus, tmp_path):
    """The corpus is split by position, 90/5/5: training batches are cut from its first 90% of
    characters (a text8 token is one), the validation batches from the next 5%; the last 5% is
    the test split, which the loop never reads."""
    trainer = Trainer(config(corpus, tmp_path / "out", eval_batches=4))
    text = pathlib.Path(corpus).read_text()
    n = len(text)
    train, validation = text[:n * 90 // 100], text[n * 90 // 100:n * 95 // 100]
    rows = [row for _ in range(4) for row in next(trainer.train_batches)]
    held = [row for batch in trainer.eval_set for row in batch]
    trainer.close()
    assert len(held) == 4 * TINY["batch_size"]
    assert [i for i, row in enumerate(rows) if trainer.tokenizer.decode(row) not in train] == []
    assert [i for i, row in enumerate(held) if trainer.tokenizer.decode(row) not in validation] == []


def test_a_diverged_run_says_what_it_kept(corpus, tmp_path, capsys):
    """A NaN loss in a fresh run said "(the last checkpoint is intact)" of a checkpoint never
    written; a NaN validation loss (finite weights) failed in the save with a JSON message."""
    trainer = Trainer(config(corpus, tmp_path / "fresh", steps=4))
    objective = trainer.objective  # NaN in training only: the step-0 evaluation stays finite
    trainer.objective = lambda network, *args: ((torch.tensor(float("nan"), requires_grad=True), torch.tensor(1))
                                                if network.training else objective(network, *args))
    with pytest.raises(FloatingPointError, match=r"training loss is nan at step 1; lower the learning rate "
                                                 r"\(no checkpoint was written\)"):
        trainer.train()
    trainer = Trainer(config(corpus, tmp_path / "val", steps=4, eval_every=2, save_every=2))
    evaluate = trainer.evaluate
    trainer.evaluate = lambda: evaluate() if trainer.step < 4 else float("nan")
    with pytest.raises(FloatingPointError, match=r"validation loss is nan at step 4; .*\(the last checkpoint, of "
                                                 r"step 2, is intact\)"):
        trainer.train()
    assert load_train_state(tmp_path / "val")[1]["step"] == 2


def test_resume_names_a_training_section_that_is_not_an_object(corpus, tmp_path, capsys):
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    config_path = out / "config.json"
    for edited in ([1, 2], 5, "x"):
        stored = {**json.loads(config_path.read_text()), "training": edited}
        stored["settings_sha256"] = ckpt.settings_digest(stored)  # edited with care: the digest passes
        config_path.write_text(json.dumps(stored))
        code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
        assert code == 1 and err.count("\n") == 1, err  # raw "'int' object is not iterable" before
        assert f"checkpoint {out}: config.json's training is {edited!r}, not an object" in err, err


def _flip_a_bit(value):
    """`value` with one bit of its JSON text flipped (the last character's lowest)."""
    text = json.dumps(value)
    return json.loads(text[:-1] + chr(ord(text[-1]) ^ 1))


@pytest.mark.parametrize("edit", [
    lambda c: c["training"].update(seq_len=_flip_a_bit(c["training"]["seq_len"])),  # 32 -> 33
    lambda c: c["training"].update(lr=_flip_a_bit(c["training"]["lr"])),  # 0.003 -> 0.002
    lambda c: c["training"].update(steps=_flip_a_bit(c["training"]["steps"])),  # 20 -> 21
    lambda c: c.update(corpus=None),  # skipped the corpus check
    lambda c: c.update(schedule="cosine"),
], ids=["seq_len", "lr", "steps", "corpus", "schedule"])
def test_resume_refuses_a_config_whose_settings_were_changed(corpus, tmp_path, capsys, edit):
    """--resume takes the run's settings from config.json, which no digest covered: a one-bit
    change of seq_len, lr or steps was resumed as if it were the run's own."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    path = out / "config.json"
    stored = json.loads(path.read_text())
    edit(stored)
    path.write_text(json.dumps(stored, indent=2))
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 1 and err == (f"ddpd-train: error: checkpoint {out}: config.json's settings differ from their "
                                 "settings_sha256 (edited or corrupt); a resume would not continue the same run\n")
    settings = {**stored["training"], "out": str(out)}
    with pytest.raises(CheckpointError, match="config.json's settings differ from their settings_sha256"):
        Trainer(TrainConfig.from_dict(settings), resume=True)
    assert load_train_state(out)[1]["step"] == 2  # nothing trained, nothing written


def test_resume_names_the_digest_not_a_flag_when_an_edited_setting_is_invalid(corpus, tmp_path, capsys):
    """The settings --resume takes are checked against their digest before they are used: an
    edited seq_len of 0 was a usage error naming --seq-len, which the command did not give."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    stored = json.loads((out / "config.json").read_text())
    stored["training"]["seq_len"] = 0
    (out / "config.json").write_text(json.dumps(stored))
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 1 and "config.json's settings differ from their settings_sha256" in err, err


def test_a_load_refuses_an_edited_n_heads_that_fits_the_weights(corpus, tmp_path, capsys):
    """Only the weights were checked against config.json: n_heads 1 for 2 fits the same
    weights, loaded for ddpd-sample and computed another attention."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    stored = json.loads((out / "config.json").read_text())
    stored["model"]["n_heads"] = 1
    (out / "config.json").write_text(json.dumps(stored))
    with pytest.raises(CheckpointError, match=f"checkpoint {out}: config.json's settings differ from their "
                                              r"settings_sha256 \(edited or corrupt\)"):
        load_model(out)


def test_resume_refuses_a_config_that_records_no_digest_of_its_settings(corpus, tmp_path):
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    stored = json.loads((out / "config.json").read_text())
    del stored["settings_sha256"]
    (out / "config.json").write_text(json.dumps(stored))
    with pytest.raises(CheckpointError, match="records no settings_sha256, so the settings a resume takes"):
        Trainer(config(corpus, out, steps=20, save_every=2), resume=True)


def test_resume_of_a_bundles_checkpoint_says_it_holds_no_training_state(corpus, tmp_path, capsys):
    """A sampling bundle's planner (weights and config only, as ddpd.pretrained writes them)
    given to --resume was refused for its missing settings_sha256, "written by an older ddpd?"."""
    from ddpd.pretrained import install_bundle

    _checkpoint_at_step_2(corpus, tmp_path / "p")
    _checkpoint_at_step_2(corpus, tmp_path / "d", kind="mask-denoiser")
    install_bundle(str(tmp_path / "p"), str(tmp_path / "d"), str(tmp_path / "bundle"))
    out = tmp_path / "bundle" / "planner"
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 1 and err == (f"ddpd-train: error: cannot resume {out}: it holds a model's weights but no "
                                 "training state (train_state.json), so there is no run to continue\n"), err


def test_a_config_rewritten_with_the_same_settings_still_resumes(corpus, tmp_path):
    """The digest is of the settings, not of config.json's text: its layout may change."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    stored = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(reversed(list(stored.items())))))
    with Trainer(config(corpus, out, steps=20, save_every=2), resume=True) as trainer:
        assert trainer.step == 2


def test_weights_that_are_not_finite_are_never_saved(corpus, tmp_path):
    """A step with a finite loss can end in NaN weights (an update from a NaN moment of the
    optimizer): the save refuses them and the last good checkpoint stays as it was."""
    trainer = Trainer(config(corpus, tmp_path / "out", steps=4))
    trainer.train()
    good = (tmp_path / "out" / "model.safetensors").read_bytes()
    with torch.no_grad():
        next(trainer.model.parameters())[0].fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="the weights are not finite after step 4; .* .the last checkpoint, "
                                                 "of step 4, is intact"):
        trainer.save()
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == good
    load_model(tmp_path / "out")


@pytest.mark.parametrize("kind", KINDS)
def test_training_reduces_validation_loss(corpus, tmp_path, kind):
    """20 steps of a 1-layer d_model=32 model must cut the validation loss by 5% or more."""
    trainer = Trainer(config(corpus, tmp_path / "out", kind))
    before = trainer.evaluate()
    history = trainer.train()
    after = history[-1]["val_loss"]
    assert math.isfinite(after) and after < 0.95 * before, (before, after)
    assert [h["step"] for h in history] == [0, 20] and history[0]["val_loss"] == before
    model, saved = load_model(tmp_path / "out")
    assert saved["kind"] == kind and saved["step"] == 20 and saved["tokenizer"] == {"name": "text8"}


RESUME = dict(kind="mask-denoiser", steps=8, batch_size=8, dropout=0.1, ema=0.9, grad_accum=2, warmup=2,
              eval_every=4, eval_batches=2, save_every=3, seed=5)


def losses(history):
    """What a resumed run's history must repeat exactly (its throughput is a time)."""
    return [(h["step"], h["train_loss"], h["val_loss"]) for h in history]


def assert_same_checkpoints(a, b):
    assert open(os.path.join(a, "model.safetensors"), "rb").read() == \
        open(os.path.join(b, "model.safetensors"), "rb").read()
    state_a, meta_a = load_train_state(a)
    state_b, meta_b = load_train_state(b)
    assert state_a.keys() == state_b.keys()
    assert [k for k in state_a if not torch.equal(state_a[k], state_b[k])] == []
    assert meta_a["step"] == meta_b["step"]
    assert losses(meta_a["history"]) == losses(meta_b["history"])  # train losses averaged over the whole run


@pytest.fixture(scope="module")
def full_run(corpus, tmp_path_factory):
    """An uninterrupted 8-step run (dropout, EMA, gradient accumulation) to compare with."""
    full = Trainer(config(corpus, tmp_path_factory.mktemp("resume") / "full", **RESUME))
    full.train()
    return full


def test_killed_run_resumes_bitwise(corpus, tmp_path, full_run):
    full = full_run
    part = Trainer(config(corpus, tmp_path / "part", **RESUME))
    part.train(stop_at=3)  # checkpoint at step 3 ...
    part._optimizer_step()  # ... then two more steps, lost when the process is killed
    part._optimizer_step()
    part.close()
    resumed = Trainer(config(corpus, tmp_path / "part", **RESUME), resume=True)
    assert resumed.step == 3
    resumed.train()
    assert_same_checkpoints(full.config.out, tmp_path / "part")
    sa, sb = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert losses(resumed.history) == losses(full.history)  # step 3 is between two records (eval_every 4)

    # the comparison has teeth: a resume that loses the dropout RNG state diverges
    Trainer(config(corpus, tmp_path / "lost", **RESUME)).train(stop_at=3)
    lost = Trainer(config(corpus, tmp_path / "lost", **RESUME), resume=True)
    torch.manual_seed(1234)
    lost.train()
    assert not torch.equal(lost.model.backbone.embed.weight, full.model.backbone.embed.weight)


@pytest.mark.integration
def test_resume_in_a_fresh_process(corpus, tmp_path, full_run):
    """Steps 1-3 here, steps 4-8 by `ddpd-train --resume` in a new process."""
    Trainer(config(corpus, tmp_path / "part", **RESUME)).train(stop_at=3)
    result = subprocess.run([sys.executable, "-m", "ddpd.cli.train", "mask-denoiser", "--out",
                             str(tmp_path / "part"), "--resume", "--no-progress"], capture_output=True, text=True,
                            env=ONE_THREAD_ENV)
    assert result.returncode == 0, result.stderr
    assert "step 3 of 8" in result.stdout
    assert_same_checkpoints(full_run.config.out, tmp_path / "part")


def test_ema_weights_keep_the_decay_of_the_previous_average(corpus, tmp_path):
    """ema = 0.9: after a step the exported weights are 0.9 * the previous ones + 0.1 * the
    trained ones."""
    trainer = Trainer(config(corpus, tmp_path / "out", ema=0.9))
    before = {k: v.clone() for k, v in trainer.exported.state_dict().items()}
    trainer._optimizer_step()
    trained, exported = trainer.model.state_dict(), trainer.exported.state_dict()
    changed = [k for k in before if not torch.equal(before[k], trained[k])]
    assert changed
    for k in changed:
        torch.testing.assert_close(exported[k], 0.9 * before[k] + 0.1 * trained[k])
    trainer.close()


def test_the_validation_loss_is_the_ema_weights(corpus, tmp_path):
    """With EMA, evaluate() scores the exported weights: an EMA copy whose head gives zero
    logits scores log V at every corrupted position, whatever the raw weights give."""
    trainer = Trainer(config(corpus, tmp_path / "out", "mask-denoiser", ema=0.5, eval_batches=2))
    with torch.no_grad():
        for p in trainer.ema.head.parameters():
            p.zero_()
    assert trainer.evaluate() == pytest.approx(math.log(27), rel=1e-5)
    trainer.ema = None  # the raw weights score otherwise
    assert trainer.evaluate() != pytest.approx(math.log(27), rel=1e-3)
    trainer.close()


def test_ema_checkpoint_exports_ema_weights(corpus, tmp_path):
    trainer = Trainer(config(corpus, tmp_path / "out", steps=5, ema=0.5, save_every=5))
    trainer.train()
    exported = load_file(tmp_path / "out" / "model.safetensors")
    assert all(torch.equal(exported[k], v) for k, v in trainer.ema.state_dict().items())
    raw = load_train_state(tmp_path / "out")[0]
    assert all(torch.equal(raw[f"model.{k}"], v) for k, v in trainer.model.state_dict().items())
    assert not torch.equal(exported["head.weight"], raw["model.head.weight"])


def test_the_checkpoint_records_the_ema_decay_of_its_weights_and_none_without_one(corpus, tmp_path):
    """config.json's ema says whether the exported weights are an average, and of which decay:
    null for a run without EMA (its training settings keep the 0 it was given)."""
    for ema, recorded in ((0.5, 0.5), (0.0, None)):
        out = tmp_path / str(ema)
        with Trainer(config(corpus, out, steps=1, ema=ema)) as trainer:
            trainer.train()
        saved = read_config(out)
        assert saved["ema"] == recorded and (saved["ema"] is None) == (ema == 0.0)
        assert saved["training"]["ema"] == ema


def test_the_log_names_the_ema_weights_validation_loss(corpus, tmp_path):
    """With EMA the validation loss is the EMA weights' and the training loss the raw ones':
    the log line read as if both were one network's."""
    for ema, label in ((0.5, "val loss (EMA) "), (0.0, "val loss ")):
        lines = []
        with Trainer(config(corpus, tmp_path / str(ema), steps=2, eval_every=2, ema=ema), log=lines.append) as trainer:
            trainer.train()
        records = [line for line in lines if line.startswith("step")]
        assert len(records) == 2 and all(f"  {label}" in line for line in records), records


def test_gpt2_corpus(tmp_path):
    """--tokenizer gpt2 with no ranks file given uses the one shipped with the package."""
    (tmp_path / "mixed.txt").write_text(BOOKS.read_text()[:100_000].title(), encoding="utf-8")
    trainer = Trainer(TrainConfig(kind="planner", data=str(tmp_path / "mixed.txt"), out=str(tmp_path / "out"),
                                  tokenizer="gpt2", **{**TINY, "steps": 2}))
    assert trainer.vocab_size == 50257
    assert math.isfinite(trainer.train()[-1]["val_loss"])
    saved = read_config(tmp_path / "out")
    assert saved["tokenizer"]["name"] == "gpt2" and saved["model"]["vocab_size"] == 50257


def test_a_run_resumes_with_its_ranks_file_moved(tmp_path, capsys):
    """--tiktoken was a setting a resume must keep, compared by path: a run whose ranks file
    moved could not resume (the old path: not found; the new one: a changed setting)."""
    import shutil

    from ddpd.assets import GPT2_RANKS

    (tmp_path / "mixed.txt").write_text(BOOKS.read_text()[:100_000].title(), encoding="utf-8")
    ranks = shutil.copy(GPT2_RANKS, tmp_path / "r50k.tiktoken")
    out = tmp_path / "out"
    Trainer(TrainConfig(kind="planner", data=str(tmp_path / "mixed.txt"), out=str(out), tokenizer="gpt2",
                        tiktoken=ranks, **{**TINY, "steps": 4, "save_every": 2})).train(stop_at=2)
    moved = shutil.move(ranks, tmp_path / "moved.tiktoken")
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--tiktoken", moved, "--no-progress")
    assert code == 0, err
    assert read_config(out)["training"]["tiktoken"] == str(moved)


def test_a_resume_whose_corpus_moved_says_to_name_its_place(tmp_path, capsys):
    """It said "no such file" and listed the corpora a fresh run may name."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(BOOKS.read_text()[:60_000], encoding="utf-8")
    out = tmp_path / "out"
    Trainer(TrainConfig(kind="planner", data=str(corpus), out=str(out), **{**TINY, "steps": 4,
                                                                           "save_every": 2})).train(stop_at=2)
    moved = corpus.rename(tmp_path / "moved.txt")
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 1 and err.startswith(f"ddpd-train: error: the run's corpus {corpus} is not there: if it "
                                        "moved, give its new place with --data"), err
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--data", moved, "--no-progress")
    assert code == 0, err


def test_a_resume_names_its_own_corpus_that_cannot_be_read_as_the_runs(tmp_path, capsys):
    """A --resume'd run's own corpus that is there but unreadable was named "data PATH" or not at
    all ("[Errno 6] No such device or address: 'PATH'"), where the resume's refusal of a corpus
    that moved says "the run's corpus PATH"."""
    import socket

    corpus = tmp_path / "c.txt"
    corpus.write_text(BOOKS.read_text()[:60_000], encoding="utf-8")
    out = tmp_path / "out"
    Trainer(TrainConfig(kind="planner", data=str(corpus), out=str(out), **{**TINY, "steps": 4,
                                                                           "save_every": 2})).train(stop_at=2)
    corpus.unlink()
    corpus.mkdir()
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert (code, err) == (1, f"ddpd-train: error: the run's corpus {corpus} is a directory, not a text file\n")
    corpus.rmdir()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(corpus))
        code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert (code, err) == (1, f"ddpd-train: error: the run's corpus {corpus}: No such device or address\n")


def _ddp_worker(rank, store, settings, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    # A file store: no TCP port to pick (and lose to another process in between).
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    trainers = []
    try:
        full = Trainer(TrainConfig.from_dict({**settings, "out": os.path.join(out, "full")}))
        trainers.append(full)
        full.train()
        save_file(dict(full.model.state_dict()), os.path.join(out, f"rank{rank}.safetensors"))
        part_settings = TrainConfig.from_dict({**settings, "out": os.path.join(out, "part")})
        trainers.append(Trainer(part_settings))
        trainers[-1].train(stop_at=2)
        trainers[-1].close()
        resumed = Trainer(part_settings, resume=True)
        trainers.append(resumed)
        resumed.train()
        save_file(dict(resumed.model.state_dict()), os.path.join(out, f"resumed{rank}.safetensors"))
    finally:
        # Every DistributedDataParallel wrapper holds the process group: released here,
        # the group is destroyed now, by both processes together, not at interpreter exit.
        for trainer in trainers:
            trainer.close()
        del trainers, full, resumed
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def _slow_clock_worker(rank, store, settings, out):
    """Process 1's clock runs twice as fast as process 0's (a busier machine): each ran
    out of max_time at its own step, with its own learning rates, and the two hung in
    collectives that no longer matched."""
    import types

    import ddpd.training.trainer as trainer_module

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    ticks = iter(range(10**6))
    trainer_module.time = types.SimpleNamespace(perf_counter=lambda: float(next(ticks) * (rank + 1)))
    trainer = Trainer(TrainConfig.from_dict(settings))
    lrs, optimizer = [], trainer.optimizer
    step = optimizer.step
    optimizer.step = lambda *a, **k: (lrs.append(optimizer.param_groups[0]["lr"]), step(*a, **k))[1]
    try:
        history = trainer.train()
        save_file(dict(trainer.model.state_dict()), os.path.join(out, f"rank{rank}.safetensors"))
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"step": trainer.step, "lrs": lrs, "history": history}, f)
    finally:
        trainer.close()
        del trainer
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def _two_processes(worker, *args) -> None:
    """Run worker(rank, *args) in two spawned processes; fail, killing them, if they hang."""
    context = mp.start_processes(worker, args=args, nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while not context.join(timeout=10):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the two processes hung")


def test_two_processes_follow_one_clock_and_one_loss(corpus, tmp_path):
    """Both processes stop at the step the faster clock says (3 steps of 2 s against 6 s),
    with the same learning rates, weights and history: the recorded training loss is the
    step's over both processes (it was process 0's alone)."""
    settings = config(corpus, tmp_path / "run", "mask-denoiser", steps=20, max_time=6.0, warmup=2, eval_every=2,
                      save_every=20).to_dict()
    _two_processes(_slow_clock_worker, str(tmp_path / "store"), settings, str(tmp_path))
    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for run in runs:  # the throughput a record names is its process's (process 0's is saved)
        run["history"] = [{k: v for k, v in h.items() if k != "tokens_per_s"} for h in run["history"]]
    assert runs[0] == runs[1] and runs[0]["step"] == 3 and len(runs[0]["lrs"]) == 3
    assert [h["step"] for h in runs[0]["history"]] == [0, 2, 3]
    rank0, rank1 = (load_file(tmp_path / f"rank{r}.safetensors") for r in (0, 1))
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    assert load_train_state(tmp_path / "run")[1]["step"] == 3


def test_a_step_weighs_every_corrupted_position_alike_however_it_is_split(corpus, tmp_path):
    """The denoiser's step loss was the mean of its micro-batches' means: a position of a
    micro-batch with few corrupted ones weighed more, and --grad-accum changed the gradient
    (and the training and validation losses read lower with smaller batches)."""
    from ddpd.training.losses import denoiser_loss

    x1 = torch.randint(0, 27, (8, 32), generator=torch.Generator().manual_seed(0))
    corrupted = torch.arange(32) < torch.tensor([30, 30, 30, 30, 1, 2, 1, 2])[:, None]  # many, then few

    def objective(network, rows, generator, labels=None, label_dropout=0.0):
        z = corrupted[[int((x1 == row).all(-1).nonzero()) for row in rows]]
        logits = network(torch.where(z, 27, rows), torch.full((rows.shape[0],), 0.5))
        return denoiser_loss(logits, rows, z, reduction="sum"), z.sum()

    steps = {}
    for batch, accum in ((8, 1), (4, 2)):
        trainer = Trainer(config(corpus, tmp_path / str(batch), "mask-denoiser", batch_size=batch, grad_accum=accum,
                                 grad_clip=0.0))
        trainer.train_batches, trainer.objective = iter(x1.split(batch)), objective
        grads, step = [], trainer.optimizer.step
        trainer.optimizer.step = lambda *a, **k: (grads.extend(p.grad.clone() for p in trainer.model.parameters()),
                                                  step(*a, **k))[1]
        steps[batch] = trainer._optimizer_step(), grads
        trainer.close()
    reference = Trainer(config(corpus, tmp_path / "whole", "mask-denoiser"))  # the same initial weights
    model = reference.model
    whole = denoiser_loss(model(torch.where(corrupted, 27, x1), torch.full((8,), 0.5)), x1, corrupted)
    whole.backward()
    reference.close()
    for (loss, terms), _ in steps.values():
        assert loss == pytest.approx(whole.item(), rel=1e-5) and terms == int(corrupted.sum())
    for expected, one, two in zip((p.grad for p in model.parameters()), steps[8][1], steps[4][1]):
        torch.testing.assert_close(one, expected, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(two, expected, rtol=1e-4, atol=1e-6)


def test_a_step_of_two_processes_has_the_gradient_of_one_over_their_batches(corpus, tmp_path):
    """Each process's gradient holds the sum over its own terms and the all-reduce averages
    the processes: the step rescales it by world_size / (all terms), so that two processes
    that drew the same batch step with the one process's gradient. Without the world_size
    the gradient was halved (AdamW hides the scale, not the clipping nor its eps)."""
    grads = {}
    for world_size in (1, 2):
        trainer = Trainer(config(corpus, tmp_path / str(world_size), "mask-denoiser", grad_clip=0.0))
        one_process, step = trainer.dist, trainer.optimizer.step
        if world_size == 2:  # the other process drew the same terms; the average of equal gradients is one of them
            trainer.dist = types.SimpleNamespace(world_size=2, sum=lambda values: [2 * v for v in values])
        trainer.optimizer.step = lambda *a, t=trainer, step=step, **k: (
            grads.setdefault(world_size, [p.grad.clone() for p in t.model.parameters()]), step(*a, **k))[1]
        trainer._optimizer_step()
        trainer.dist = one_process
        trainer.close()
    for one, two in zip(grads[1], grads[2]):
        torch.testing.assert_close(two, one)


def test_two_process_data_parallel(corpus, tmp_path):
    settings = config(corpus, tmp_path, steps=4, grad_accum=2, dropout=0.1, save_every=4, eval_every=2).to_dict()
    mp.start_processes(_ddp_worker, args=(str(tmp_path / "store"), settings, str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    rank0, rank1 = (load_file(tmp_path / f"rank{r}.safetensors") for r in (0, 1))
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)  # the ranks agree
    fresh = Trainer(config(corpus, tmp_path / "single", steps=4, grad_accum=2, dropout=0.1)).model.state_dict()
    assert not torch.equal(fresh["head.weight"], rank0["head.weight"])  # and they trained
    tensors, meta = load_train_state(tmp_path / "full")
    assert meta["world_size"] == 2 and meta["step"] == 4
    assert not torch.equal(tensors["rank0.data.generator"], tensors["rank1.data.generator"])
    assert_same_checkpoints(tmp_path / "full", tmp_path / "part")
    resumed = load_file(tmp_path / "resumed1.safetensors")
    assert all(torch.equal(rank0[k], resumed[k]) for k in rank0)
    with pytest.raises(ValueError, match="written by 2 process"):
        Trainer(TrainConfig.from_dict({**settings, "out": str(tmp_path / "full")}), resume=True)


def _peer_dies_worker(rank, store, settings, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    trainer = Trainer(TrainConfig.from_dict(settings))
    if rank == 1:
        objective = trainer.objective

        def dies_at_step_3(network, *args):
            if trainer.step == 2 and network is trainer.network:  # step 3's forward, not an evaluation
                os._exit(0)  # as if killed: its gradients never reach the all-reduce
            return objective(network, *args)

        trainer.objective = dies_at_step_3
    try:
        trainer.train()
        outcome = "finished"
    except RuntimeError as err:
        outcome = f"{type(err).__name__}: {err}"
    with open(os.path.join(out, "outcome.txt"), "w") as f:
        f.write(outcome)
    trainer.close(wait=False)


def _stop_after_the_flag_worker(rank, store, settings, out):
    """Process 1's signal lands as the stop flag's all-reduce of step 2 returns: the flag it
    contributed was 0, its own request is set."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    # a bound on a collective's wait: processes out of step fail instead of hanging the test
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    trainer = Trainer(TrainConfig.from_dict(settings))
    if rank == 1:
        reduce = trainer.dist.max

        def signalled_as_it_returns(values):
            agreed = reduce(values)
            if trainer.step == 2:
                trainer.request_stop("SIGTERM")  # what the signal handler does
            return agreed

        trainer.dist.max = signalled_as_it_returns
    try:
        trainer.train()
        outcome = {"step": trainer.step, "saved": trainer._saved_step, "stopped": trainer.stop_reason is not None}
    except RuntimeError as err:
        outcome = {"error": f"{type(err).__name__}: {err}"}
    with open(os.path.join(out, f"outcome{rank}.json"), "w") as f:
        json.dump(outcome, f)
    trainer.close(wait="error" not in outcome)
    if "error" not in outcome:  # the group, this worker's own, destroyed now: at interpreter exit gloo's
        del trainer  # threads could abort the process (SIGABRT, 1 run in about 30)
        gc.collect()
        dist.destroy_process_group()


def _peer_gone_worker(rank, store, out):
    """Process 1 leaves without a word; process 0's collectives and its close then meet a lost peer."""
    from ddpd.training.distributed import Distributed

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    # a bound on a collective's wait: a peer not seen to be gone fails too, instead of hanging the test
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    group = Distributed("cpu")
    if rank == 1:
        os._exit(0)
    group.owns_group = True  # as though it had made the group from torchrun's environment
    outcomes = []
    for call in (lambda: group.sum([1.0]), lambda: group.max([1.0]), lambda: group.all_gather(1), group.barrier,
                 group.close):
        try:
            call()
            outcomes.append("returned")
        except Exception as err:
            outcomes.append(type(err).__name__)
    outcomes.append("group left" if not dist.is_initialized() else "group kept")
    with open(os.path.join(out, "outcomes.json"), "w") as f:
        json.dump(outcomes, f)
    if dist.is_initialized():
        dist.destroy_process_group()


def test_every_collective_and_the_final_barrier_name_a_lost_peer(tmp_path):
    """A peer gone is PeerLost in each collective, the final barrier of close included (a bare
    gloo RuntimeError there ended in a traceback), and close still leaves the group it made:
    kept, gloo's threads abort the process at its exit."""
    mp.start_processes(_peer_gone_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    outcomes = json.loads((tmp_path / "outcomes.json").read_text())
    assert outcomes == ["PeerLost"] * 5 + ["group left"], outcomes


def test_a_signal_as_the_stop_flag_is_agreed_stops_every_process_at_one_step(corpus, tmp_path):
    """The trainer read its own stop request again after the all-reduce of the stop flag:
    process 1 stopped and saved (all_gather, barrier) while process 0 went on with a step,
    and the run hung with no checkpoint. The agreed value decides: both stop at step 3."""
    settings = config(corpus, tmp_path / "out", steps=20, save_every=20, eval_every=20).to_dict()
    _two_processes(_stop_after_the_flag_worker, str(tmp_path / "store"), settings, str(tmp_path))
    outcomes = [json.loads((tmp_path / f"outcome{rank}.json").read_text()) for rank in (0, 1)]
    assert outcomes == [{"step": 3, "saved": 3, "stopped": True}] * 2, outcomes
    assert load_train_state(tmp_path / "out")[1]["step"] == 3


def _signalled_cli_worker(rank, store, argv, out):
    """ddpd-train as one process of two; process 1 receives SIGTERM during step 2. Its code
    and stop reason go to outcome{rank}.json."""
    from ddpd.cli import train

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    reasons = []

    class Recorded(Trainer):
        def _optimizer_step(self):
            if rank == 1 and self.step == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # handled by ddpd-train: a stop after this step
            return super()._optimizer_step()

        def train(self, *args, **kwargs):
            history = super().train(*args, **kwargs)
            reasons.append(self.stop_reason)
            return history

    import ddpd.training.trainer as trainer_module

    trainer_module.Trainer = Recorded  # what ddpd-train imports when it runs
    code = train.main(argv)
    with open(os.path.join(out, f"outcome{rank}.json"), "w") as f:
        json.dump({"code": code, "reasons": reasons}, f)
    gc.collect()  # the trainer's DDP wrapper holds the group: destroyed now, not at interpreter exit
    dist.destroy_process_group()


@pytest.mark.integration
def test_every_process_of_a_signalled_run_exits_with_the_signals_status(corpus, tmp_path):
    """Process 1 of two gets SIGTERM: process 0 learnt only that a stop was requested and
    exited 130 (SIGINT's status) while process 1 exited 143. The stop check agrees on the
    signal's number: both exit 128 + SIGTERM, and process 0's reason names it."""
    argv = ["planner", "--data", corpus, "--out", str(tmp_path / "out"), "--steps", "20", "--eval-every", "20",
            "--save-every", "20", "--no-progress", *TINY_CLI]
    _two_processes(_signalled_cli_worker, str(tmp_path / "store"), argv, str(tmp_path))
    outcomes = [json.loads((tmp_path / f"outcome{rank}.json").read_text()) for rank in (0, 1)]
    assert outcomes == [{"code": 128 + signal.SIGTERM, "reasons": ["SIGTERM in another process"]},
                        {"code": 128 + signal.SIGTERM, "reasons": ["SIGTERM"]}], outcomes
    assert load_train_state(tmp_path / "out")[1]["step"] == 3


@pytest.mark.parametrize("reason, code, agreed", [("SIGHUP", 1.0, "SIGHUP in another process"),
                                                  ("user's request", 0.5, "a stop requested in another process")])
def test_the_stop_check_agrees_on_the_signal_in_its_one_all_reduce(corpus, tmp_path, reason, code, agreed):
    """A process contributes its signal's number (a reason that names none: a code below every
    number) to the one max of the stop check, and a peer's stop names what was agreed."""
    calls = []

    def peer_max(values):
        calls.append(values)
        return [code, values[1]]

    with Trainer(config(corpus, tmp_path / "a")) as asked, Trainer(config(corpus, tmp_path / "b")) as peer:
        one_process = asked.dist, peer.dist
        asked.dist = peer.dist = types.SimpleNamespace(world_size=2, max=peer_max)
        asked.request_stop(reason)
        assert asked._stopping() and peer._stopping()
        asked.dist, peer.dist = one_process
    assert [values[0] for values in calls] == [code, 0.0]
    assert (asked.stop_reason, peer.stop_reason) == (reason, agreed)
    assert asked.stop_signal == peer.stop_signal == (1 if code == 1.0 else None)


def test_a_peer_lost_in_the_gradient_all_reduce_is_named(corpus, tmp_path):
    """Process 1 stops inside a step: process 0 is then in backward(), in DDP's all-reduce of
    the gradients, which used to end it in a gloo traceback; it raises PeerLost."""
    settings = config(corpus, tmp_path / "out", steps=6, save_every=2, eval_every=2).to_dict()
    mp.start_processes(_peer_dies_worker, args=(str(tmp_path / "store"), settings, str(tmp_path)), nprocs=2,
                       join=True, start_method="spawn")
    outcome = (tmp_path / "outcome.txt").read_text()
    assert outcome.startswith("PeerLost: another process of the group failed or was killed"), outcome
    assert load_train_state(tmp_path / "out")[1]["step"] == 2  # the last checkpoint is intact


def test_an_error_of_a_step_whose_gradient_all_reduce_did_not_fail_stays_itself(corpus, tmp_path):
    """Only a failed all-reduce of the gradients is a lost peer: any other error of a step of a
    torchrun (out of memory in the forward) keeps its own type and message, not "another
    process of the group failed"."""
    from ddpd.training.distributed import GradientMean, PeerLost

    with Trainer(config(corpus, tmp_path / "out")) as trainer:
        trainer.reduction = GradientMean(2)  # as a run of two processes holds it

        def out_of_memory(*args, **kwargs):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

        trainer.objective = out_of_memory
        with pytest.raises(RuntimeError, match="CUDA out of memory") as raised:
            trainer._optimizer_step()
        assert not isinstance(raised.value, PeerLost)
        trainer.reduction.failed = True  # the hook saw the all-reduce fail
        with pytest.raises(PeerLost, match=r"another process of the group failed or was killed \(CUDA out of"):
            trainer._optimizer_step()


def test_help_states_the_defaults_of_the_run_settings():
    """Every setting whose help names a default names TrainConfig's (the flags default to
    unset, so that a resumed run keeps its own)."""
    import dataclasses
    import re

    from ddpd.cli.train import build_parser

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    checked = 0
    for action in build_parser()._actions:
        if action.dest not in defaults or action.help is None or not isinstance(defaults[action.dest], (int, float)):
            continue
        stated = re.search(r"\(default ([0-9.e+-]+)[):]", action.help)
        assert stated, f"--{action.dest}: {action.help}"
        assert float(stated.group(1)) == defaults[action.dest], f"--{action.dest}: {action.help}"
        checked += 1
    assert checked >= 15  # batch size, model shape, optimizer, schedule, evaluation, seed


def test_resume_help_names_the_flags_a_resume_may_change():
    """--help said only "continue the run ... exactly where it stopped": which flags a resume
    may be given other values of showed only in docs/cli.md, or in a refusal."""
    import dataclasses
    import re

    from ddpd.cli.train import build_parser
    from ddpd.training.trainer import RESUME_FIXED

    actions = {action.dest: action for action in build_parser()._actions}
    free = {f.name for f in dataclasses.fields(TrainConfig)} - set(RESUME_FIXED) - {"out"} | {"threads"}
    named = set(re.findall(r"--[a-z-]+", actions["resume"].help)) - {"--out"}
    moved = {"--data"}  # fixed, but a corpus may move (the resume checks its text)
    assert named == {actions[name].option_strings[0] for name in free} | moved, actions["resume"].help


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_refuses_an_out_of_another_library(corpus, tmp_path, capsys):
    """A Hugging Face model folder (its own config.json) was taken for a checkpoint: "already
    holds a checkpoint; pass --resume", and a save would have replaced it."""
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "gpt2"}')
    (out / "model.safetensors").write_text("weights")
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", out, "--steps", 1, "--batch-size", 2,
                           "--seq-len", 8, "--d-model", 16, "--n-layers", 1, "--n-heads", 2, "--no-progress")
    assert code == 2 and err == f"ddpd-train: error: refusing to replace {out}: not a ddpd checkpoint " \
                                "(its config.json records no ddpd kind and sha256)\n"
    assert (out / "model.safetensors").read_text() == "weights"


@pytest.mark.parametrize("seed", [-1, 2**63])
def test_cli_refuses_a_seed_as_ddpd_sample_does(corpus, tmp_path, capsys, seed):
    """--seed 2**63 said "--seed must be in [0, 9223372036854775807]", not ddpd-sample's
    "--seed must be in [0, 2**63)": one range, one wording, before anything is written."""
    code, out_text, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "p", "--seed", seed)
    assert code == 2 and out_text == "" and err == f"ddpd-train: error: --seed must be in [0, 2**63), got {seed}\n"
    assert not (tmp_path / "p").exists()


def test_cli_refuses_an_out_of_other_files_as_a_usage_error(corpus, tmp_path, capsys, monkeypatch):
    """--out DIR of other files exited 1, after the process group and the output's lock; every
    other refusal of the command line exits 2, before the corpus is read."""
    out = tmp_path / "notes"
    out.mkdir()
    (out / "todo.txt").write_text("mine")

    def no_corpus(*args, **kwargs):
        raise AssertionError("the corpus was read")

    monkeypatch.setattr("ddpd.training.trainer.load_text", no_corpus)
    code, out_text, err = run_cli(capsys, "planner", "--data", corpus, "--out", out, "--steps", 1)
    assert code == 2 and out_text == "" and err == (f"ddpd-train: error: refusing to replace {out}: it is neither "
                                                    "empty nor a ddpd checkpoint\n"), err
    assert os.listdir(out) == ["todo.txt"] and (out / "todo.txt").read_text() == "mine"


def test_cli_refuses_the_working_directory_as_out_before_training(corpus, tmp_path, capsys, monkeypatch):
    """`--out .` trained, then the checkpoint's swap replaced the working directory: the shell
    was left in a deleted directory."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for out, resume in ((".", []), ("..", ["--resume"])):
        code, out_text, err = run_cli(capsys, "planner", "--data", corpus, "--out", out, "--steps", 1, *resume)
        assert code == 2 and out_text == "" and err.count("\n") == 1, err
        assert err.startswith("ddpd-train: error: --out: cannot write ") and "is the working directory" in err
    assert os.listdir(here) == [] and os.path.samefile(os.getcwd(), here)
    with Trainer(config(corpus, here / "p", steps=1, save_every=1)) as trainer:
        trainer.train()
    monkeypatch.chdir(here / "p")
    with pytest.raises(files.OutputError, match="is the working directory or holds it"):  # the library's resume
        Trainer(config(corpus, ".", steps=1, save_every=1), resume=True)
    assert load_model(".")[1]["kind"] == "planner" and os.path.samefile(os.getcwd(), here / "p")


def test_a_resume_reads_the_shipped_corpus_it_recorded_beside_a_file_of_its_name(tmp_path, capsys, monkeypatch):
    """A checkpoint records `"data": "books"`; a resume from a directory holding a file named
    books read that file instead, and was refused as a changed corpus."""
    monkeypatch.chdir(tmp_path)
    tiny = ["--steps", 1, "--batch-size", 2, "--seq-len", 8, "--d-model", 16, "--n-layers", 1, "--n-heads", 2,
            "--eval-batches", 1, "--no-progress"]
    code, _, err = run_cli(capsys, "planner", "--data", "books", "--out", tmp_path / "p", *tiny)
    assert code == 0, err
    (tmp_path / "books").write_text("a local file named books " * 100)
    code, out, err = run_cli(capsys, "planner", "--out", tmp_path / "p", "--resume", "--no-progress")
    assert code == 0 and "step 1 of 1" in out, err
    assert read_config(tmp_path / "p")["training"]["data"] == "books"
    code, _, err = run_cli(capsys, "planner", "--data", "books", "--out", tmp_path / "q", *tiny)  # given: the file
    assert code == 0 and read_config(tmp_path / "q")["training"]["data"] == str(tmp_path / "books"), err


def test_a_resume_given_data_reads_a_file_of_a_corpus_name_as_a_fresh_run_does(tmp_path, capsys, monkeypatch):
    """--data books on the command line names the file books in the working directory, on a
    resume as on a fresh run; only a checkpoint's record of it names the shipped corpus."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "books").write_text("a local file named books " * 100)
    tiny = ["--steps", 1, "--batch-size", 2, "--seq-len", 8, "--d-model", 16, "--n-layers", 1, "--n-heads", 2,
            "--eval-batches", 1, "--no-progress"]
    code, _, err = run_cli(capsys, "planner", "--data", "books", "--out", tmp_path / "q", *tiny)
    assert code == 0, err
    code, out, err = run_cli(capsys, "planner", "--data", "books", "--out", tmp_path / "q", "--resume",
                             "--no-progress")
    assert code == 0 and "step 1 of 1" in out, err


def test_cli_trains_and_resumes(corpus, tmp_path, capsys):
    args = ["planner", "--data", corpus, "--out", tmp_path / "p", "--steps", 4, "--batch-size", 8, "--seq-len", 32,
            "--d-model", 32, "--n-layers", 1, "--n-heads", 2, "--eval-every", 2, "--eval-batches", 2,
            "--no-progress"]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    assert out.count("val loss") == 4 and "step 0 of 4" in out
    model, saved = load_model(tmp_path / "p")
    assert saved["training"]["steps"] == 4 and saved["training"]["data"] == os.path.abspath(corpus)
    code, out, err = run_cli(capsys, *args)  # a command-line mistake, as the other refusals of the command line
    assert code == 2 and err == (f"ddpd-train: error: --out {tmp_path / 'p'} already holds a checkpoint; pass "
                                 "--resume to continue it or choose another --out\n")
    code, out, err = run_cli(capsys, "planner", "--out", tmp_path / "p", "--resume", "--lr", "0.1")
    assert code == 2 and err.count("\n") == 1 and "changed settings: --lr (0.0003 -> 0.1); leave those flags" in err
    code, out, err = run_cli(capsys, "ar", "--out", tmp_path / "p", "--resume")
    assert code == 2 and f"cannot resume {tmp_path / 'p'}: it holds a 'planner' network, not 'ar'" in err
    code, out, err = run_cli(capsys, "planner", "--out", tmp_path / "p", "--resume", "--no-progress")
    assert code == 0 and "step 4 of 4" in out


def test_the_done_line_gives_the_last_validation_loss(corpus, tmp_path, capsys):
    """The "done:" line quotes the validation loss of the last step's record, to 4 decimals."""
    code, out, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "p", "--steps", 2,
                             "--eval-every", 2, "--no-progress", *TINY_CLI)
    assert code == 0, err
    last = next(line for line in out.splitlines() if line.lstrip().startswith("step       2 "))
    val = re.search(r"val loss (\d+\.\d{4})", last).group(1)
    done = next(line for line in out.splitlines() if line.startswith("done: "))
    assert done.startswith(f"done: step 2, val loss {val}, "), (last, done)


@pytest.mark.parametrize("argv, message, status", [
    (["planner", "--data", "/nonexistent/corpus.txt", "--out", "{tmp}/o"], "--data: no such file", 2),
    (["planner", "--out", "{tmp}/o"], "--data is required", 2),
    (["planner", "--data", "hf:", "--out", "{tmp}/o"], "--data: data source 'hf:NAME[:CONFIG]' needs a dataset", 2),
    (["planner", "--data", "{corpus}", "--out", "{tmp}/o", "--resume"], "checkpoint directory not found", 1),
    (["planner", "--data", "{corpus}", "--out", "{tmp}/o", "--d-model", "30", "--n-heads", "4"],
     "--d-model: expected a multiple of --n-heads 4, got 30", 2),
    (["planner", "--data", "{corpus}", "--out", "{tmp}/o", "--lr", "nan"],
     "--lr must be in (0, 3.40282e+37], got nan", 2),
    (["planner", "--data", "{corpus}", "--out", "{tmp}/o", "--label-dropout", "0.1"],
     "--label-dropout needs --num-classes > 0 (class labels to drop), got 0.1", 2),  # flags, not settings
    (["planner", "--data", "{corpus}", "--out", "{tmp}/o", "--device", "tpu"], "--device must be", 2),
    (["planner", "--data", "{corpus}", "--out", "{tmp}/o", "--tokenizer", "gpt2", "--tiktoken", "/no/file"],
     "--tiktoken: no such file", 2),
    (["planner", "--data", "{corpus}", "--out", "{tmp}/o", "--tiktoken", "{corpus}"],  # named "tokenizer 'gpt2'"
     "--tiktoken (a GPT-2 ranks file) needs --tokenizer gpt2, got --tokenizer text8", 2),
    (["planner", "--data", "{tmp}/mixed-case.txt", "--out", "{tmp}/o"], "only space and a-z", 2),
    (["planner", "--data", "{tmp}/latin1.txt", "--out", "{tmp}/o"], "--data file {tmp}/latin1.txt is not UTF-8", 2),
])
def test_cli_errors_are_one_line(corpus, tmp_path, capsys, argv, message, status):
    """A bad command line exits with status 2 naming the flag; a failure while working with 1."""
    (tmp_path / "mixed-case.txt").write_text("First Citizen: Before we proceed any further, hear me speak.")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait ".encode("latin-1") * 20)
    message = message.format(tmp=tmp_path)
    argv = [a.format(tmp=tmp_path, corpus=corpus) for a in argv]
    code, out, err = run_cli(capsys, *argv)
    assert code == status
    assert err.startswith("ddpd-train: error: ") and message in err and err.count("\n") == 1


def test_cli_refuses_data_that_is_not_utf8_or_not_encodable_as_a_usage_error(tmp_path, capsys):
    """Both exited 1, as failures while working, where ddpd-eval refuses the same --data with
    status 2 (a bad input the command line names, docs/cli.md): before any step, nothing
    written. A --resume'd run's own corpus, not on the command line, stays a failure (1)."""
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait ".encode("latin-1") * 20)
    (tmp_path / "mixed.txt").write_text("First Citizen: before we proceed " * 20)
    for name, cause in [("latin1.txt", "file {} is not UTF-8 text (byte 0xe9 at offset 3)"),
                        ("mixed.txt", "{}: text must contain only space and a-z (text8 format), got 'F' (U+0046) "
                                      "at position 0; 60 such character(s) in total")]:
        code, out, err = run_cli(capsys, "planner", "--data", tmp_path / name, "--out", tmp_path / "o",
                                 "--no-progress")
        assert (code, out) == (2, "") and sorted(os.listdir(tmp_path)) == ["latin1.txt", "mixed.txt"], err
        assert err == f"ddpd-train: error: --data {cause.format(tmp_path / name)}\n"
    out, books = tmp_path / "p", tmp_path / "books.txt"
    books.write_text(BOOKS.read_text())
    _checkpoint_at_step_2(str(books), out)
    books.write_bytes((tmp_path / "latin1.txt").read_bytes())
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert (code, err) == (1, f"ddpd-train: error: the run's corpus {books} is not UTF-8 text (byte 0xe9 at "
                              "offset 3)\n")


@pytest.mark.parametrize("record, cause", [
    ('{"text": "ab", "label": 0', "not JSON (Expecting ',' delimiter at column 26)"),
    ('["ab", 0]', "expected an object {\"text\": str, \"label\": int}, got '[\"ab\", 0]'"),
    ('{"text": "", "label": 0}', "'text' is empty (a record needs text to train on)"),
    ('{"text": "ab", "label": "0"}', "'label' must be an int in [0, 2**63) (a class id), got '0'"),
    ('{"text": "ab", "label": 0, "label": 1}', "not JSON (the key 'label' appears more than once)"),
], ids=["not JSON", "not an object", "empty text", "label a string", "label twice"])
def test_cli_refuses_a_bad_record_of_a_labelled_corpus_as_a_usage_error(tmp_path, capsys, record, cause):
    """A .jsonl line that is not a record exited 1, as a failure while working, where a record
    the tokenizer cannot encode exits 2: each is a bad input the command line names."""
    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": "fine", "label": 1}\n' + record + "\n")
    code, out, err = run_cli(capsys, "planner", "--data", data, "--out", tmp_path / "o", "--no-progress")
    assert (code, out) == (2, "") and sorted(os.listdir(tmp_path)) == ["bad.jsonl"], err
    assert err == f"ddpd-train: error: --data {data} line 2: {cause}\n"


def test_cli_names_a_refused_data_file_as_typed(tmp_path, capsys, monkeypatch):
    """ddpd-train named a --data it refuses by its absolute path, where ddpd-eval names it as
    typed; and a line quoted from the file read `lr=3` as the flag --lr."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait ".encode("latin-1") * 20)
    (tmp_path / "mixed.txt").write_text("First Citizen " * 20)
    (tmp_path / "bad.jsonl").write_text('["lr=3"]\n')
    for name, cause in [("latin1.txt", "--data file latin1.txt is not UTF-8 text (byte 0xe9 at offset 3)"),
                        ("mixed.txt", "--data mixed.txt: text must contain only space and a-z (text8 format), got "
                                      "'F' (U+0046) at position 0; 40 such character(s) in total"),
                        ("bad.jsonl", "--data bad.jsonl line 1: expected an object {\"text\": str, \"label\": int}, "
                                      "got '[\"lr=3\"]'")]:
        code, out, err = run_cli(capsys, "planner", "--data", name, "--out", "o", "--no-progress")
        assert (code, out, err) == (2, "", f"ddpd-train: error: {cause}\n")
    assert not (tmp_path / "o").exists()


def test_cli_names_the_flag_of_a_corpus_too_short_for_seq_len(tmp_path, capsys, monkeypatch):
    """The library's "fewer than seq_len=64; ... a shorter seq_len" reached the command line
    as it was, where errors name the flag; it stays a failure while working (status 1). It
    named --data by its absolute path, where the other refusals of --data name it as typed, and
    read a folder of that path named seq_len as the flag."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "seq_len").mkdir()
    short = tmp_path / "seq_len" / "short.txt"
    short.write_text("abcdefgh " * 30)
    code, out, err = run_cli(capsys, "planner", "--data", "seq_len/short.txt", "--out", "o", "--seq-len", 64,
                             "--steps", 1, "--batch-size", 2, "--d-model", 16, "--n-layers", 1, "--n-heads", 2,
                             "--no-progress")
    assert (code, out) == (1, "")
    assert err == ("ddpd-train: error: --data seq_len/short.txt: its validation split holds 13 tokens, fewer than "
                   "--seq-len 64; use a longer corpus or a shorter --seq-len\n")
    with pytest.raises(ValueError, match=r"fewer than seq_len=64; use a longer corpus or a shorter seq_len$"):
        Trainer(TrainConfig(kind="planner", data=str(short), out=str(tmp_path / "p"), seq_len=64))
    (tmp_path / "ab.txt").write_text("ab")  # a train split of one token: "1 tokens" it said
    with pytest.raises(ValueError, match=r": its train split holds 1 token, fewer than seq_len=64;"):
        Trainer(TrainConfig(kind="planner", data=str(tmp_path / "ab.txt"), out=str(tmp_path / "p"), seq_len=64))


def test_cli_refuses_a_directory_as_tiktoken_before_any_work(corpus, tmp_path, capsys):
    """--tiktoken DIR was refused as "no such file: DIR", a directory that is there."""
    code, out, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "o", "--tokenizer", "gpt2",
                             "--tiktoken", tmp_path)
    assert (code, out) == (2, "") and not (tmp_path / "o").exists()
    assert err == f"ddpd-train: error: --tiktoken: {tmp_path} is a directory, not the GPT-2 ranks file\n"


def test_cli_takes_a_fraction_of_a_second_as_max_time(corpus, tmp_path, capsys):
    """--max-time is seconds as a float, as --help says: 0.5 reaches the run (and its checkpoint)."""
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "o", "--max-time", "0.5",
                           "--steps", 2, "--batch-size", 2, "--seq-len", 8, "--d-model", 16, "--n-layers", 1,
                           "--n-heads", 2, "--warmup", 1, "--eval-batches", 1, "--no-progress")
    assert code == 0, err
    assert read_config(tmp_path / "o")["training"]["max_time"] == 0.5


@pytest.mark.parametrize("argv", [["gan", "--out", "o"], ["planner", "--out", "o", "--steps", "many"], ["planner"]])
def test_cli_usage_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("ddpd-train: error: ") and err.count("\n") == 1


def test_torchruns_variables_of_a_one_process_run_are_taken(monkeypatch):
    """torchrun --nproc_per_node 1 sets RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, the least values each
    takes: they must read as a lone process, whose collectives are the identity and join no group."""
    from ddpd.training.distributed import Distributed

    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    group = Distributed("cpu")
    assert (group.world_size, group.rank, group.is_main, group.device) == (1, 0, True, torch.device("cpu"))
    assert group.sum([1.5, 2.0]) == [1.5, 2.0] and group.max([3.0]) == [3.0] and group.all_gather("a") == ["a"]
    group.barrier()
    group.close()
    assert not group.owns_group and not dist.is_initialized()


@pytest.mark.parametrize("failure", ["occupied", "interrupted"])
def test_a_trainer_that_fails_to_start_releases_the_output_at_once(corpus, tmp_path, monkeypatch, failure):
    """A refusal or a Ctrl-C while the trainer sets up releases the lock before it raises,
    not when the half-built trainer is collected: a caller that keeps the exception (a
    notebook keeps the last traceback) may start again at once."""
    from ddpd.training.trainer import OccupiedOutput

    out = tmp_path / "p"
    if failure == "occupied":
        _checkpoint_at_step_2(corpus, out)
        expected = OccupiedOutput
    else:
        import ddpd.training.trainer as trainer_module

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(trainer_module, "load_text", interrupted)
        expected = KeyboardInterrupt
    with pytest.raises(expected) as raised:
        Trainer(config(corpus, out))
    assert raised.traceback  # the trainer is still referenced by the traceback's frames
    assert ".p.lock" not in os.listdir(tmp_path)
    files.OutputLock(out).acquire().release()


def test_a_close_whose_group_fails_to_close_still_releases_the_output(corpus, tmp_path):
    """Leaving the group can fail (a peer lost at the final barrier): the output's lock goes
    anyway, so that no lock file is left behind and the run can be resumed at once."""
    from ddpd.training.distributed import PeerLost

    trainer = Trainer(config(corpus, tmp_path / "p"))

    def peer_lost_at_the_barrier(wait=True):
        raise PeerLost(RuntimeError("Connection closed by peer"))

    trainer.dist.close = peer_lost_at_the_barrier
    with pytest.raises(PeerLost):
        trainer.close()
    assert os.listdir(tmp_path) == []
    files.OutputLock(tmp_path / "p").acquire().release()


def test_a_group_is_destroyed_once_by_whoever_made_it(tmp_path, monkeypatch):
    """Distributed destroys the group it made (torchrun's environment) at its first close and
    then no longer owns it: a second close (Trainer.close, then its with block) has nothing to
    destroy. A group the caller made is the caller's: close leaves it."""
    from ddpd.training.distributed import Distributed

    init = dist.init_process_group
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    # torchrun's environment, joined as a group of one: no peer to start, no port to pick
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend: init(backend, init_method=f"file://{tmp_path / 'own'}", rank=0, world_size=1))
    made = Distributed("cpu")
    assert made.owns_group and dist.is_initialized()
    made.close()
    assert not made.owns_group and not dist.is_initialized()
    made.close()
    init("gloo", init_method=f"file://{tmp_path / 'callers'}", rank=0, world_size=1)
    try:
        joined = Distributed("cpu")
        joined.close()
        assert not joined.owns_group and dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_what_joining_the_group_prints_goes_to_stderr(tmp_path, monkeypatch, capfd):
    """torch 2.7-2.8's gloo prints each process's connection to its peers on file descriptor 1,
    among the samples ddpd-sample prints there: joining the group points it at stderr."""
    from ddpd.training.distributed import Distributed

    init = dist.init_process_group

    def noisy(backend):
        os.write(1, b"[Gloo] Rank 0 is connected to 1 peer ranks.\n")  # as gloo's C++ does
        init(backend, init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(dist, "init_process_group", noisy)
    print("before", flush=True)
    group = Distributed("cpu")
    print("after", flush=True)
    os.write(1, b"fd 1 again\n")
    group.close(wait=False)
    out, err = capfd.readouterr()
    assert out == "before\nafter\nfd 1 again\n" and "[Gloo] Rank 0 is connected" in err


def test_a_closed_trainer_lets_go_of_its_data_parallel_wrapper(corpus, tmp_path, monkeypatch):
    """DistributedDataParallel's reducer holds the process group: a wrapper kept past close()
    kept the group, and gloo's threads, to the interpreter's exit, where they abort the process
    after its work is done. torchrun's environment joined as a group of one, as above."""
    init = dist.init_process_group
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend: init(backend, init_method=f"file://{tmp_path / 'own'}", rank=0, world_size=1))
    trainer = Trainer(config(corpus, tmp_path / "run"))
    wrapper = weakref.ref(trainer.network)
    assert isinstance(wrapper(), torch.nn.parallel.DistributedDataParallel)
    trainer.close()
    gc.collect()
    assert wrapper() is None and trainer.network is trainer.model and not dist.is_initialized()


def test_only_process_0_writes_the_checkpoint(corpus, tmp_path):
    """Every process gives its part of the training state; process 0, which holds the output's
    lock, alone writes it: a second writer would race its renames of the same directory."""
    out = tmp_path / "run"
    with Trainer(config(corpus, out)) as trainer:
        trainer.dist.rank = 1  # the run as process 1 sees it (one process: its collectives are the identity)
        trainer.save()
        assert not out.exists() and trainer._saved_step == 0
        trainer.dist.rank = 0
        trainer.save()
    assert load_train_state(out)[1]["step"] == 0


def test_a_cli_run_that_fails_closes_without_the_final_barrier(corpus, tmp_path, capsys, monkeypatch):
    """After this process's own error (a full disk at a save) the others wait in the step's
    collectives, never at the final barrier: waiting there hung a torchrun, or turned the
    error into a lost peer. A run that finished waits for the others."""
    waits = []
    close = Trainer.close
    monkeypatch.setattr(Trainer, "close", lambda self, wait=True: (waits.append(wait), close(self, wait))[1])
    argv = ["planner", "--data", corpus, "--steps", "2", "--no-progress", *TINY_CLI]
    assert run_cli(capsys, *argv, "--out", tmp_path / "done")[0] == 0

    def full(file, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt, "_write_file", full)
    code, _, err = run_cli(capsys, *argv, "--out", tmp_path / "full")
    assert code == 1 and err.endswith("No space left on device\n"), err
    assert waits == [True, False]


def test_a_with_block_left_by_an_error_closes_without_the_final_barrier(corpus, tmp_path):
    """After an error the other processes may never reach the final barrier (a lost peer, a
    refusal on process 0): a Trainer's with block left by one closes with wait=False."""
    waits = []
    with pytest.raises(_Stop):
        with Trainer(config(corpus, tmp_path / "failed")) as trainer:
            trainer.dist.close = waits.append
            raise _Stop()
    with Trainer(config(corpus, tmp_path / "done")) as trainer:
        trainer.dist.close = waits.append
    assert waits == [False, True]
    assert os.listdir(tmp_path) == []  # and the locks went with them


def test_the_gradient_hook_averages_over_the_world_size(tmp_path):
    """GradientMean divides each process's gradient by the world size before the all-reduce sums
    them (what DDP does by itself): in a group of one, a hook made for two halves the gradient."""
    from ddpd.training.distributed import GradientMean

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        bucket = types.SimpleNamespace(buffer=lambda g=torch.tensor([2.0, -6.0]): g)
        hook = GradientMean(2)
        assert GradientMean._reduce(hook, bucket).wait().tolist() == [1.0, -3.0] and not hook.failed
    finally:
        dist.destroy_process_group()


def test_data_parallel_leaves_the_buffers_out_of_each_forward(tmp_path):
    """The wrapper does not broadcast the buffers (the rotary tables, alike on every process) at each forward."""
    from ddpd.training.distributed import data_parallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        wrapper = data_parallel(torch.nn.Linear(2, 2))
        # torch 2.13 renamed broadcast_buffers to forward_sync_buffers
        assert getattr(wrapper, "forward_sync_buffers", getattr(wrapper, "broadcast_buffers", None)) is False
        del wrapper
        gc.collect()
    finally:
        dist.destroy_process_group()


@pytest.fixture
def group_of_two(tmp_path, monkeypatch):
    """A Distributed in a one-process gloo group that sees a world of two, so values go through the all-reduce."""
    from ddpd.training.distributed import Distributed

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        group = Distributed("cpu")
        group.world_size = 2
        yield group
    finally:
        dist.destroy_process_group()


def test_sum_and_max_reduce_in_float64_with_their_own_operation(group_of_two, monkeypatch):
    """Distributed.sum all-reduces with SUM and max with MAX, in float64 (2**24 + 1 and 0.1 come back exact)."""
    ops, all_reduce = [], dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op: (ops.append(op), all_reduce(tensor, op=op))[1])
    assert group_of_two.sum([2.0**24 + 1, 0.1]) == [2.0**24 + 1, 0.1] and group_of_two.max([0.1]) == [0.1]
    assert ops == [dist.ReduceOp.SUM, dist.ReduceOp.MAX]


def test_only_a_collectives_runtime_error_reads_as_a_lost_peer(group_of_two, monkeypatch):
    """gloo's lost connection is a RuntimeError, named PeerLost with it as the cause; any other
    error of a collective (a bad argument, say) is its own."""
    from ddpd.training.distributed import PeerLost

    lost, bad = RuntimeError("Connection closed by peer"), ValueError("not a tensor")
    for error in (lost, bad):
        monkeypatch.setattr(dist, "all_reduce", lambda tensor, op, error=error: (_ for _ in ()).throw(error))
        with pytest.raises((PeerLost, ValueError)) as info:
            group_of_two.sum([1.0])
        seen = info.value
        assert (type(seen), seen.__cause__) == (PeerLost, lost) if error is lost else seen is bad


def test_a_process_of_a_group_takes_the_gpu_of_its_local_rank(monkeypatch):
    """A process of a group asks for the GPU of LOCAL_RANK (RANK where unset); a lone process keeps its device."""
    import ddpd.training.distributed as distributed

    asked = []
    monkeypatch.setattr(distributed, "check_device", lambda name, device, local_rank: asked.append(local_rank)
                        or torch.device("cpu"))
    monkeypatch.setattr(dist, "init_process_group", lambda backend: None)  # no group: only the device is looked at
    for name in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    distributed.Distributed("cuda:1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("LOCAL_RANK")
    distributed.Distributed("cuda")
    assert asked == [None, 1]


def test_a_lost_peer_is_named_by_the_first_sentence_of_the_backends_error():
    from ddpd.training.distributed import PeerLost

    lost = PeerLost(RuntimeError("Connection closed by peer. Check the other process.\nmore"))
    assert str(lost) == "another process of the group failed or was killed (Connection closed by peer)"
    assert str(PeerLost(RuntimeError(""))) == "another process of the group failed or was killed (RuntimeError)"
    reset = PeerLost(RuntimeError("\n  Connection reset by 10.0.0.2:29500. Retry.\n"))  # a dot within the sentence
    assert str(reset).endswith("(Connection reset by 10.0.0.2:29500)")
    assert lost.detail == ""  # until a tool says what it kept


@pytest.mark.parametrize("environ, message", [
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE must be an int >= 1, got '0'"),
    ({"WORLD_SIZE": ""}, "WORLD_SIZE must be an int >= 1, got ''"),  # set but empty is not unset
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK must be an int >= 0, got '-1'"),
    ({"RANK": "-1", "WORLD_SIZE": "3"}, "RANK must be an int in [0, 2] (below WORLD_SIZE, which is 1 when unset), "
                                        "got '-1'"),
    ({"RANK": "1.0"}, "RANK must be an int in [0, 0] (below WORLD_SIZE, which is 1 when unset), got '1.0'")])
def test_each_torchrun_variable_is_refused_with_its_own_range(monkeypatch, environ, message):
    """Only RANK's message speaks of WORLD_SIZE; the refusal comes before any group is joined."""
    from ddpd.training.distributed import Distributed

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as info:
        Distributed("cpu")
    assert str(info.value) == f"environment variable {message}" and not dist.is_initialized()


@pytest.mark.integration
@pytest.mark.parametrize("environ, message", [
    ({"RANK": "1"}, "RANK must be an int in [0, 0] (below WORLD_SIZE, which is 1 when unset), got '1'"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK must be an int in [0, 1]"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE must be an int >= 1, got 'two'"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK must be an int >= 0")])
def test_torchrun_variables_that_cannot_be_are_named(corpus, tmp_path, capsys, monkeypatch, environ, message):
    """RANK=1 without a group made a lone process a helper of process 0: nothing written,
    exit 0 (or a ZeroDivisionError traceback in its evaluation)."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "p", "--steps", "2", *TINY_CLI)
    assert code == 1 and err.count("\n") == 1 and err.startswith(f"ddpd-train: error: environment variable {message}")
    assert not (tmp_path / "p").exists()


@pytest.mark.integration
def test_cli_process_has_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ddpd.cli.train", "planner", "--data", str(tmp_path / "none"),
                             "--out", str(tmp_path / "o")], capture_output=True, text=True, env=ONE_THREAD_ENV)
    assert result.returncode == 2
    assert result.stderr.startswith("ddpd-train: error: --data: no such file") and "Traceback" not in result.stderr


@pytest.mark.integration
@pytest.mark.parametrize("stdout", ["gone", "full"])
def test_a_log_reader_that_went_away_does_not_stop_the_training(corpus, tmp_path, stdout):
    """`ddpd-train ... | head -3` stopped at the next log line with 'Broken pipe' and no
    final checkpoint; `>/dev/full` the same with 'No space left on device'."""
    argv = [sys.executable, "-m", "ddpd.cli.train", "planner", "--data", corpus, "--out", str(tmp_path / "o"),
            "--steps", "6", "--eval-every", "1", "--save-every", "100", *TINY_CLI]
    env = {**ONE_THREAD_ENV, "PYTHONUNBUFFERED": "1"}
    if stdout == "gone":
        read, write = os.pipe()
        os.close(read)
        try:
            result = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, text=True, env=env,
                                    timeout=HANG_GUARD_SECONDS)
        finally:
            os.close(write)
        assert result.returncode == 0 and result.stderr == "", result.stderr
    else:
        with open("/dev/full", "w") as full:
            result = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=env,
                                    timeout=HANG_GUARD_SECONDS)
        assert result.returncode == 1 and result.stderr == (
            f"ddpd-train: error: cannot write stdout: No space left on device; the checkpoint of step 6 is in "
            f"{tmp_path / 'o'}\n"), result.stderr
    assert load_train_state(tmp_path / "o")[1]["step"] == 6


def test_resume_needs_a_training_checkpoint(corpus, tmp_path):
    with pytest.raises(CheckpointError, match="holds no training checkpoint"):
        Trainer(config(corpus, tmp_path / "empty"), resume=True)


def test_non_finite_loss_stops_training(corpus, tmp_path, monkeypatch):
    trainer = Trainer(config(corpus, tmp_path / "out", steps=3))
    monkeypatch.setattr(trainer, "objective",  # in training: a NaN validation loss stops the run at step 0
                        lambda network, x1, generator, *labels: (
                            network(x1).sum() * (float("nan") if network.training else 0.0), torch.tensor(1)))
    with pytest.raises(FloatingPointError, match="training loss is nan at step 1"):
        trainer.train()
    with pytest.raises(ValueError, match="stop_at must be >= 0"):
        trainer.train(stop_at=-1)


# ---------------------------------------------------------------- faults: signals, two writers, damaged state


TINY_CLI = ["--batch-size", "4", "--seq-len", "16", "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
            "--eval-batches", "1", "--lr", "1e-3", "--warmup", "1"]


class Lines:
    """The lines a subprocess prints, read by a thread, so a test waits for a line
    (never for a fixed time) with a generous hang guard."""

    def __init__(self, stream):
        self.queue, self.seen = queue.Queue(), []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            self.queue.put(line)
        self.queue.put(None)

    def wait_for(self, text, timeout=HANG_GUARD_SECONDS):
        while True:
            line = self.queue.get(timeout=timeout)
            if line is None:
                raise AssertionError(f"the process ended before printing {text!r}: {self.seen}")
            self.seen.append(line)
            if text in line:
                return line


def _start_training(corpus, out, *extra):
    command = [sys.executable, "-m", "ddpd.cli.train", "planner", "--data", corpus, "--out", str(out),
               "--steps", "1000000", "--eval-every", "5", *TINY_CLI, *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ONE_THREAD_ENV,
                            preexec_fn=default_signals)


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signals_stop_training_with_a_final_checkpoint(corpus, tmp_path, sig):
    out = tmp_path / "p"
    proc = _start_training(corpus, out, "--save-every", "1")  # a save at every step: signals land in saves too
    Lines(proc.stdout).wait_for("step       5")  # training is under way
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=HANG_GUARD_SECONDS)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, err
    assert len(err.strip().splitlines()) == 1 and f"interrupted by {name} at step" in err, err
    assert "\r" not in err and "it/s" not in err  # no progress bar off a terminal
    step = int(err.split("at step ")[1].split()[0])
    checkpoint = load_checkpoint(out, train_state=True)
    assert checkpoint.train_state[1]["step"] == step >= 5
    assert os.listdir(tmp_path) == ["p"]  # no temporary, no lock left behind
    Trainer(TrainConfig.from_dict({**read_config(out)["training"], "out": str(out)}), resume=True).close()


class _Stop(Exception):
    pass


@pytest.mark.integration
def test_a_signal_while_the_network_is_built_waits_for_it(corpus, tmp_path, monkeypatch):
    """AdamW's constructor imports torch._dynamo and triton, C++ that calls back into Python:
    a signal handler's exception raised there aborted the process (SIGABRT, the lock left).
    The signal waits until the network and its optimizer are built."""
    events = []
    adamw = torch.optim.AdamW

    def signalled_while_building(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        events.append("signalled")
        optimizer = adamw(*args, **kwargs)
        events.append("built")
        return optimizer

    def stop(signum, frame):
        events.append("handled")
        raise _Stop()

    monkeypatch.setattr(torch.optim, "AdamW", signalled_while_building)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(_Stop):
            Trainer(config(corpus, tmp_path / "p"))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert events == ["signalled", "built", "handled"]
    assert os.listdir(tmp_path) == []  # the lock released


@pytest.mark.integration
def test_a_second_signal_as_the_final_save_returns_names_that_checkpoint(corpus, tmp_path, capsys, monkeypatch):
    """The first signal stops the run at its step with a save; a second as that save returned
    raised before the trainer knew of it, and the message said no checkpoint was written."""
    import ddpd.training.trainer as trainer

    save, optimizer_step, steps = trainer.save_checkpoint, Trainer._optimizer_step, []

    def signalled_at_step_3(self):
        steps.append(self.step)
        if len(steps) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # graceful: stop after this step, with a checkpoint
        return optimizer_step(self)

    def save_then_signal(*args, **kwargs):
        save(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the second: no more waiting

    monkeypatch.setattr(Trainer, "_optimizer_step", signalled_at_step_3)
    monkeypatch.setattr(trainer, "save_checkpoint", save_then_signal)
    out = tmp_path / "p"
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", out, "--steps", "100", "--save-every", "1000",
                           "--no-progress", *TINY_CLI)
    assert code == 128 + signal.SIGTERM
    assert f"interrupted by SIGTERM; the checkpoint of step 3 in {out} is intact" in err, err
    assert load_checkpoint(out, train_state=True).train_state[1]["step"] == 3


@pytest.mark.integration
def test_a_signal_after_the_last_step_leaves_the_run_complete(corpus, tmp_path, capsys, monkeypatch):
    """A signal while a finished run closed was taken for a stop: the run was reported
    interrupted at step 4 of 4, to be continued with --resume."""
    close = Trainer.close

    def signalled_while_closing(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return close(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "close", signalled_while_closing)
    _trains_to_the_end(corpus, tmp_path / "p", capsys, 4)


@pytest.mark.integration
def test_a_signal_after_the_done_line_leaves_the_run_complete(corpus, tmp_path, capsys, monkeypatch):
    """After the final checkpoint and the "done:" line, the trainer out of the way, a signal was
    an interrupt: exit status 143 and "interrupted by SIGTERM" for a complete run."""
    from ddpd.streams import Stdout

    def signalled_after_done(self, kept=""):
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before kill returns

    monkeypatch.setattr(Stdout, "check", signalled_after_done)
    _trains_to_the_end(corpus, tmp_path / "p", capsys, 2)


@pytest.mark.integration
def test_a_signal_as_the_last_step_returns_leaves_the_run_complete(corpus, tmp_path, capsys, monkeypatch):
    """A signal between the end of train() and the run being marked complete reaches
    request_stop, which must refuse a stop once every step is done: taken, it reported the
    finished run interrupted at step 2 of 2, exit status 143."""
    train = Trainer.train

    def signalled_as_it_returns(self, *args, **kwargs):
        history = train(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before kill returns
        return history

    monkeypatch.setattr(Trainer, "train", signalled_as_it_returns)
    _trains_to_the_end(corpus, tmp_path / "p", capsys, 2)


def _trains_to_the_end(corpus, out, capsys, steps: int) -> None:
    """ddpd-train of `steps` steps exits 0, says it is done and leaves the last step's checkpoint."""
    code, stdout, err = run_cli(capsys, "planner", "--data", corpus, "--out", out, "--steps", str(steps),
                                "--no-progress", *TINY_CLI)
    assert code == 0 and err == "", err
    assert f"done: step {steps}" in stdout
    assert load_checkpoint(out, train_state=True).train_state[1]["step"] == steps


@pytest.mark.integration
def test_a_signal_while_a_resume_loads_its_checkpoint_is_one_line(corpus, tmp_path, capsys, monkeypatch):
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    read_weights = ckpt._read_weights

    def signalled_while_reading(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        return read_weights(*args)

    monkeypatch.setattr(ckpt, "_read_weights", signalled_while_reading)
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 128 + signal.SIGTERM
    assert err == "ddpd-train: interrupted by SIGTERM; training had not started, nothing was written\n"
    assert os.listdir(tmp_path) == ["p"]  # no lock, no temporary


@pytest.mark.integration
def test_a_resumed_run_interrupted_before_its_first_save_names_the_checkpoint_it_resumed(corpus, tmp_path, capsys,
                                                                                        monkeypatch):
    """Two signals in the first step of a resumed run: the second interrupts at once, and the
    line names the checkpoint the run resumed from, still intact, and how to continue."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    optimizer_step = Trainer._optimizer_step

    def signalled_twice(self):
        os.kill(os.getpid(), signal.SIGTERM)  # graceful: stop after this step
        os.kill(os.getpid(), signal.SIGTERM)  # the second interrupts here
        return optimizer_step(self)

    monkeypatch.setattr(Trainer, "_optimizer_step", signalled_twice)
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 128 + signal.SIGTERM and err.count("\n") == 1, err
    assert err.startswith(f"ddpd-train: interrupted by SIGTERM; the checkpoint of step 2 in {out} is intact; "
                          "continue with: ddpd-train planner"), err
    assert load_train_state(out)[1]["step"] == 2 and os.listdir(tmp_path) == ["p"]


@pytest.mark.integration
def test_a_second_writer_is_refused_while_a_run_holds_the_output(corpus, tmp_path):
    out = tmp_path / "p"
    first = _start_training(corpus, out, "--save-every", "5")
    lines = Lines(first.stdout)
    try:
        lines.wait_for("step      10")  # the checkpoint of step 5 is written before step 6 starts
        for extra in ([], ["--resume"]):
            second = subprocess.run([sys.executable, "-m", "ddpd.cli.train", "planner", "--data", corpus, "--out",
                                     str(out), "--steps", "1000000", "--eval-every", "5", *TINY_CLI, *extra],
                                    capture_output=True, text=True, env=ONE_THREAD_ENV, timeout=HANG_GUARD_SECONDS)
            assert second.returncode == 1, second.stderr
            assert len(second.stderr.strip().splitlines()) == 1
            assert f"being written by pid {first.pid} on " in second.stderr, second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=HANG_GUARD_SECONDS)
    assert first.returncode == 128 + signal.SIGTERM


@pytest.mark.integration
@pytest.mark.parametrize("signals", [1, 2])
def test_signals_while_closing_after_a_lost_peer_keep_the_one_line(corpus, tmp_path, capsys, monkeypatch, signals):
    """torchrun sends SIGTERM to process 0 after a peer died, possibly while the trainer closes
    after the lost collective: the first signal there stays graceful, so the one line is the
    lost peer's, with what was kept; a second one interrupts, with what was kept too (it used
    to end in a bare `interrupted by SIGTERM`)."""
    from ddpd.training.distributed import PeerLost
    from ddpd.training.trainer import Trainer

    def lose_a_peer(self, *args, **kwargs):
        raise PeerLost(RuntimeError("Connection closed by peer. More advice"))

    close = Trainer.close

    def close_under_signals(self, wait=True):
        for _ in range(signals):
            os.kill(os.getpid(), signal.SIGTERM)
        close(self, wait=wait)

    monkeypatch.setattr(Trainer, "train", lose_a_peer)
    monkeypatch.setattr(Trainer, "close", close_under_signals)
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "p", "--steps", 4, *TINY_CLI)
    assert err.count("\n") == 1, err
    if signals == 1:
        assert code == 1 and err.startswith("ddpd-train: error: another process of the group failed or was killed "
                                            "(Connection closed by peer)"), err
    else:
        assert code == 128 + signal.SIGTERM and err.startswith("ddpd-train: interrupted by SIGTERM"), err
    assert err.rstrip().endswith("; no checkpoint was written"), err


@pytest.mark.integration
def test_a_peer_lost_at_the_final_barrier_says_what_was_kept(corpus, tmp_path, capsys, monkeypatch):
    """The final barrier of a torchrun can meet a peer already gone: the one line says so and
    names the checkpoint the run saved, as a peer lost during the steps does."""
    from ddpd.training.distributed import Distributed, PeerLost

    def lost_at_the_barrier(self, wait=True):
        raise PeerLost(RuntimeError("Connection closed by peer. More advice"))

    monkeypatch.setattr(Distributed, "close", lost_at_the_barrier)
    out = tmp_path / "p"
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", out, "--steps", 2, "--no-progress", *TINY_CLI)
    assert code == 1 and err == ("ddpd-train: error: another process of the group failed or was killed (Connection "
                                 f"closed by peer); the checkpoint of step 2 in {out} is intact; continue with: "
                                 f"ddpd-train planner --out {out} --resume --threads 1\n"), err
    assert os.listdir(tmp_path) == ["p"]  # the lock released


def _torchrun_training(corpus, out, *extra, **popen):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
               "ddpd.cli.train", "planner", "--data", corpus, "--out", str(out), "--eval-every", "5", *TINY_CLI, *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ONE_THREAD_ENV,
                            preexec_fn=default_signals, **popen)


@pytest.mark.integration
def test_a_refusal_on_process_0_ends_a_torchrun_in_one_line(corpus, tmp_path):
    """Only process 0 takes the lock and checks the output: its refusal used to close with a
    barrier the other process, inside a collective of the setup, never reached (a hang)."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    proc = _torchrun_training(corpus, out, "--steps", "20")
    _, err = proc.communicate(timeout=HANG_GUARD_SECONDS)
    assert proc.returncode != 0
    errors = [line for line in err.splitlines() if line.startswith("ddpd-train: error:")]
    assert len(errors) == 1 and "already holds a checkpoint" in errors[0], err


@pytest.mark.integration
def test_an_interrupted_torchrun_says_how_to_resume_it(corpus, tmp_path):
    """The resume hint of a run of two processes is a torchrun of two (one process is refused)."""
    out = tmp_path / "p"
    proc = _torchrun_training(corpus, out, "--steps", "1000000", "--save-every", "5")
    Lines(proc.stdout).wait_for("step       5")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG_GUARD_SECONDS)
    hints = [line for line in err.splitlines() if "continue with:" in line]
    assert len(hints) == 1, err
    assert hints[0].endswith(f"continue with: torchrun --nproc_per_node 2 -m ddpd.cli.train planner --out {out} "
                             "--resume --threads 1"), err


@pytest.mark.integration
def test_a_torchrun_with_a_killed_process_ends_in_one_line(corpus, tmp_path):
    """kill -9 of process 1 mid-training: process 0 used to end in a gloo traceback raised by
    DDP's backward; it says what happened and how to continue, in one line (or, when torchrun's
    SIGTERM reaches it first, as any interrupted run)."""
    out = tmp_path / "p"
    proc = _torchrun_training(corpus, out, "--steps", "1000000", "--save-every", "5")
    try:
        Lines(proc.stdout).wait_for("step      10")  # the checkpoint of step 5 is written before step 6 starts
        os.kill(torchrun_worker(proc.pid, 1), signal.SIGKILL)
        _, err = proc.communicate(timeout=HANG_GUARD_SECONDS)
    finally:
        proc.kill()
    assert "[rank0]" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("ddpd-train:")]
    assert len(lines) == 1, err
    assert "another process of the group failed or was killed" in lines[0] or "interrupted by SIGTERM" in lines[0], err
    assert lines[0].endswith(f"continue with: torchrun --nproc_per_node 2 -m ddpd.cli.train planner --out {out} "
                             "--resume --threads 1"), err
    assert load_train_state(out)[1]["step"] >= 5


def _checkpoint_at_step_2(corpus, out, **changes):
    with Trainer(config(corpus, out, steps=20, save_every=2, **changes)) as trainer:
        trainer.train(stop_at=2)


def test_a_resume_stays_on_its_device_and_refuses_another_kind(corpus, tmp_path, capsys):
    """--resume ran on `auto` whatever the run's --device, and a run of one device kind failed
    on another with a message about a missing or malformed generator state."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out, device="cpu")
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 0, err
    assert read_config(out)["training"]["device"] == "cpu"  # the run's, not auto
    out = tmp_path / "q"
    _checkpoint_at_step_2(corpus, out)
    _rewrite_state(out, drop=lambda t: t.update({"rank0.rng.cuda": torch.zeros(16, dtype=torch.uint8)}))
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 1 and err.count("\n") == 1, err
    assert f"cannot resume {out} on cpu: the run trained on cuda, where its random generators' states resume " \
           "(--device cuda)" in err, err
    with pytest.raises(ValueError) as refused:  # the Python API's words: a setting, not a flag
        Trainer(config(corpus, out, steps=20, save_every=2), resume=True)
    assert str(refused.value) == f"cannot resume {out} on cpu: the run trained on cuda, where its random generators' " \
                                 "states resume (device='cuda')"


def test_a_resume_given_the_default_min_lr_continues_the_run(corpus, tmp_path, capsys):
    """A run without --min-lr records None (lr / 10); --resume --min-lr of that value was refused
    as a change ("--min-lr (None -> 0.0003)"). It is the same schedule, bit for bit; another
    value, or a --max-time where the run had no limit, is still a change."""
    import shutil

    _checkpoint_at_step_2(corpus, tmp_path / "p")
    shutil.copytree(tmp_path / "p", tmp_path / "q")
    assert read_config(tmp_path / "p")["training"]["min_lr"] is None
    for flags, refused in ((["--min-lr", "2e-4"], "--min-lr (None -> 0.0002)"),
                           (["--max-time", "60"], "--max-time (None -> 60.0)")):
        code, _, err = run_cli(capsys, "planner", "--out", tmp_path / "p", "--resume", *flags, "--no-progress")
        assert code == 2 and f"changed settings: {refused}; leave" in err, err
    code, _, err = run_cli(capsys, "planner", "--out", tmp_path / "p", "--resume", "--min-lr", "3e-4", "--no-progress")
    assert code == 0, err  # 3e-4 is lr / 10 = 3e-3 / 10 as written (the division is one ulp below)
    code, _, err = run_cli(capsys, "planner", "--out", tmp_path / "q", "--resume", "--no-progress")
    assert code == 0, err
    assert read_config(tmp_path / "p")["training"]["min_lr"] is None
    assert (tmp_path / "p" / "model.safetensors").read_bytes() == (tmp_path / "q" / "model.safetensors").read_bytes()


def test_a_resume_given_lr_over_10_changes_a_min_lr_the_run_set_itself(corpus, tmp_path):
    """lr / 10 given stands for the default min_lr of a run that recorded None; a run that
    set its own min_lr keeps it, and lr / 10 is then a change of its schedule."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out, min_lr=5e-5)
    with pytest.raises(ResumeConflict, match=r"changed settings: min_lr \(5e-05 -> 0.0003\)$"):
        Trainer(config(corpus, out, steps=20, save_every=2, min_lr=3e-4), resume=True)


@pytest.mark.parametrize("name, run, given", [("ema", 0.5, 0.9), ("warmup", 4, 2), ("grad_clip", 1.0, 0.5)])
def test_a_resume_given_another_update_rule_is_refused_naming_it(corpus, tmp_path, name, run, given):
    """A resume is the same run: another EMA decay, warmup or clip would change its updates unasked."""
    _checkpoint_at_step_2(corpus, tmp_path / "p", **{name: run})
    with pytest.raises(ResumeConflict) as refused:
        Trainer(config(corpus, tmp_path / "p", steps=20, save_every=2, **{name: given}), resume=True)
    assert refused.value.changed == [(name, run, given)]


def _rewrite_state(out, meta_change=None, drop=None):
    """Change the training state as a careful attacker would: digests recomputed."""
    import hashlib

    from safetensors.torch import load_file as load, save_file as save

    config = json.loads((out / "config.json").read_text())
    if meta_change is not None:
        meta = json.loads((out / "train_state.json").read_text())
        meta_change(meta)
        (out / "train_state.json").write_text(json.dumps(meta))
    if drop is not None:  # a tensor's name to drop, or a change of the tensors
        tensors = load(out / "train_state.safetensors")
        drop(tensors) if callable(drop) else tensors.pop(drop)
        save(tensors, out / "train_state.safetensors")
    for name in ("train_state.json", "train_state.safetensors"):
        config["sha256"][name] = hashlib.sha256((out / name).read_bytes()).hexdigest()
    (out / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("change, drop, message", [
    (lambda m: m.update(step=1450.5), None, "'step' must be an int in \\[0, 20\\], got 1450.5"),
    (lambda m: m.update(step=-5), None, "'step' must be an int in \\[0, 20\\], got -5"),
    (lambda m: m.update(step=10**6), None, "'step' must be an int in \\[0, 20\\], got 1000000"),
    (lambda m: m.update(step=21), None, "'step' must be an int in \\[0, 20\\], got 21"),
    (lambda m: m.update(step="12"), None, "'step' must be an int"),
    (lambda m: m.update(step=True), None, "'step' must be an int in \\[0, 20\\], got True"),
    (lambda m: m.update(history=None), None, "'history' must be a list"),
    (lambda m: m["history"][0].update(val_loss="2.5"), None, "'history' must be a list of records with a 'step' "
     "and numeric losses"),
    (lambda m: m.update(pending_losses=["x", 1.0]), None, "'pending_losses' must be a list of numbers"),
    (lambda m: m.update(train_seconds=-1), None, "'train_seconds' must be a finite number"),
    (lambda m: m.update(train_seconds=math.inf), None, "'train_seconds' must be a finite number"),
    (lambda m: m.update(pending_terms=[512.0]), None, "'pending_terms' must be a list of 2 counts > 0"),
    (lambda m: m.update(pending_terms=[512.0, 0.0]), None, "'pending_terms' must be a list of 2 counts > 0"),
    (None, "rank0.rng.noise", "lacks rank0.rng.noise"),
    (None, "optim.0.exp_avg", "lacks optim.0.exp_avg"),
    (None, lambda t: t["optim.0.exp_avg"].view(-1)[0].fill_(float("nan")),  # NaN weights after the next step
     "holds NaN or infinite values in optim.0.exp_avg"),
    (lambda m: m["optimizer_param_groups"][0].update(betas="x"), None,  # failed at the first step, unnamed
     "does not fit this run: train_state.json's optimizer group 0 has \\{'betas': 'x'"),
    (lambda m: m["optimizer_param_groups"][1].update(eps=0.5), None, "optimizer group 1 has .*'eps': 0.5"),
    (lambda m: m["optimizer_param_groups"][0].update(maximize=True), None,  # resumed, then ascended the loss
     "optimizer group 0 has .*'maximize': True"),
    (lambda m: m["optimizer_param_groups"][1].update(fused=True), None, "optimizer group 1 has .*'fused': True"),
    (None, lambda t: t["optim.0.exp_avg_sq"].view(-1)[0].fill_(-1e-3),  # a NaN loss two steps later
     "holds negative values in optim.0.exp_avg_sq \\(at least -0.001\\), which a second moment cannot hold"),
    (None, lambda t: t["optim.1.step"].fill_(-1.0), "holds negative values in optim.1.step"),
])
def test_damaged_training_state_is_refused_in_one_line(corpus, tmp_path, capsys, change, drop, message):
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    _rewrite_state(out, change, drop)
    with pytest.raises(CheckpointError, match=message):
        Trainer(config(corpus, out, steps=20, save_every=2), resume=True)
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 1 and err.count("\n") == 1 and "train_state" in err, err


def test_a_state_of_another_number_of_processes_is_refused(corpus, tmp_path):
    """Each process resumes its own RNG and data streams: a state of 2 processes cannot continue on 1."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    _rewrite_state(out, lambda m: m.update(world_size=2))
    with pytest.raises(ValueError, match=r"exactly: it was written by 2 process\(es\), this run has 1"):
        Trainer(config(corpus, out, steps=20, save_every=2), resume=True)


def test_optimizer_groups_of_an_earlier_torch_resume(corpus, tmp_path):
    """Groups saved without AdamW's later keys (maximize, foreach, ...) take AdamW's defaults,
    the settings this run has: they resume."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    later = ("maximize", "foreach", "capturable", "differentiable", "fused", "decoupled_weight_decay")
    # pop(key, None): an older torch's AdamW may not have saved every one of them
    _rewrite_state(out, lambda meta: [g.pop(key, None) for g in meta["optimizer_param_groups"] for key in later])
    assert not any(key in group for group in load_train_state(out)[1]["optimizer_param_groups"] for key in later)
    with Trainer(config(corpus, out, steps=20, save_every=2), resume=True) as trainer:
        assert trainer.step == 2 and not trainer.optimizer.param_groups[0]["maximize"]


def test_a_checkpoint_without_term_counts_resumes_with_a_plain_mean_of_its_pending_losses(corpus, tmp_path):
    """A checkpoint of an earlier release keeps its pending step losses but not their term
    counts: the interval they belong to is a plain mean of its steps, the next ones pool."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out, eval_every=3)
    _rewrite_state(out, lambda meta: meta.pop("pending_terms"))
    with Trainer(config(corpus, out, steps=20, save_every=2, eval_every=3), resume=True) as trainer:
        pending = list(trainer._losses)
        trainer.train(stop_at=4)
    _, meta = load_train_state(out)
    assert meta["history"][-1]["step"] == 3 and len(pending) == 2 and meta["pending_terms"] == [512]
    with Trainer(config(corpus, out, steps=20, save_every=2, eval_every=3), resume=True) as trainer:
        assert trainer._terms == [512]


def test_a_damaged_training_state_is_refused_before_the_corpus_is_read(corpus, tmp_path, monkeypatch):
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    _rewrite_state(out, drop=lambda t: t["optim.0.exp_avg_sq"].neg_())
    monkeypatch.setattr("ddpd.training.trainer.load_text", lambda *a: pytest.fail("the corpus was read"))
    with pytest.raises(CheckpointError, match="negative values in optim.0.exp_avg_sq"):
        Trainer(config(corpus, out, steps=20, save_every=2), resume=True)


def test_a_batch_size_no_memory_holds_is_refused_before_any_work(corpus, tmp_path, capsys, monkeypatch):
    """--batch-size 10000000 read the corpus, took the lock and reached the allocator after a
    minute (or the kernel's OOM killer)."""
    monkeypatch.setattr("ddpd.training.trainer.load_text", lambda *a: pytest.fail("the corpus was read"))
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "p", "--batch-size", 10**7)
    assert code == 2 and err.startswith("ddpd-train: error: --batch-size 10000000: a micro-batch of 10000000 x "
                                        "256 tokens needs at least 6,123 GiB (--d-model 256, 4 layers), more than "
                                        "the "), err
    assert err.endswith("; use a smaller --batch-size (--grad-accum keeps the step's size)\n"), err
    assert err.count("\n") == 1 and os.listdir(tmp_path) == []


def test_a_model_no_memory_holds_is_refused_before_any_work(corpus, tmp_path, capsys, monkeypatch):
    """--d-model 65536 --n-layers 64 reached the allocator, whose error asked for a smaller
    --batch-size; its parameters are counted from the settings, nothing is allocated."""
    monkeypatch.setattr("ddpd.training.trainer._device_memory", lambda device: 64 * 2**30)
    monkeypatch.setattr("ddpd.training.trainer.load_text", lambda *a: pytest.fail("the corpus was read"))
    with pytest.raises(ValueError, match=r"^d_model 65536 and n_layers 64: the model's 3,298,534,883,328 parameters "
                                         r"or more need at least 49,152 GiB to train \(float32 weights, gradients"):
        config(corpus, tmp_path / "p", d_model=65536, n_layers=64, batch_size=1)
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "p", "--d-model", 65536,
                           "--n-layers", 64, "--batch-size", 1)
    assert code == 2 and err.startswith("ddpd-train: error: --d-model 65536 and --n-layers 64: "), err
    assert err.endswith(", more than the 64.0 GiB of the device; use a smaller --d-model or --n-layers\n"), err
    assert err.count("\n") == 1 and os.listdir(tmp_path) == []


def test_the_ema_weights_count_in_the_memory_a_model_needs(corpus, tmp_path, monkeypatch):
    """Four float32 copies of the parameters fit 50,000 GiB, five (with the EMA's) do not."""
    monkeypatch.setattr("ddpd.training.trainer._device_memory", lambda device: 50_000 * 2**30)
    config(corpus, tmp_path / "p", d_model=65536, n_layers=64, batch_size=1)
    with pytest.raises(ValueError, match=r"need at least 61,440 GiB to train \(float32 weights, gradients, "
                                         r"AdamW's two moments, EMA weights\)"):
        config(corpus, tmp_path / "p", d_model=65536, n_layers=64, batch_size=1, ema=0.5)


def test_out_of_memory_names_the_model_size(corpus, tmp_path, capsys, monkeypatch):
    """The allocator's error only asked for a smaller --batch-size (or --num-samples, which
    ddpd-train has not), when the weights may be what does not fit."""
    def allocate(*args):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 51539607552 bytes.")

    monkeypatch.setattr("ddpd.training.trainer.build_model", allocate)
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "p", "--steps", 2)
    assert code == 1 and err.count("\n") == 1, err
    assert err.endswith("bytes.; lower --batch-size (--grad-accum keeps the step's size), --d-model or --n-layers\n")


def test_a_tiktoken_file_of_other_ranks_is_refused_naming_both_digests(corpus, tmp_path, capsys, monkeypatch):
    """--tiktoken /etc/passwd ended with tiktoken's "Hash mismatch for data downloaded from
    /etc/passwd ... Please try again", after the lock was taken and the corpus read."""
    import hashlib

    bad = tmp_path / "passwd"
    bad.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    monkeypatch.setattr("ddpd.training.trainer.load_text", lambda *a: pytest.fail("the corpus was read"))
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "p", "--tokenizer", "gpt2",
                           "--tiktoken", bad)
    assert code == 2 and err == (f"ddpd-train: error: --tiktoken {bad} is not the GPT-2 ranks file: its sha256 is "
                                 f"{hashlib.sha256(bad.read_bytes()).hexdigest()}, expected "
                                 "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930\n")
    assert not os.path.exists(tmp_path / "p")


def test_a_tiktoken_file_of_other_ranks_is_named_as_typed(corpus, tmp_path, capsys, monkeypatch):
    """--tiktoken seq_len/passwd was refused by its absolute path, where the refusals of --data
    name it as typed; from the Python API too, where data is named as given."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("seq_len")
    pathlib.Path("seq_len/passwd").write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(ValueError, match=r"^tiktoken seq_len/passwd is not the GPT-2 ranks file: its sha256 is "):
        config(corpus, "p", tokenizer="gpt2", tiktoken="seq_len/passwd")
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", "p", "--tokenizer", "gpt2", "--tiktoken",
                           "seq_len/passwd")
    assert code == 2 and err.startswith("ddpd-train: error: --tiktoken seq_len/passwd is not the GPT-2 ranks file: "
                                        "its sha256 is "), err
    assert err.count("\n") == 1 and not os.path.exists("p")


def test_a_resumed_run_keeps_its_evaluation_and_follows_its_corpus_by_content(tmp_path, capsys):
    data = tmp_path / "corpus.txt"
    data.write_text(BOOKS.read_text()[:60_000])
    out = tmp_path / "p"
    _checkpoint_at_step_2(str(data), out)
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--eval-batches", "1")
    assert code == 2 and "changed settings: --eval-batches (4 -> 1)" in err, err  # losses of another set
    moved = tmp_path / "moved.txt"
    os.rename(data, moved)  # the same text elsewhere is the same corpus
    with Trainer(config(str(moved), out, steps=20, save_every=2), resume=True) as trainer:
        trainer.train(stop_at=4)
    assert read_config(out)["training"]["data"] == str(moved)


def test_a_stop_asked_for_in_the_last_step_completes_the_run(corpus, tmp_path):
    with Trainer(config(corpus, tmp_path / "p", steps=3)) as trainer:
        original = trainer._optimizer_step

        def step():
            if trainer.step == 2:
                trainer.request_stop("SIGTERM")
            return original()
        trainer._optimizer_step = step
        trainer.train()
        assert trainer.step == 3 and trainer.stop_reason is None and trainer.stop_signal is None


def test_the_first_stop_asked_for_names_the_stop(corpus, tmp_path):
    """A second request_stop (another signal) keeps the first one's reason and signal: the exit status."""
    with Trainer(config(corpus, tmp_path / "p", steps=3)) as trainer:
        trainer.request_stop("SIGTERM")
        trainer.request_stop("SIGINT")
        assert (trainer.stop_reason, trainer.stop_signal) == ("SIGTERM", signal.SIGTERM)


def test_a_run_stopped_before_its_first_step_resumes(corpus, tmp_path):
    """A stop before any step saves step 0, whose state holds no AdamW moments yet: it resumes."""
    with Trainer(config(corpus, tmp_path / "p", steps=2, eval_every=2)) as trainer:
        trainer.request_stop("SIGTERM")
        trainer.train()
    assert load_train_state(tmp_path / "p")[1]["step"] == 0
    with Trainer(config(corpus, tmp_path / "p", steps=2, eval_every=2), resume=True) as resumed:
        assert resumed.step == 0 and [h["step"] for h in resumed.train()] == [0, 2]


def test_resume_verifies_the_weights(corpus, tmp_path, capsys):
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    data = bytearray((out / "model.safetensors").read_bytes())
    data[-3] ^= 0x01  # one flipped bit
    (out / "model.safetensors").write_bytes(bytes(data))
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 1 and err.count("\n") == 1 and "model.safetensors is corrupt (sha256" in err, err
    (out / "model.safetensors").write_bytes(bytes(data[:1000]))  # truncated
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 1 and err.count("\n") == 1 and "corrupt" in err and "Traceback" not in err, err


def test_resume_refuses_a_changed_corpus(tmp_path, capsys):
    data = tmp_path / "corpus.txt"
    data.write_text(BOOKS.read_text()[:60_000])
    out = tmp_path / "p"
    _checkpoint_at_step_2(str(data), out)
    assert read_config(out)["corpus"]["chars"] == 60_000
    data.write_text(BOOKS.read_text()[:60_000] + " and more text appended")
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 1 and err.count("\n") == 1 and "changed since the run started" in err, err
    assert err.endswith("pass allow_data_change (--allow-data-change) to resume anyway\n"), err  # not a flag twice
    code, out_text, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress",
                                  "--allow-data-change")
    assert code == 0 and "step 2 of 20" in out_text, err
    code, _, err = run_cli(capsys, "planner", "--data", data, "--out", tmp_path / "q", "--allow-data-change")
    assert code == 2 and "--allow-data-change is a setting of --resume" in err and not (tmp_path / "q").exists(), err


def test_resume_on_another_corpus_says_it_is_another(tmp_path, capsys):
    """--data books for a run trained on a file said "the corpus books changed since the run
    started": it is another corpus. Given on the command line it is a changed setting, exit
    status 2 as for --lr (and as a checkpoint without a corpus fingerprint compares --data);
    it exited 1, a failure's status, which a corpus edited since the run started keeps."""
    from ddpd.training.trainer import ResumeConflict

    data = tmp_path / "corpus.txt"
    data.write_text(BOOKS.read_text()[:60_000])
    out = tmp_path / "p"
    _checkpoint_at_step_2(str(data), out)
    code, _, err = run_cli(capsys, "planner", "--data", "books", "--out", out, "--resume", "--no-progress")
    assert code == 2 and err.count("\n") == 1, err
    assert f"the corpus books is not the one the run started on, {data} (60000 characters" in err, err
    assert "changed since" not in err and "--allow-data-change" in err
    with pytest.raises(ResumeConflict, match="is not the one the run started on") as refused:
        Trainer(config("books", out, steps=20, save_every=2), resume=True)
    assert isinstance(refused.value, CheckpointError) and refused.value.changed == [("data", str(data), "books")]


def test_resume_keeps_the_runs_reporting_settings(corpus, tmp_path):
    from ddpd.cli.train import _train_config, build_parser

    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out, eval_every=3, eval_batches=2)
    resumed = _train_config(build_parser().parse_args(["planner", "--out", str(out), "--resume"]))
    assert (resumed.save_every, resumed.eval_every, resumed.eval_batches) == (2, 3, 2)
    given = _train_config(build_parser().parse_args(["planner", "--out", str(out), "--resume", "--save-every",
                                                     "7"]))
    assert given.save_every == 7


@pytest.mark.integration
def test_resume_removes_stale_temporaries_of_killed_saves(corpus, tmp_path):
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".p.tmp-{files._HOST}-{dead}-abcdefgh"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    Trainer(config(corpus, out, steps=20, save_every=2), resume=True).close()
    assert sorted(os.listdir(tmp_path)) == ["p"]


def _dead_pid():
    return subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.integration
def test_resume_restores_the_checkpoint_a_save_killed_between_its_renames_set_aside(corpus, tmp_path, capsys):
    """Without renameat2's exchange a save moves the checkpoint aside, then the new one in: a
    save killed between the two left only `.p.old-*`, and --resume said "checkpoint directory
    not found" (only a fresh run restored it, to be told to pass --resume)."""
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    os.rename(out, tmp_path / f".p.old-{files._HOST}-{_dead_pid()}-abcdefgh")
    code, text, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 0 and "step 2 of 20" in text, err
    assert sorted(os.listdir(tmp_path)) == ["p"] and load_train_state(out)[1]["step"] == 20


@pytest.mark.integration
def test_resume_beside_a_run_yet_to_save_names_it(tmp_path, capsys):
    """A --resume beside a running trainer that had not saved yet said "checkpoint directory
    not found" instead of naming the run that writes --out."""
    out = tmp_path / "p"
    script = f"from ddpd.files import OutputLock; lock = OutputLock({str(out)!r}).acquire(); print(flush=True); input()"
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "\n"
        code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    finally:
        holder.communicate("\n", timeout=HANG_GUARD_SECONDS)
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"ddpd-train: error: {out} is being written by pid {holder.pid} on "), err


@pytest.mark.integration
def test_a_resumes_checks_leave_the_lock_of_a_run_that_exists_to_its_trainer(corpus, tmp_path):
    """Every process of a torchrun checks its command line, and process 0 may hold the run's
    lock by the time another one does: only beside a run yet to save (no --out) do the checks
    refuse a held lock; otherwise the trainer's own lock decides, on process 0."""
    from ddpd.cli.train import build_parser, check_command_line

    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    script = f"from ddpd.files import OutputLock; lock = OutputLock({str(out)!r}).acquire(); print(flush=True); input()"
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "\n"
        check_command_line(build_parser().parse_args(["planner", "--out", str(out), "--resume"]))
    finally:
        holder.communicate("\n", timeout=HANG_GUARD_SECONDS)


@pytest.mark.parametrize("exists", [False, True])
def test_a_resumes_checks_refuse_a_held_lock_only_beside_a_run_yet_to_save(tmp_path, exists):
    """The rule of the two tests above (integration: a second process holds the lock) for the
    quick loop too, where a lock taken through another open file is held as another process
    holds it: beside no --out the checks name the holder, beside one they leave it to the trainer."""
    import fcntl

    from ddpd.cli.train import build_parser, check_command_line

    out = tmp_path / "p"
    if exists:
        out.mkdir()  # all the checks look for: the trainer reads the checkpoint
    args = build_parser().parse_args(["planner", "--out", str(out), "--resume"])
    with open(files.OutputLock(out).lock_path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 4242 on elsewhere\n")  # the holder's line, written: nobody waits for it
        held.flush()
        if exists:
            check_command_line(args)
        else:
            with pytest.raises(files.OutputLockedError) as refused:
                check_command_line(args)
            assert str(refused.value).startswith(f"{out} is being written by pid 4242 on elsewhere "), refused.value


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_checkpoint(corpus, tmp_path, capsys, monkeypatch):
    out = tmp_path / "p"
    _checkpoint_at_step_2(corpus, out)
    before = (out / "model.safetensors").read_bytes()

    def full(file, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt, "_write_file", full)
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 1 and err == f"ddpd-train: error: cannot write {out}: No space left on device\n"
    assert (out / "model.safetensors").read_bytes() == before and sorted(os.listdir(tmp_path)) == ["p"]


def test_an_unwritable_out_is_refused_before_training(corpus, tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a directory")
    code, stdout, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "a-file" / "run",
                                "--no-progress")
    assert code == 1 and err.count("\n") == 1 and f"cannot write {tmp_path / 'a-file' / 'run'}" in err, err
    assert "step" not in stdout


@pytest.mark.parametrize("content, message, status", [
    # a bad input the command line names, as in ddpd-eval (docs/cli.md): it exited 1
    (b"\xfc\xfd binary", "--data file {data} is not UTF-8 text (byte 0xfc at offset 0)", 2),
    # as a missing --data (docs/cli.md): it exited 1, naming no flag
    (b"", "--data: {data} is empty", 2), (b"\n", "--data: {data} is empty", 2)])
def test_unreadable_corpora_are_named(tmp_path, capsys, content, message, status):
    data = tmp_path / "corpus.txt"
    data.write_bytes(content)
    code, _, err = run_cli(capsys, "planner", "--data", data, "--out", tmp_path / "o", "--no-progress")
    assert code == status and err.count("\n") == 1 and str(data) in err and message.format(data=data) in err, err
    assert not (tmp_path / "o").exists()


def test_cli_refuses_a_corpus_found_empty_once_read_as_a_usage_error(tmp_path, capsys):
    """A --data that only reading shows empty (a device or a pipe, /dev/null or <(true), which has
    no size to check first) or a .jsonl of blank lines exited 1, as a failure while working, where
    an empty file exits 2."""
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n \n\n")
    for data, message in [("/dev/null", "--data file /dev/null is empty"),
                          (blank, f"--data {blank} holds no record (only blank lines)")]:
        code, out, err = run_cli(capsys, "planner", "--data", data, "--out", tmp_path / "o", "--no-progress")
        assert (code, out, err) == (2, "", f"ddpd-train: error: {message}\n")
    assert sorted(os.listdir(tmp_path)) == ["blank.jsonl"]


def test_cli_refuses_a_data_it_cannot_open_as_a_usage_error(tmp_path, capsys, monkeypatch):
    """A --data that is there but that open() refuses (a UNIX socket: ENXIO) exited 1 with a bare
    "[Errno 6] No such device or address: '/abs/path'", naming neither the flag nor the path as typed."""
    monkeypatch.chdir(tmp_path)
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind("corpus.sock")
        code, out, err = run_cli(capsys, "planner", "--data", "corpus.sock", "--out", "o", "--no-progress")
    assert (code, out, err) == (2, "", "ddpd-train: error: --data corpus.sock: No such device or address\n")
    assert sorted(os.listdir(tmp_path)) == ["corpus.sock"]


def test_the_shipped_corpus_by_name(tmp_path, capsys):
    code, stdout, err = run_cli(capsys, "planner", "--data", "books", "--out", tmp_path / "o", "--steps", 1,
                                "--eval-every", 1, *TINY_CLI, "--no-progress")
    assert code == 0, err
    assert read_config(tmp_path / "o")["training"]["data"] == "books"


# ---------------------------------------------------------------- class labels


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """Two classes of records: words of a..m letters (class 0) and of n..z letters (class 1)."""
    generator = torch.Generator().manual_seed(0)
    letters = ["abcdefghijklm", "nopqrstuvwxyz"]
    lines = []
    for i in range(80):
        label = i % 2
        picks = torch.randint(0, 13, (60,), generator=generator).tolist()
        text = "".join(letters[label][p] if k % 5 else " " for k, p in enumerate(picks))
        lines.append(json.dumps({"text": text, "label": label}))
    path = tmp_path_factory.mktemp("labelled") / "two.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


class LabelSpy(Spy):
    def forward(self, x, t=None, labels=None):
        self.labels = labels
        return super().forward(x, t)


@pytest.mark.parametrize("kind", KINDS)
def test_labels_reach_the_network_with_label_dropout(labelled, tmp_path, kind):
    trainer = Trainer(config(labelled, tmp_path / kind, kind, num_classes=2, label_dropout=0.25))
    x1, labels = next(trainer.train_batches)
    assert labels.shape == (16,) and set(labels.tolist()) <= {0, 1}
    spy = LabelSpy(1 if kind == "planner" else 27)
    trainer.objective(spy, x1, torch.Generator().manual_seed(0), labels)
    assert torch.equal(spy.labels, labels)  # no dropout unless asked (evaluation)
    many = torch.zeros(4000, dtype=torch.long)
    trainer.objective(spy, x1[:1].expand(4000, -1), torch.Generator().manual_seed(1), many, 0.25)
    dropped = (spy.labels == 2).float().mean().item()  # 2: the null label
    assert set(spy.labels.tolist()) == {0, 2} and abs(dropped - 0.25) < 0.035  # 5 standard deviations


def test_a_labelled_corpus_is_held_out_alike_with_and_without_labels(tmp_path):
    """Without --num-classes the records were split 90/5/5 over the whole file, not within
    each class: an unconditional planner and a conditional denoiser of one corpus trained
    on each other's held-out records."""
    lines = [json.dumps({"text": "ab"[label] * 30 + " " + "".join("cdefghijkl"[int(d)] for d in f"{i:03d}"),
                         "label": label}) for label in (0, 1) for i in range(40)]  # sorted by class
    (tmp_path / "sorted.jsonl").write_text("\n".join(lines) + "\n")
    data, held_out = str(tmp_path / "sorted.jsonl"), []
    for classes in (0, 2):
        trainer = Trainer(TrainConfig(kind="planner", data=data, out=str(tmp_path / str(classes)),
                                      **{**TINY, "seq_len": 8, "num_classes": classes}))
        batches = [batch[0] if isinstance(batch, tuple) else batch for batch in trainer.eval_set]
        held_out.append(torch.cat(batches))
        trainer.close()
    assert torch.equal(held_out[0], held_out[1])


def test_class_conditional_training_and_its_checkpoint(labelled, tmp_path):
    trainer = Trainer(config(labelled, tmp_path / "out", "mask-denoiser", num_classes=2, label_dropout=0.1))
    before = trainer.evaluate()
    after = trainer.train()[-1]["val_loss"]
    assert after < 0.95 * before, (before, after)
    model, saved = load_model(tmp_path / "out")
    assert saved["model"]["num_classes"] == 2 and model.null_label == 2
    assert saved["training"]["num_classes"] == 2 and saved["training"]["label_dropout"] == 0.1
    # a labelled corpus without num_classes trains an unconditional model on its records
    plain = Trainer(config(labelled, tmp_path / "plain", "planner"))
    assert isinstance(next(plain.train_batches), torch.Tensor) and plain.model.null_label is None


def test_class_conditional_run_resumes_bitwise(labelled, tmp_path):
    settings = dict(kind="mask-denoiser", steps=6, batch_size=8, warmup=2, eval_every=3, eval_batches=2,
                    save_every=3, num_classes=2, label_dropout=0.5)
    Trainer(config(labelled, tmp_path / "full", **settings)).train()
    Trainer(config(labelled, tmp_path / "part", **settings)).train(stop_at=3)
    Trainer(config(labelled, tmp_path / "part", **settings), resume=True).train()
    assert_same_checkpoints(tmp_path / "full", tmp_path / "part")


@pytest.mark.parametrize("changes, message", [
    ({"label_dropout": 0.1}, "label_dropout needs num_classes > 0"),
    ({"num_classes": 2, "label_dropout": 1.0}, r"label_dropout must be in \[0.0, 1.0\)"),
    ({"num_classes": -1}, "num_classes must be >= 0"),
    ({"num_classes": 2, "data": "books"}, "num_classes needs a labelled corpus"),
])
def test_class_settings_are_checked(labelled, tmp_path, changes, message):
    data = changes.pop("data", labelled)
    with pytest.raises((TypeError, ValueError), match=message):
        config(data, tmp_path, **changes)


def test_a_corpus_without_labels_for_num_classes_is_named_as_given(corpus, tmp_path, capsys, monkeypatch):
    """The refusal named the corpus "data /abs/plain.txt", from ddpd-train too, where the user
    typed --data plain.txt: the API names the setting as given, ddpd-train the flag as typed."""
    monkeypatch.chdir(tmp_path)
    pathlib.Path("plain.txt").write_text(pathlib.Path(corpus).read_text())
    labels = 'num_classes needs a labelled corpus (a .jsonl file of {"text": str, "label": int} lines), got'
    with pytest.raises(ValueError) as refused:
        config("plain.txt", "o", num_classes=2)
    assert str(refused.value) == f"{labels} data='plain.txt'"
    code, _, err = run_cli(capsys, "planner", "--data", "plain.txt", "--out", "o", "--num-classes", 2, *TINY_CLI)
    assert (code, err) == (2, f"ddpd-train: error: --{labels.replace('num_classes', 'num-classes')} --data plain.txt\n")


def test_ddpd_train_s_refusals_leave_folders_named_after_settings_as_they_are(corpus, tmp_path, capsys,
                                                                              monkeypatch):
    """The rewrite of settings into flags ran over the paths of a refusal too: --data
    seq_len/plain.txt was named "--data --seq-len/plain.txt", an --out in runs/max_time/ as
    "runs/--max-time/"."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("seq_len")
    pathlib.Path("seq_len/plain.txt").write_text(pathlib.Path(corpus).read_text()[:60_000])
    code, _, err = run_cli(capsys, "planner", "--data", "seq_len/plain.txt", "--out", "o", "--num-classes", 2,
                           *TINY_CLI)
    assert code == 2 and err.endswith(" lines), got --data seq_len/plain.txt\n"), err
    out = tmp_path / "runs" / "max_time"
    _checkpoint_at_step_2("seq_len/plain.txt", out)
    _rewrite_state(out, drop=lambda t: t.update({"rank0.rng.cuda": torch.zeros(16, dtype=torch.uint8)}))
    code, _, err = run_cli(capsys, "planner", "--out", out, "--resume", "--no-progress")
    assert code == 1 and err.count("\n") == 1, err
    assert err.endswith(f": cannot resume {out} on cpu: the run trained on cuda, where its random generators' states "
                        "resume (--device cuda)\n"), err


def test_a_class_with_no_training_record_is_warned_about(labelled, tmp_path):
    """A class of one record: the 90/5/5 split within the class sends it to test, so the
    network would never see the class; the run says so instead of training silently."""
    lines = open(labelled).read().splitlines()
    few = tmp_path / "few.jsonl"
    few.write_text("\n".join([line for line in lines if '"label": 0' in line] + [lines[1]]) + "\n")
    assert '"label": 1' in lines[1]
    messages = []
    Trainer(config(str(few), tmp_path / "out", "mask-denoiser", num_classes=2), progress=False,
            log=messages.append)
    warnings = [m for m in messages if m.startswith("warning")]
    assert warnings == [f"warning: class 1 of data {few} has no training record of seq_len=32 tokens or more (a "
                        "class's records are split 90/5/5 in order): the network will not learn it"], messages
    messages.clear()
    Trainer(config(labelled, tmp_path / "both", "mask-denoiser", num_classes=2), progress=False, log=messages.append)
    assert not [m for m in messages if m.startswith("warning")]


def test_a_class_whose_training_records_are_all_short_is_warned_about(labelled, tmp_path):
    """A class whose records are all shorter than seq_len is in the training split, yet no
    training window holds it: the network would never see it either."""
    lines = [line for line in open(labelled).read().splitlines() if '"label": 0' in line]
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(lines + [json.dumps({"text": "short", "label": 1})] * 40) + "\n")
    messages = []
    Trainer(config(str(short), tmp_path / "out", "mask-denoiser", num_classes=2), log=messages.append).close()
    assert [m for m in messages if m.startswith("warning")] == [
        f"warning: class 1 of data {short} has no training record of seq_len=32 tokens or more (a class's records "
        "are split 90/5/5 in order): the network will not learn it"], messages


@pytest.mark.parametrize("num_classes", [2, 0])
def test_training_records_shorter_than_seq_len_are_warned_about(labelled, tmp_path, num_classes):
    """Training windows lie within one record: a corpus of half short records trained on the
    other half alone, conditional or not, without a word."""
    lines = open(labelled).read().splitlines()
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(line if i % 4 < 2 else json.dumps({"text": "short", "label": i % 2})
                               for i, line in enumerate(lines)) + "\n")
    messages = []
    Trainer(config(str(mixed), tmp_path / "out", "mask-denoiser", num_classes=num_classes),
            log=messages.append).close()
    assert [m for m in messages if m.startswith("warning")] == [
        f"warning: 36 of 72 training records of data {mixed} are shorter than seq_len=32 tokens (180 of 2340 "
        "training tokens): a training window lies within one record, so the network never trains on them (give a "
        "shorter seq_len to use them)"], messages


@pytest.mark.parametrize("folder, out", [("corpora", "o"), ("seq_len", "max_time/o")])
def test_cli_warnings_about_the_corpus_name_data_as_typed_and_the_flags(labelled, tmp_path, capsys, monkeypatch,
                                                                        folder, out):
    """ddpd-train's warnings about records shorter than --seq-len and classes never trained on
    named --data by its absolute path and said "seq_len=32", where its refusals of the same
    corpus name the path as typed and the flag; a --resume'd run's own corpus is "the run's corpus"
    at its recorded path (no --data was typed).
    Folders named after settings are paths, not flags."""
    lines = [line for line in open(labelled).read().splitlines() if '"label": 0' in line]
    monkeypatch.chdir(tmp_path)
    os.mkdir(folder)
    pathlib.Path(f"{folder}/mixed.jsonl").write_text("\n".join(
        [line if i % 2 else json.dumps({"text": "short", "label": 0}) for i, line in enumerate(lines)]
        + [json.dumps({"text": "short", "label": 1})] * 4) + "\n")
    records = "18 of 39 training records of {} are shorter than --seq-len 32 tokens (90 of 1185 training tokens)"
    for argv, data in ((["--data", f"{folder}/mixed.jsonl", "--steps", 2], f"--data {folder}/mixed.jsonl"),
                       (["--resume", "--steps", 2], f"the run's corpus {tmp_path / folder / 'mixed.jsonl'}")):
        code, log, err = run_cli(capsys, "mask-denoiser", *argv, "--out", out, "--num-classes", 2, *TINY_CLI,
                                 "--seq-len", 32, "--no-progress")
        assert code == 0, err
        assert [line for line in log.splitlines() if line.startswith("warning")] == [
            f"warning: class 1 of {data} has no training record of --seq-len 32 tokens or more (a class's records "
            "are split 90/5/5 in order): the network will not learn it",
            f"warning: {records.format(data)}: a training window lies within one record, so the network never "
            "trains on them (give a shorter --seq-len to use them)"], log


def test_labels_must_be_classes_of_the_model(labelled, tmp_path, capsys):
    code, _, err = run_cli(capsys, "planner", "--data", labelled, "--out", tmp_path / "o", "--num-classes", "1",
                           *TINY_CLI)
    assert code == 1 and err.count("\n") == 1 and "has label 1, but --num-classes 1 (labels" in err, err


def test_cli_trains_class_conditional_models_that_ddpd_sample_guides(labelled, tmp_path, capsys):
    from ddpd.cli.sample import main as sample

    for kind in ("planner", "mask-denoiser"):
        code, out, err = run_cli(capsys, kind, "--data", labelled, "--out", tmp_path / "toy" / kind, "--steps", 3,
                                 "--num-classes", 2, "--label-dropout", 0.2, *TINY_CLI, "--no-progress")
        assert code == 0, err
    toy = tmp_path / "toy"
    code = sample(["--planner", str(toy / "planner"), "--denoiser", str(toy / "mask-denoiser"),
                   "--labels", "0", "1", "--guidance-scale", "2", "--num-samples", "3", "--steps", "4",
                   "--out", str(tmp_path / "s.jsonl"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    with open(tmp_path / "s.jsonl") as f:
        assert [json.loads(line)["label"] for line in f] == [0, 1, 0]


def test_the_resume_command_is_quoted_for_the_shell(tmp_path):
    """An --out with a space gave a `continue with:` command that the shell split in two."""
    import shlex
    from types import SimpleNamespace

    from ddpd.cli.train import _resume_command

    out = str(tmp_path / "my runs" / "it's")
    for processes in (1, 2):
        trainer = SimpleNamespace(dist=SimpleNamespace(world_size=processes),
                                  config=SimpleNamespace(kind="planner", out=out))
        words = shlex.split(_resume_command(trainer))
        assert words[words.index("--out") + 1] == out and words[-3:] == ["--resume", "--threads", "1"]


def test_threads_is_a_setting_of_the_invocation_not_of_the_run(corpus, tmp_path, capsys):
    """--threads, which every resume command a stopped run prints carries, is not handed to the
    run's settings (TrainConfig refuses a setting it does not know) on a fresh run or a resume."""
    threads = str(torch.get_num_threads())
    code, _, err = run_cli(capsys, "planner", "--data", corpus, "--out", tmp_path / "p", "--steps", 2, *TINY_CLI,
                           "--threads", threads, "--no-progress")
    assert code == 0, err
    code, out, err = run_cli(capsys, "planner", "--out", tmp_path / "p", "--resume", "--threads", threads,
                             "--no-progress")
    assert code == 0 and "step 2 of 2" in out, err
    assert "threads" not in read_config(tmp_path / "p")["training"]


def test_a_process_of_a_group_on_a_gpu_takes_it_and_joins_with_nccl(monkeypatch):
    """A process whose device is a GPU makes it the current one before it joins the group, with
    nccl; a process on the CPU joins with gloo and leaves CUDA alone."""
    import ddpd.training.distributed as distributed

    calls = []
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(dist, "init_process_group", lambda backend: calls.append(("init", backend)))
    for device in (torch.device("cuda", 1), torch.device("cpu")):
        monkeypatch.setattr(distributed, "check_device", lambda name, asked, local_rank, device=device: device)
        assert distributed.Distributed(str(device)).owns_group
    assert calls == [("set_device", torch.device("cuda", 1)), ("init", "nccl"), ("init", "gloo")]


def test_close_waits_at_the_final_barrier_only_when_asked(tmp_path, monkeypatch):
    """close() meets the other processes at a barrier before it leaves the group; close(wait=False)
    leaves it at once (after a failure the others may never reach the barrier)."""
    from ddpd.training.distributed import Distributed

    init, barriers = dist.init_process_group, []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(dist, "barrier", lambda: barriers.append(True))
    for wait, name in ((False, "first"), (True, "second")):
        monkeypatch.setattr(dist, "init_process_group", lambda backend, name=name: init(
            backend, init_method=f"file://{tmp_path / name}", rank=0, world_size=1))
        group = Distributed("cpu")
        group.close(wait=wait)
        assert barriers == ([True] if wait else []) and not dist.is_initialized()


def test_data_parallel_names_the_buffers_flag_as_the_installed_torch_does(monkeypatch):
    """torch 2.13 renamed broadcast_buffers to forward_sync_buffers: the wrapper is given the name its signature has."""
    from ddpd.training.distributed import data_parallel

    class Renamed:
        def __init__(self, module, forward_sync_buffers=True):
            self.module, self.forward_sync_buffers = module, forward_sync_buffers

    class Former:
        def __init__(self, module, broadcast_buffers=True):
            self.module, self.broadcast_buffers = module, broadcast_buffers

    model = torch.nn.Linear(2, 2)
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", Renamed)
    assert data_parallel(model).forward_sync_buffers is False
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", Former)
    assert data_parallel(model).broadcast_buffers is False


def test_the_gradient_hook_remembers_a_failed_all_reduce_and_raises_it(monkeypatch):
    """A failed all-reduce of the gradients marks the hook failed and fails the bucket's future
    with the backend's error: a step never goes on with its own gradient alone."""
    from ddpd.training.distributed import GradientMean

    lost = RuntimeError("Connection closed by peer")
    future = torch.futures.Future()
    future.set_exception(lost)
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, async_op: types.SimpleNamespace(get_future=lambda: future))
    hook = GradientMean(2)
    reduced = GradientMean._reduce(hook, types.SimpleNamespace(buffer=lambda g=torch.tensor([2.0]): g))
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        reduced.wait()
    assert hook.failed
