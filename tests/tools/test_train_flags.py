"""ddpd-train's command line: each flag reaches the training setting it names, with its
default, through a stand-in Trainer that records what it is given (no training)."""
import dataclasses
import socket
import types

import pytest
import torch

from ddpd.assets import BOOKS
from ddpd.checkpoint import read_config
from ddpd.cli.common import InputError, UsageError
from ddpd.cli.train import _resume_command, build_parser, check_command_line, main
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


@pytest.mark.parametrize("argv, error, message", [
    (["--data", "books", "--threads", "0"], UsageError, "--threads must be in [1, 1024], got 0"),
    (["--data", "books", "--allow-data-change"], UsageError,
     "--allow-data-change is a setting of --resume (a fresh run has no corpus to change)"),
    (["--resume"], InputError, "checkpoint directory not found: {out}"),
])
def test_the_command_line_alone_is_checked_before_torch_is_needed(tmp_path, argv, error, message):
    """check_command_line, which main runs before importing torch, refuses these itself: a
    later check (apply_threads, the checkpoint's reading) would say it after seconds of imports,
    or (--allow-data-change on a fresh run) not at all."""
    out = tmp_path / "o"
    args = build_parser().parse_args(["planner", "--out", str(out), *argv])
    with pytest.raises(error) as raised:
        check_command_line(args)
    assert str(raised.value) == message.format(out=out)


def test_a_tiktoken_that_is_no_regular_file_is_refused_before_any_work(made, tmp_path, capsys, monkeypatch):
    """--tiktoken naming a socket, there but not a file, is refused on the command line, not
    by the tokenizer's reading after the corpus."""
    monkeypatch.chdir(tmp_path)
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind("ranks.sock")
        code, out, err = train(capsys, "planner", "--data", "books", "--out", "o", "--tokenizer", "gpt2",
                               "--tiktoken", "ranks.sock")
    assert (code, out, err, made) == (2, "", "ddpd-train: error: --tiktoken: no such file: ranks.sock\n", [])


def test_an_error_of_another_file_than_data_is_not_named_data(made, tmp_path, capsys, monkeypatch):
    """Only an OSError about --data's own path is a refusal of --data: another file's stays
    a failure while working (status 1) naming that file."""
    other = tmp_path / "other"

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(other))

    monkeypatch.setattr(trainer_module, "Trainer", refused)
    code, _, err = train(capsys, "planner", "--data", "books", "--out", tmp_path / "o")
    assert (code, err) == (1, f"ddpd-train: error: [Errno 13] Permission denied: '{other}'\n")


def test_a_resumed_run_whose_own_corpus_became_too_short_names_it_as_recorded(tmp_path, capsys):
    """Under --resume without --data the corpus too short for --seq-len is the run's own: named
    "the run's corpus" at its recorded path (there is no --data as typed to name; it said "--data")."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(BOOKS.read_text()[:20_000])
    code, _, err = train(capsys, "planner", "--data", corpus, "--out", tmp_path / "o", *TINY_RUN, "--no-progress")
    assert code == 0, err
    corpus.write_text("abcdefgh " * 10)
    code, out, err = train(capsys, "planner", "--out", tmp_path / "o", "--resume", "--allow-data-change",
                           "--no-progress")
    assert (code, out) == (1, "")
    assert err == (f"ddpd-train: error: the run's corpus {corpus}: its validation split holds 4 tokens, fewer "
                   "than --seq-len 8; use a longer corpus or a shorter --seq-len\n")


def test_the_resume_command_carries_the_threads_the_run_used():
    """A stopped run's `continue with:` command gives the threads torch ran on (the reductions
    split by them, so a resume on other threads is not bit for bit), not a fixed number."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        trainer = types.SimpleNamespace(dist=types.SimpleNamespace(world_size=1),
                                        config=types.SimpleNamespace(kind="planner", out="runs/p"))
        assert _resume_command(trainer) == "ddpd-train planner --out runs/p --resume --threads 2"
    finally:
        torch.set_num_threads(threads)


def test_the_first_and_last_lines_name_the_step_and_a_missing_validation_loss(made, tmp_path, capsys):
    """The run opens with its size, device, processes and `step N of STEPS`, and its `done:`
    line shows `-` for a run without a validation loss, then the checkpoint."""
    out_dir = tmp_path / "o"
    code, out, err = train(capsys, "planner", "--data", "books", "--out", out_dir, "--steps", 7)
    assert code == 0, err
    assert out.splitlines() == ["planner: 2 parameters on cpu, 1 process(es), step 0 of 7",
                                f"done: step 0, val loss -, 0 tokens/s, checkpoint {out_dir}"]


class StoppedTrainer(RecordingTrainer):
    """A run a signal stopped at its step 0, with a checkpoint there."""

    stop_signal = None
    is_main = True

    def train(self):
        self.stop_reason, self.stop_signal = "SIGTERM", type(self).stop_signal
        self.dist.is_main = type(self).is_main
        return self.history


@pytest.mark.parametrize("signal_number, is_main, status", [(None, True, 130), (15, True, 143), (15, False, 143)])
def test_a_stopped_run_exits_128_plus_its_signal_and_the_main_process_says_so(made, tmp_path, capsys, monkeypatch,
                                                                            signal_number, is_main, status):
    """The exit status is 128 + the signal the processes agreed on (SIGINT's 2 when none was
    recorded); only the main process prints the `interrupted by` line."""
    monkeypatch.setattr(StoppedTrainer, "stop_signal", signal_number)
    monkeypatch.setattr(StoppedTrainer, "is_main", is_main)
    monkeypatch.setattr(trainer_module, "Trainer", StoppedTrainer)
    code, out, err = train(capsys, "planner", "--data", "books", "--out", tmp_path / "o", "--steps", 5)
    assert code == status
    said = err.startswith(f"ddpd-train: interrupted by SIGTERM at step 0 of 5; saved a checkpoint there in "
                          f"{tmp_path / 'o'}; continue with: ddpd-train planner --out")
    assert said == is_main, err
    assert "done:" not in out


def test_a_fresh_run_into_a_directory_of_other_files_is_refused_before_training(made, tmp_path, capsys):
    """A fresh --out holding files no save may replace is a command-line mistake (status 2),
    refused before a Trainer is made."""
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine\n")
    code, _, err = train(capsys, "planner", "--data", "books", "--out", tmp_path / "o")
    assert code == 2 and err.startswith("ddpd-train: error: ") and err.count("\n") == 1, err
    assert made == [] and (tmp_path / "o" / "notes.txt").read_text() == "mine\n"


def test_a_stdout_that_fails_is_an_error_naming_the_checkpoint(made, tmp_path, capsys, monkeypatch):
    """`ddpd-train ... >/dev/full`: the run goes on to its checkpoint, then exits 1 in one line
    saying where the checkpoint is."""
    with open("/dev/full", "w") as full:
        monkeypatch.setattr("sys.stdout", full)
        code = main(["planner", "--data", "books", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 1 and err == ("ddpd-train: error: cannot write stdout: No space left on device; the checkpoint of "
                                 f"step 0 is in {tmp_path / 'o'}\n"), err
    assert len(made) == 1


def test_a_resume_given_a_data_file_that_is_not_there_is_refused_before_torch_work(made, tmp_path, capsys,
                                                                                   monkeypatch):
    """--data given to a --resume (the run's corpus moved) is checked as a fresh run's is: a
    file that is not there is a usage error (status 2) naming it, and no Trainer is made."""
    out = tmp_path / "o"
    monkeypatch.setattr(trainer_module, "Trainer", REAL_TRAINER)
    code, _, err = train(capsys, "planner", "--data", "books", "--out", out, *TINY_RUN, "--no-progress")
    assert code == 0, err
    monkeypatch.setattr(trainer_module, "Trainer", RecordingTrainer)
    code, _, err = train(capsys, "planner", "--out", out, "--resume", "--data", tmp_path / "moved.txt")
    assert code == 2 and err.startswith(f"ddpd-train: error: --data: no such file: {tmp_path / 'moved.txt'} "), err
    assert err.count("\n") == 1 and made == []


def test_a_resume_s_data_as_typed_is_a_file_beside_it_not_the_corpus_name(made, tmp_path, capsys, monkeypatch):
    """A --resume's --data books, typed where a file named books is, names that file (as a fresh
    run's does); only the checkpoint's own record of `books` is the shipped corpus."""
    out = tmp_path / "o"
    monkeypatch.setattr(trainer_module, "Trainer", REAL_TRAINER)
    code, _, err = train(capsys, "planner", "--data", "books", "--out", out, *TINY_RUN, "--no-progress")
    assert code == 0, err
    monkeypatch.setattr(trainer_module, "Trainer", RecordingTrainer)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "books").write_text(BOOKS.read_text())
    code, _, err = train(capsys, "planner", "--out", out, "--resume", "--data", "books")
    assert code == 0, err
    assert made[0].config.data == str(tmp_path / "books")
    code, _, err = train(capsys, "planner", "--out", out, "--resume")
    assert code == 0, err
    assert made[1].config.data == "books"
