"""ddpd-train's command line: each flag reaches the training setting it names, with its
default, through a stand-in Trainer that records what it is given (no training)."""
import dataclasses
import types

import pytest
import torch

from ddpd.assets import BOOKS
from ddpd.checkpoint import read_config
from ddpd.cli.train import main
from ddpd.training import trainer as trainer_module
from ddpd.training.trainer import TrainConfig

SHIPPED_RANKS = BOOKS.parent / "gpt2.tiktoken"
REAL_TRAINER = trainer_module.Trainer
TINY_RUN = ("--steps", 1, "--batch-size", 2, "--seq-len", 8, "--d-model", 16, "--n-layers", 1, "--n-heads", 2,
            "--warmup", 0, "--eval-batches", 1)


class RecordingTrainer:
    """Trainer's interface as ddpd-train's run uses it: records its arguments and the threads
    torch runs on, trains nothing and ends complete at step 0."""

    made: list = []

    def __init__(self, config, resume=False, progress=False, log=None, allow_data_change=False):
        self.made.append(types.SimpleNamespace(config=config, resume=resume, progress=progress,
                                               allow_data_change=allow_data_change,
                                               threads=torch.get_num_threads()))
        self.config, self.log = config, log
        self.model = torch.nn.Linear(1, 1)
        self.device = torch.device("cpu")
        self.dist = types.SimpleNamespace(world_size=1, is_main=True)
        self.step, self.history, self.stop_reason, self.stop_signal = 0, [], None, None
        self.val_loss_label, self.tokens_per_second, self._saved_step = "val loss", 0.0, None

    def train(self):
        return self.history

    def close(self, wait=True):
        pass


@pytest.fixture
def made(monkeypatch):
    """The Trainers the command line made (the stand-in's records)."""
    monkeypatch.setattr(RecordingTrainer, "made", [])
    monkeypatch.setattr(trainer_module, "Trainer", RecordingTrainer)
    threads = torch.get_num_threads()
    yield RecordingTrainer.made
    torch.set_num_threads(threads)


def train(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_flags_not_given_leave_the_settings_at_their_defaults(made, tmp_path, capsys):
    """Only KIND, --data and --out: every other setting is TrainConfig's default, and the
    invocation's own options (--no-progress, --resume, --allow-data-change) are off."""
    code, _, err = train(capsys, "planner", "--data", "books", "--out", tmp_path / "o")
    assert code == 0, err
    (run,) = made
    assert run.config == TrainConfig(kind="planner", data="books", out=str(tmp_path / "o"))
    assert (run.resume, run.progress, run.allow_data_change) == (False, True, False)


def test_each_flag_reaches_the_setting_it_names(made, tmp_path, capsys):
    """Every flag given a value of its own (no two alike) reaches its setting and no other."""
    data = tmp_path / "labelled.jsonl"
    data.write_text('{"text": "ab", "label": 0}\n')
    ranks = tmp_path / "ranks.tiktoken"
    ranks.write_bytes(SHIPPED_RANKS.read_bytes())
    values = dict(steps=70, max_time=12.5, batch_size=3, seq_len=24, d_model=40, n_layers=2, n_heads=5,
                  dropout=0.15, lr=2e-3, min_lr=3e-5, warmup=6, weight_decay=0.05, grad_accum=4, grad_clip=0.5,
                  ema=0.9, eval_every=9, eval_batches=11, save_every=13, seed=17, num_classes=3, label_dropout=0.25,
                  tokenizer="gpt2", tiktoken=str(ranks), device="cpu")
    flags = [item for name, value in values.items() for item in (f"--{name.replace('_', '-')}", value)]
    code, _, err = train(capsys, "uniform", "--data", data, "--out", tmp_path / "o", *flags, "--threads", 2,
                         "--no-progress")
    assert code == 0, err
    (run,) = made
    recorded = run.config.to_dict()
    assert {name: recorded[name] for name in values} == values
    assert (recorded["kind"], recorded["data"], recorded["out"]) == ("uniform", str(data), str(tmp_path / "o"))
    assert (run.resume, run.progress, run.allow_data_change, run.threads) == (False, False, False, 2)
    assert {f.name for f in dataclasses.fields(TrainConfig)} - set(recorded) == set()


def test_threads_default_to_one(made, tmp_path, capsys, monkeypatch):
    """Without --threads (and $OMP_NUM_THREADS) torch runs on one thread (docs/cli.md)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    code, _, err = train(capsys, "planner", "--data", "books", "--out", tmp_path / "o")
    assert code == 0 and made[-1].threads == 1, err


def test_a_resume_takes_the_runs_settings_but_those_given(made, tmp_path, capsys, monkeypatch):
    """--resume reads the checkpoint's settings, its --device and --eval-every included, and
    overrides only the flags given; it and --allow-data-change reach the Trainer."""
    out = tmp_path / "o"
    monkeypatch.setattr(trainer_module, "Trainer", REAL_TRAINER)  # the run to resume, for real
    code, _, err = train(capsys, "planner", "--data", "books", "--out", out, *TINY_RUN, "--device", "cpu",
                         "--eval-every", 7, "--seed", 5, "--no-progress")
    assert code == 0, err
    monkeypatch.setattr(trainer_module, "Trainer", RecordingTrainer)
    code, _, err = train(capsys, "planner", "--out", out, "--resume", "--allow-data-change", "--save-every", 3)
    assert code == 0, err
    (run,) = made
    assert (run.resume, run.progress, run.allow_data_change) == (True, True, True)
    assert run.config.to_dict() == {**read_config(out)["training"], "save_every": 3}
    assert (run.config.device, run.config.eval_every, run.config.seed) == ("cpu", 7, 5)

