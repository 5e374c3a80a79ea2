"""ddpd-train: train a planner, a denoiser, a uniform model or an AR baseline.

    ddpd-train planner --data books --out runs/planner --steps 2000
    ddpd-train mask-denoiser --data text8 --out runs/mask-denoiser      # needs `datasets` and a network
    torchrun --nproc_per_node 2 -m ddpd.cli.train mask-denoiser --data ... --out ...
    ddpd-train planner --out runs/planner --resume     # continue a stopped run
    ddpd-train mask-denoiser --data toy.jsonl --num-classes 2 --label-dropout 0.1 --out runs/toy/denoiser

--data is a text file, `books` (shipped), `text8`, hf:NAME[:CONFIG] or a labelled .jsonl;
--out is the checkpoint directory (ddpd.checkpoint.load_model loads it). --resume takes
the settings not given from the checkpoint. One run writes an --out at a time; a signal
stops after the current step with a checkpoint. docs/cli.md ("ddpd-train") and
docs/training.md have the details."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Callable, Optional

from ddpd.cli.common import (
    OneLineParser,
    UsageError,
    add_runtime_arguments,
    apply_threads,
    check_checkpoints,
    check_data,
    check_first,
    check_seed,
    check_threads,
    flag_error,
    float_type,
    int_type,
    resolve_device,
    run_tool,
    unopened_data,
)
from ddpd.files import OutputError, refuse_working_directory, remove_stale_temps
from ddpd.streams import Stdout, standard_streams

# ddpd.checkpoint's KINDS and ddpd.training.trainer's TOKENIZERS, here without importing torch (a test
# holds them equal)
KINDS = ("planner", "mask-denoiser", "uniform-denoiser", "uniform", "ar")
TOKENIZERS = ("text8", "gpt2")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ddpd-train (flags not given are left out of the namespace).

    Returns:
        The OneLineParser.
    """
    parser = OneLineParser(prog="ddpd-train", description=__doc__.split("\n\n")[0],
                           argument_default=argparse.SUPPRESS)
    parser.add_argument("kind", choices=KINDS, help="which network to train")
    parser.add_argument("--data", help="a text file (text8 format for --tokenizer text8), a labelled .jsonl file "
                                       "({\"text\", \"label\"} per line), books (shipped), text8 (downloaded with "
                                       "datasets) or hf:NAME[:CONFIG]")
    parser.add_argument("--out", required=True, help="checkpoint directory to write (or resume)")
    parser.add_argument("--steps", type=int_type, help="optimizer steps in total (default 1000)")
    parser.add_argument("--max-time", dest="max_time", type=float_type, metavar="SECONDS",
                        help="stop after this many seconds of training (evaluation and checkpoints excluded), "
                             "with the learning-rate decay finished by then (default: no limit)")
    parser.add_argument("--batch-size", dest="batch_size", type=int_type,
                        help="sequences per micro-batch and process (default 64)")
    parser.add_argument("--seq-len", dest="seq_len", type=int_type, help="tokens per sequence (default 256)")
    parser.add_argument("--d-model", dest="d_model", type=int_type, help="width of the transformer (default 256)")
    parser.add_argument("--n-layers", dest="n_layers", type=int_type, help="transformer blocks (default 4)")
    parser.add_argument("--n-heads", dest="n_heads", type=int_type, help="attention heads (default 4)")
    parser.add_argument("--dropout", type=float_type, help="dropout probability (default 0)")
    parser.add_argument("--lr", type=float_type, help="peak learning rate (default 3e-4)")
    parser.add_argument("--min-lr", dest="min_lr", type=float_type, help="final learning rate (default lr / 10)")
    parser.add_argument("--warmup", type=int_type, help="linear warmup steps (default 100)")
    parser.add_argument("--weight-decay", dest="weight_decay", type=float_type,
                        help="AdamW weight decay of the matrices (default 0.1)")
    parser.add_argument("--grad-accum", dest="grad_accum", type=int_type,
                        help="micro-batches per optimizer step (default 1)")
    parser.add_argument("--grad-clip", dest="grad_clip", type=float_type, help="max gradient norm, 0 = off (default 1)")
    parser.add_argument("--ema", type=float_type, help="EMA decay of the saved weights, 0 = off (default 0)")
    parser.add_argument("--eval-every", dest="eval_every", type=int_type,
                        help="steps between validation losses (default 100)")
    parser.add_argument("--eval-batches", dest="eval_batches", type=int_type,
                        help="validation batches per evaluation (default 16)")
    parser.add_argument("--save-every", dest="save_every", type=int_type,
                        help="steps between checkpoints (default 1000)")
    parser.add_argument("--seed", type=int_type, help="seed of the weights, data order and noise (default 0)")
    parser.add_argument("--num-classes", dest="num_classes", type=int_type, metavar="N",
                        help="class-conditional network for a labelled .jsonl corpus, labels in [0, N) (default 0: "
                             "unconditional)")
    parser.add_argument("--label-dropout", dest="label_dropout", type=float_type, metavar="P",
                        help="replace each label by the null label with probability P, for classifier-free "
                             "guidance (default 0)")
    parser.add_argument("--tokenizer", choices=TOKENIZERS, help="text8 (27 characters; the default) or gpt2")
    parser.add_argument("--tiktoken", help="another copy of the GPT-2 ranks file gpt2.tiktoken (with --tokenizer "
                                           "gpt2; default: the one shipped with ddpd)")
    add_runtime_arguments(parser, default=argparse.SUPPRESS)
    parser.add_argument("--resume", action="store_true", default=False,
                        help="continue the run whose checkpoint is in --out, exactly where it stopped, with its "
                             "settings: of the flags given, only --save-every, --eval-every, --device, --threads "
                             "and --tiktoken may differ from the run's (and --data may name its corpus moved)")
    parser.add_argument("--allow-data-change", dest="allow_data_change", action="store_true", default=False,
                        help="--resume even though the corpus changed since the run started")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=True,
                        help="no progress bar (validation losses are still printed)")
    return parser


LOCAL = ("resume", "progress", "threads", "allow_data_change")  # options of this invocation, not of the run


def _train_config(args: argparse.Namespace):
    from ddpd.checkpoint import STATE_META, CheckpointError, has_train_state, read_config, resume_settings
    from ddpd.training.trainer import TrainConfig

    given = {k: v for k, v in vars(args).items() if k not in LOCAL}
    if args.resume:  # a checkpoint a killed save had set aside is back (check_command_line)
        stored = read_config(args.out)
        if not has_train_state(args.out):  # weights only (a bundle's): its lack of a digest is not the news
            raise CheckpointError(f"cannot resume {args.out}: it holds a model's weights but no training state "
                                  f"({STATE_META}), so there is no run to continue")
        # checked against their digest; given settings win (--out, required, always is one), and
        # the run's device and how often it reports are kept unless given
        stored = resume_settings(args.out, stored)
        try:
            return TrainConfig.from_dict({**stored, **given}, data_recorded="data" not in given)
        except FileNotFoundError as err:  # the corpus the checkpoint names
            if "data" in given:
                raise
            raise FileNotFoundError(f"the run's corpus {stored.get('data')} is not there: if it moved, give its new "
                                    "place with --data (the resume checks that it is the same text)") from err
    return TrainConfig.from_dict(given)


def check_command_line(args: argparse.Namespace) -> None:
    """What the command line alone decides, checked before torch is imported (check_first):
    the corpus (--data, required unless --resume), --tiktoken, the checkpoint to resume, --out.

    Args:
        args: the parsed command line.

    Raises:
        UsageError: a missing or unusable --data or --tiktoken, a bad --threads or --seed, or an --out that
            is the working directory or holds it.
        InputError: a --resume checkpoint directory that is not there.
        ddpd.files.OutputLockedError: no checkpoint to --resume, and another run writes --out.
    """
    check_threads(getattr(args, "threads", None))
    check_seed(getattr(args, "seed", None))
    try:  # before any training: every save replaces --out by a rename
        refuse_working_directory(args.out)
    except OutputError as err:
        raise UsageError(f"--out: {err}") from None
    if args.allow_data_change and not args.resume:
        raise UsageError("--allow-data-change is a setting of --resume (a fresh run has no corpus to change)")
    if args.resume:
        # under --out's lock: a save killed between the two renames of its fallback set the
        # checkpoint aside (restored here); with none there, a run yet to save is named
        remove_stale_temps(args.out, refuse_held=not os.path.isdir(args.out))
        check_checkpoints(args.out)
    elif "data" not in args:
        raise UsageError("--data is required (the training corpus: a file, books, text8 or hf:NAME)")
    if "data" in args:
        check_data(args.data)
    if "tiktoken" in args and os.path.isdir(args.tiktoken):  # it is there: "no such file" would be wrong
        raise UsageError(f"--tiktoken: {args.tiktoken} is a directory, not the GPT-2 ranks file")
    if "tiktoken" in args and not os.path.isfile(args.tiktoken):
        raise UsageError(f"--tiktoken: no such file: {args.tiktoken}")


def _checked_config(args: argparse.Namespace):
    """The run's TrainConfig; a setting it refuses is a usage error (exit status 2) naming
    its flag. A checkpoint that cannot be read for --resume stays a CheckpointError."""
    from ddpd.checkpoint import CheckpointError

    try:
        if "device" in args:
            resolve_device(args.device)
        return _train_config(args)
    except CheckpointError:
        raise
    except (TypeError, ValueError) as err:
        raise flag_error(err, [action.dest for action in build_parser()._actions], _paths(args)) from None


def _paths(settings) -> list[str]:
    """The paths of a command line or a TrainConfig (--data, --out, --tiktoken), which the
    flags' rewrite leaves as they are."""
    return [getattr(settings, name) for name in ("data", "out", "tiktoken") if getattr(settings, name, None)]


def _in_flags(err: BaseException, paths: Sequence[str]) -> str:
    """The library's refusal of the corpus ("fewer than seq_len=256") in the command line's
    words ("fewer than --seq-len 256"), as the settings' own refusals are; `paths` (the run's)
    are left as they are."""
    return str(flag_error(err, [action.dest for action in build_parser()._actions], paths))


def _corpus_refusal(err: Exception, config, typed: Optional[str], flags: bool) -> str:
    """A refusal of the corpus, which the loader and the Trainer name by its resolved path ("data
    file /abs/c.txt is not UTF-8", "data /abs/c.txt: ... fewer than seq_len=64"), naming a given
    --data as typed, as ddpd-eval does, and a --resume'd run's own corpus as the resume's other
    refusals do ("the run's corpus PATH": no --data was typed). With `flags`, the settings after
    it by their flags; without, the rest as it is (it quotes the file, so no flag is read in it)."""
    text = str(err)
    for head in ("data file ", "data "):
        if text.startswith(head + config.data):
            rest = text[len(head + config.data):]
            named = f"the run's corpus {config.data}" if typed is None else f"--{head}{typed}"
            return named + (_in_flags(ValueError(rest), _paths(config)) if flags else rest)
    return _in_flags(err, _paths(config) + ([typed] if typed else []))


def _unopened_corpus(err: OSError, config) -> Optional[OSError]:
    """A --resume'd run's own corpus that is there but cannot be read (a directory, a socket that
    open() refuses), named as _corpus_refusal names it (a failure while working, status 1), or
    None for an OSError about another file."""
    if err.filename == config.data:
        return OSError(f"the run's corpus {config.data}: {err.strerror or err}")
    if str(err).startswith(f"data {config.data} "):
        return OSError(_corpus_refusal(err, config, None, flags=False))
    return None


def _log_in_flags(print_line: Callable[[str], None], config, typed: Optional[str]) -> Callable[[str], None]:
    """The trainer's log, its warnings and its line of a run the clock stopped naming the settings
    by their flags, and the corpus as _corpus_refusal names it in a refusal."""
    def log(line: str) -> None:
        print_line(_warning_in_flags(line, config, typed))

    return log


def _warning_in_flags(line: str, config, typed: Optional[str]) -> str:
    """A warning naming the settings by their flags ("warmup=4 >= steps=4" -> "--warmup 4 >=
    --steps 4"); one about the corpus ("class 1 of data PATH has no ... seq_len=64") naming it as
    _corpus_refusal does and the flags around it (the path is left out of that rewrite); the
    line of a run the clock stopped ("stopped by max_time ...") by its flag; any other line as
    it is (a "done:" line's --out is a path, not flags)."""
    paths = _paths(config)
    if line.startswith("stopped by "):
        return _in_flags(ValueError(line), paths)
    if not line.startswith("warning: "):
        return line
    corpus = f" of data {config.data} "
    if corpus not in line:
        return f"warning: {_in_flags(ValueError(line[len('warning: '):]), paths)}"
    before, _, after = line[len("warning: "):].partition(corpus)
    named = f"the run's corpus {config.data}" if typed is None else f"--data {typed}"
    return f"warning: {_in_flags(ValueError(before), paths)} of {named} {_in_flags(ValueError(after), paths)}"


def _check_fresh_out(out: str) -> None:
    """A fresh run's --out that no save may replace (files of someone else's, a bundle): a
    command-line mistake, refused as one (exit status 2) before the corpus is read, on every
    process (the trainer checks it again under the output's lock)."""
    from ddpd.checkpoint import CheckpointError, ensure_replaceable

    try:
        ensure_replaceable(out)
    except CheckpointError as err:
        raise UsageError(str(err)) from None


def _resume_command(trainer) -> str:
    """The command that continues the run bit for bit: as many processes (the checkpoint records
    them) and threads (torch's reductions split by them; the checkpoint does not record them),
    quoted for the shell (an --out with a space)."""
    import torch

    processes, config = trainer.dist.world_size, trainer.config
    command = ["torchrun", "--nproc_per_node", str(processes), "-m", "ddpd.cli.train"] if processes > 1 \
        else ["ddpd-train"]
    return shlex.join([*command, config.kind, "--out", config.out, "--resume", "--threads",
                       str(torch.get_num_threads())])


def _conflict_message(err) -> str:
    """A --resume given other settings than its run's, by their flags: a command-line error."""
    kinds = [(old, new) for name, old, new in err.changed if name == "kind"]
    if kinds:  # the positional argument: no flag to leave out
        return f"cannot resume {err.out}: it holds a {kinds[0][0]!r} network, not {kinds[0][1]!r}"
    flags = {action.dest: action.option_strings[0] for action in build_parser()._actions if action.option_strings}
    changed = ", ".join(f"{flags.get(name, name)} ({old!r} -> {new!r})" for name, old, new in err.changed)
    return (f"cannot resume {err.out} with changed settings: {changed}; leave those flags out to continue the "
            "run as it was")


def _kept(trainer, config) -> str:
    """What an interrupted or failed run leaves: the detail of its one line."""
    saved = trainer._saved_step
    if saved is None:
        return "; no checkpoint was written"
    return f"; the checkpoint of step {saved} in {config.out} is intact; continue with: {_resume_command(trainer)}"


def run(args: argparse.Namespace, state: dict) -> int:
    """Train (or resume) the network the command line asks for.

    Args:
        args: the parsed command line.
        state: shared with the signal handler of main: the trainer while it runs, the
            number of the signal that stopped it, and whether the run is complete.

    Returns:
        The exit status: 0, or 128 + the signal number when a signal stopped the run at a
        checkpoint (under torchrun, in every process, the signal one of them received).

    Raises:
        UsageError: a setting the configuration refuses, a --resume with changed settings, a
            fresh run into an --out that holds a checkpoint or other files, or a --data file that cannot
            be opened, is not UTF-8, that the tokenizer cannot encode or (a .jsonl) with a line that is not a
            record.
        ValueError: a corpus the settings do not fit (too short for --seq-len), naming the flags.
        Interrupted: a signal stopped the run before its checkpoint.
    """
    from ddpd.checkpoint import CheckpointError
    from ddpd.cli.common import Interrupted
    from ddpd.models import count_parameters
    from ddpd.training.data import CorpusTextError
    from ddpd.training.distributed import PeerLost
    from ddpd.training.trainer import OccupiedOutput, OtherCorpus, ResumeConflict, Trainer

    apply_threads(getattr(args, "threads", None))
    config = _checked_config(args)
    if not args.resume:
        _check_fresh_out(config.out)
    stdout = Stdout()  # a reader of the log that goes away (| head) does not stop the training
    log = _log_in_flags(stdout.print, config, getattr(args, "data", None))
    try:
        trainer = Trainer(config, resume=args.resume, progress=args.progress, log=log,
                          allow_data_change=args.allow_data_change)
    except Interrupted as stop:
        stop.detail = "; training had not started, nothing was written"
        raise
    except OtherCorpus as err:  # --data given: a changed setting, as an old checkpoint's path compared says
        raise UsageError(str(err)) from None
    except ResumeConflict as err:
        raise UsageError(_conflict_message(err)) from None
    except OccupiedOutput:  # a fresh run's command given for a run that exists: a command-line mistake
        raise UsageError(f"--out {args.out} already holds a checkpoint; pass --resume to continue it or choose "
                         "another --out") from None
    except CheckpointError:  # a damaged checkpoint names its files, not settings
        raise
    except CorpusTextError as err:
        if "data" in args:  # a bad input the command line names, as in ddpd-eval (status 2)
            raise UsageError(_corpus_refusal(err, config, args.data, flags=False)) from None
        # the run's own corpus, --resume'd: a failure while working
        raise ValueError(_corpus_refusal(err, config, None, flags=False)) from None
    except ValueError as err:  # a corpus the settings do not fit: still a failure while working (status 1)
        raise ValueError(_corpus_refusal(err, config, getattr(args, "data", None), flags=True)) from None
    except OSError as err:  # open() refused the corpus (a socket)
        refused = unopened_data(args.data, err) if "data" in args else _unopened_corpus(err, config)
        if refused is not None:
            raise refused from None
        raise
    state["trainer"] = trainer
    finished = False
    try:
        trainer.log(f"{config.kind}: {count_parameters(trainer.model):,} parameters on {trainer.device}, "
                    f"{trainer.dist.world_size} process(es), step {trainer.step} of {config.steps}")
        trainer.train()
        finished = True
        # saved at its last step (or its --max-time): a signal from here on leaves it complete
        state["complete"] = trainer.stop_reason is None
    except (Interrupted, PeerLost) as stop:
        stop.detail = _kept(trainer, config)
        raise
    finally:
        try:  # with the trainer still in state, a first signal while closing stays graceful
            trainer.close(wait=finished)  # after a failure the other processes may never reach a barrier
        except (Interrupted, PeerLost) as stop:  # a second signal (torchrun's SIGTERM after a peer was lost,
            stop.detail = _kept(trainer, config)  # say), or a peer lost at the final barrier
            raise
        finally:
            state.pop("trainer", None)
    if trainer.stop_reason is not None:
        if trainer.dist.is_main:
            print(f"ddpd-train: interrupted by {trainer.stop_reason} at step {trainer.step} of {config.steps}; "
                  f"saved a checkpoint there in {config.out}; continue with: {_resume_command(trainer)}",
                  file=sys.stderr)
        # the signal every process agreed on: under torchrun a peer's, which this process never saw
        return 128 + (trainer.stop_signal or state.get("signum", 2))
    last = trainer.history[-1] if trainer.history else {}
    val = "-" if last.get("val_loss") is None else f"{last['val_loss']:.4f}"
    trainer.log(f"done: step {trainer.step}, {trainer.val_loss_label} {val}, "
                f"{trainer.tokens_per_second:,.0f} tokens/s, checkpoint {config.out}")
    stdout.check(f"the checkpoint of step {trainer.step} is in {config.out}")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """The ddpd-train entry point.

    Args:
        argv: the arguments, or None for sys.argv[1:].

    Returns:
        The exit status.
    """
    import signal

    standard_streams()
    args = build_parser().parse_args(argv)
    status = check_first("ddpd-train", lambda: check_command_line(args))
    if status is not None:
        return status
    state: dict = {}

    def graceful(name: str) -> bool:
        """The first signal during training: stop after this step, with a checkpoint; once the
        run is complete (its final checkpoint saved), nothing to stop."""
        if state.get("complete"):
            return True
        trainer = state.get("trainer")
        if trainer is None:
            return False
        state["signum"] = int(signal.Signals[name])
        trainer.request_stop(name)
        return True

    return run_tool("ddpd-train", lambda: run(args, state), graceful=graceful,
                    memory_hint="lower --batch-size (--grad-accum keeps the step's size), --d-model or --n-layers")


if __name__ == "__main__":
    sys.exit(main())
