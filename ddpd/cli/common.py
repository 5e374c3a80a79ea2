"""What ddpd-sample, ddpd-train and ddpd-eval share: the one-line argument parser, the
device and thread policy, signals, error reporting, and loading checkpoints by role.

- Errors: one line on stderr, `PROG: error: ...`, naming the path or argument and the
  cause; exit status 2 for a bad command line, 1 for a failure while working.
- Signals: SIGINT, SIGTERM and SIGHUP interrupt like Ctrl-C; the tool cleans up, prints
  one line and exits with 128 + the signal number.
- Threads (`--threads N`): torch's intra-op threads, which ddpd._C shares; default
  $OMP_NUM_THREADS, else 1 (steady on a shared machine).
- Checks first: `check_first` checks what the command line alone decides before torch is
  imported; this module, ddpd.cli.samplers and the tools' parsers import no torch.

docs/cli.md ("Threads, signals, errors") and docs/reliability.md have the details."""
from __future__ import annotations

import argparse
import os
import re
import signal
import stat
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Optional

from ddpd._interrupts import this_tool
from ddpd.number_text import read_number, refusal

if TYPE_CHECKING:
    import torch

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class UsageError(Exception):
    """A problem with the command line or the models given: one line, exit status 2."""


class InputError(Exception):
    """An input the command line names cannot be used (a checkpoint directory that is not
    there): one line, exit status 1, as when loading it fails."""


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived; `detail` says what the tool kept."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.detail = ""


class OneLineParser(argparse.ArgumentParser):
    """Argument errors as a single line on stderr (exit status 2), no usage dump."""

    def error(self, message: str) -> None:
        """Exit with status 2 after one line on stderr, `PROG: error: MESSAGE`.

        Under torchrun only process 0 writes the line: every process parses the same command
        line (the argument types read no file), and the others' copies would repeat it.

        Args:
            message: what argparse found wrong.
        """
        self.exit(2, None if _a_helper_process() else f"{self.prog}: error: {message}\n")


def _a_helper_process() -> bool:
    """Whether torchrun's variables make this process one of a group other than process 0
    (0 < RANK < WORLD_SIZE); False where either is unset or not an int."""
    try:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return False
    return 0 < rank < world_size


def argument_type(kind: Callable[[str], object], allowed: Callable, what: str) -> Callable[[str], object]:
    """An argparse `type=` that reads a word with `kind` and keeps the values `allowed` accepts.

    Args:
        kind: int or float.
        allowed: the test a value must pass.
        what: the values allowed, for the message ("an int >= 1").

    Returns:
        The function argparse calls on the word: the value, or argparse.ArgumentTypeError
        "must be WHAT, got 'WORD'" (one usage line).
    """
    def parse(text: str):
        try:
            value = read_number(kind, text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}{refusal(err)}") from None
        if not allowed(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


def number_type(kind: type) -> Callable[[str], object]:
    """An argparse `type=` that reads `kind` as ddpd.number_text.read_number does: `int`
    itself would read `--steps 1_0` as 10 steps.

    Args:
        kind: int or float.

    Returns:
        The function argparse calls on the word: the number; argparse's own "invalid int
        value: 'x'" for a word that is none, and "must be an int, got '1_0': a number has no
        underscores or spaces" for one that Python reads but read_number refuses.
    """
    article = "an" if kind is int else "a"

    def parse(text: str):
        try:
            return read_number(kind, text)
        except ValueError as err:
            if not refusal(err):
                raise
            raise argparse.ArgumentTypeError(f"must be {article} {kind.__name__}, got {text!r}{refusal(err)}") \
                from None

    parse.__name__ = kind.__name__  # argparse names it in "invalid int value: 'x'"
    return parse


int_type, float_type = number_type(int), number_type(float)
# a corruption fraction (NaN fails both comparisons) and a count of steps, rows or threads
open_fraction = argument_type(float, lambda value: 0.0 < value < 1.0, "a number in (0, 1)")
positive_int = argument_type(int, lambda value: value >= 1, "an int >= 1")


def refused_text(data: str, err: ValueError) -> Optional[UsageError]:
    """The usage error for --data's text that is not UTF-8, is empty (a device or a pipe, which
    check_data cannot size) or that the checkpoints' tokenizer cannot encode (a ValueError of
    ddpd.training.data that names "data file PATH is not UTF-8", "... is empty" or "data FILE: "),
    or None for another error.

    Args:
        data: --data's value.
        err: the error of loading or encoding it.

    Returns:
        A UsageError naming --data (and the checkpoints' tokenizer), or None.
    """
    where, undecoded = f"data {data}: ", f"data file {os.path.abspath(data)} is not UTF-8 text "
    if str(err).startswith(undecoded):  # the loader names the file by its absolute path
        return UsageError(f"--data {data}: not UTF-8 text {str(err)[len(undecoded):]}")
    if str(err) == f"data file {os.path.abspath(data)} is empty":  # as check_data refuses an empty file
        return UsageError(f"--data: {data} is empty")
    if not str(err).startswith(where):
        return None
    return UsageError(f"--data {data}: the checkpoints' tokenizer cannot encode it: {str(err)[len(where):]}")


@contextmanager
def data_refusals(data: str) -> Iterator[None]:
    """Raise refused_text's or unopened_data's UsageError (exit status 2) for an error of reading
    --data inside the block; any other error passes as it is.

    Args:
        data: --data's value, a file's path as typed.

    Yields:
        None, inside the refusals.

    Raises:
        UsageError: --data's text is not UTF-8, empty or not encodable, or open() refused the file.
    """
    try:
        yield
    except ValueError as err:
        refused = refused_text(data, err)
        if refused is None:
            raise
        raise refused from None
    except OSError as err:  # open() refused it (a socket): a bad input, as if missing
        refused = unopened_data(data, err)
        if refused is None:
            raise
        raise refused from None


def unopened_data(data: str, err: OSError) -> Optional[UsageError]:
    """The usage error for a --data file that is there but that open() refuses (a socket: "No
    such device or address"), a bad input as a missing one is (exit status 2), or None for an
    OSError about another file.

    Args:
        data: --data's value, a file's path as typed.
        err: the error of reading it.

    Returns:
        A UsageError naming --data as typed and the reason, or None.
    """
    if err.filename is None or err.filename != os.path.abspath(data):  # the loader opens the absolute path
        return None
    return UsageError(f"--data {data}: {err.strerror or err}")


def add_runtime_arguments(parser: argparse.ArgumentParser, default=None) -> None:
    """Add --device and --threads to a parser.

    Args:
        parser: the tool's parser (or subparser).
        default: the flags' default; argparse.SUPPRESS leaves them out of the namespace when
            not given. None: --device defaults to "auto", --threads to None.
    """
    kwargs = {} if default is None else {"default": default}
    parser.add_argument("--device", help="auto (default: CUDA if available), cpu, cuda or cuda:N",
                        **({"default": "auto"} if default is None else kwargs))
    parser.add_argument("--threads", type=int_type, metavar="N",
                        help="CPU threads of torch and the ddpd ops (default: $OMP_NUM_THREADS if set, else 1)",
                        **kwargs)


MAX_THREADS = 1024  # torch.set_num_threads(100000) ends the process with a segmentation fault
# ddpd.models.DTYPE_CHOICES, here without importing torch (a test holds the two equal)
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def check_seed(seed: Optional[int]) -> None:
    """Check --seed (if given) is in [0, 2**63), the range every tool takes (ddpd-train's
    TrainConfig refuses more).

    Args:
        seed: the --seed value, or None.

    Raises:
        UsageError: out of range.
    """
    if seed is not None and not 0 <= seed < 2**63:
        raise UsageError(f"--seed must be in [0, 2**63), got {seed}")


def check_threads(threads: Optional[int]) -> None:
    """Check --threads (if given) is in range, or else OMP_NUM_THREADS (if set) is a positive int.

    Args:
        threads: the --threads value, or None.

    Raises:
        UsageError: either is out of range.
    """
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
            raise UsageError(f"--threads must be in [1, {MAX_THREADS}], got {threads}")
    elif os.environ.get("OMP_NUM_THREADS"):  # a value OpenMP cannot use means every core to it
        first = os.environ["OMP_NUM_THREADS"].split(",")[0].strip()
        if not first.isdigit() or int(first) < 1:
            raise UsageError(f"OMP_NUM_THREADS must be a positive int (or unset, or --threads given), got "
                             f"{os.environ['OMP_NUM_THREADS']!r}")


def apply_threads(threads: Optional[int]) -> int:
    """Set torch's intra-op threads (shared by the C++ ops) by the policy of this module.

    Args:
        threads: the --threads value, or None ($OMP_NUM_THREADS if set, else 1).

    Returns:
        The threads torch now uses.

    Raises:
        UsageError: as check_threads.
    """
    import torch

    check_threads(threads)
    if threads is not None:
        torch.set_num_threads(threads)
    elif not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)  # torch honours OMP_NUM_THREADS itself when it is set
    return torch.get_num_threads()


def resolve_device(name: str) -> torch.device:
    """The torch.device of --device.

    Args:
        name: "auto", "cpu", "cuda" or "cuda:N".

    Returns:
        The torch.device.

    Raises:
        UsageError: a device name check_device refuses.
    """
    from ddpd.validation import check_device

    try:
        return check_device("--device", name)
    except (TypeError, ValueError) as err:
        raise UsageError(str(err)) from None


def check_checkpoints(*paths: Optional[str]) -> None:
    """Raise InputError, with the message loading would give, for a checkpoint directory
    given that is not there or not a directory.

    Args:
        *paths: checkpoint directories, or None where not given.

    Raises:
        InputError: a path that is not an existing directory.
    """
    for path in paths:
        if path is None or os.path.isdir(path):
            continue
        what = "path is not a directory" if os.path.exists(path) else "directory not found"
        raise InputError(f"checkpoint {what}: {path}")


def check_data(source: str) -> None:
    """A --data that names no corpus: neither a readable file nor a corpus that needs none.

    Args:
        source: the flag's value.

    Raises:
        UsageError: a missing file, a directory, an empty file, an `hf:` without a name.
    """
    from ddpd.training.sources import resolve_source

    try:
        path = resolve_source(source)
    except (FileNotFoundError, ValueError) as err:
        raise UsageError(f"--data: {err}") from None
    if os.path.isdir(path):
        raise UsageError(f"--data: {source} is a directory, not a text file")
    if os.path.isfile(path) and _holds_no_text(path):  # as unusable as a missing one (the loader drops a final "\n")
        raise UsageError(f"--data: {source} is empty")


def _holds_no_text(path: str) -> bool:
    if os.path.getsize(path) > 1:
        return False
    with open(path, "rb") as f:
        return f.read() in (b"", b"\n")


def check_first(prog: str, check: Callable[[], None]) -> Optional[int]:
    """Run `check`, the checks of the command line alone, before torch is imported.

    Args:
        prog: the tool's name, for the message.
        check: the checks, a function of no arguments.

    Returns:
        None if it passes, else the exit status after its one line on stderr (2: UsageError,
        1: an input or output that cannot be used).
    """
    try:
        check()
        return None
    except UsageError as err:
        status, message = 2, one_line(err)
    except (InputError, OSError) as err:
        status, message = 1, one_line(err)
    print(f"{prog}: error: {message}", file=sys.stderr)
    return status


def refuse_empty_paths(args: argparse.Namespace, *names: str) -> None:
    """Refuse an output path given as '' (--out, --out-dir): an empty --out read as "no output"
    wrote nothing and exited 0, an empty --out-dir wrote into the working directory.

    Args:
        args: the parsed command line.
        *names: the dests of the path flags to check.

    Raises:
        UsageError: one of them is ''.
    """
    for name in names:
        if getattr(args, name, None) == "":
            raise UsageError(f"--{name.replace('_', '-')} must be a path, got ''")


def refuse_outputs_over_inputs(outputs: Sequence[tuple[str, str]], files: Sequence[tuple[str, str]] = (),
                               checkpoints: Sequence[tuple[str, str]] = ()) -> None:
    """Refuse an output that would replace what the run reads: an input file (`compare
    q/sweep.csv --out q/sweep.csv` turned the sweep into Markdown), or a path inside a
    network's checkpoint directory it loads (`--out b/planner/config.json`); beside the networks
    of a pair's directory (`--out b/samples.jsonl`) is fine. Nor may an output be the file stdout
    or stderr goes to (`--out /dev/stdout > r.txt`): its rename replaced r.txt, losing the lines
    printed there. Paths are compared as they resolve: symbolic links followed, hard links by
    their file.

    Args:
        outputs: (the flag and value naming it, path) of every file the run writes.
        files: (name, path) of every input file.
        checkpoints: (name, path) of every checkpoint directory read.

    Raises:
        UsageError: naming the output and the input.
    """
    for label, out in outputs:
        target = os.path.realpath(out)
        for name, path in files:
            if os.path.realpath(path) == target or _same_file(out, path):
                raise UsageError(f"{label} would replace {name}, which this run reads; write it elsewhere")
        for name, path in checkpoints:
            if any(os.path.commonpath([root, target]) == root for root in _network_dirs(path)):
                raise UsageError(f"{label} is inside {name}, a checkpoint this run reads; write it elsewhere")
        for stream, fd in (("stdout", 1), ("stderr", 2)):
            if _is_open_on(out, fd):
                raise UsageError(f"{label} is the file {stream} goes to; write it elsewhere")


def _network_dirs(path: str) -> list[str]:
    """The directories of the networks a checkpoint path holds, resolved: the path itself where
    it holds a config.json (one network), else its subdirectories that do (a pair's), else the
    path (nothing to tell by: all of it counts)."""
    root = os.path.realpath(path)
    if os.path.isfile(os.path.join(root, "config.json")):
        return [root]
    subs = [entry.path for entry in os.scandir(root) if entry.is_dir()] if os.path.isdir(root) else []
    return [sub for sub in subs if os.path.isfile(os.path.join(sub, "config.json"))] or [root]


def _is_open_on(path: str, fd: int) -> bool:
    """Whether `path` is the regular file open on descriptor `fd` (a pipe or terminal is
    refused as an output anyway, by ddpd.files)."""
    try:
        opened = os.fstat(fd)
        return stat.S_ISREG(opened.st_mode) and os.path.samestat(os.stat(path), opened)
    except OSError:  # the path is not there (yet), or the descriptor is closed
        return False


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one is not there (yet)
        return False


def flag_error(err: BaseException, flags: Sequence[str], paths: Sequence[str] = ()) -> UsageError:
    """A setting refused by a layer below ("lr must be ...", "TransformerConfig.d_model:
    expected ...") as a UsageError naming its flag (--lr, --d-model) when `flags` has it; so
    are the other settings the sentence names (`name=value`, or a name with an underscore:
    "label_dropout needs num_classes > 0" -> "--label-dropout needs --num-classes > 0").
    A value and the paths given are left as they are: a folder named max_time is not a flag.

    Args:
        err: the error the layer raised.
        flags: the parser's dests.
        paths: the files and folders the message may name (the run's --out, say).

    Returns:
        The UsageError (to raise).
    """
    def as_flag(match: re.Match) -> str:
        _, name, value, word = match.groups()
        if name in flags:  # "clock='exact'" -> "--clock exact"
            return f"--{name.replace('_', '-')} " + value.strip("'")
        if word in flags:  # "num_classes" -> "--num-classes"; a plain word may be prose
            return f"--{word.replace('_', '-')}"
        return match.group(0)  # a path, or a name that is no flag

    # a path as a whole (not the letters of a word, nor a setting "seq_len=64" when --data is seq_len), in
    # one pass with the settings: a path, or a flag's value, is never read again for names
    kept = "|".join(re.escape(path) for path in sorted(set(paths), key=len, reverse=True) if path) or "(?!)"
    kept = rf"(?<![\w./-])(?:{kept})(?![\w/=-]|\.\w)"
    text = re.sub(rf"({kept})|(?<![\w.-])([a-z][a-z_]*)=('[^']*'|[\w.]+)|(?<![\w.-])([a-z]+(?:_[a-z]+)+)(?![\w-])",
                  as_flag, one_line(err))
    head = re.match(r"(?:TransformerConfig\.)?([a-z][a-z_]*)\b", text)
    if head and head.group(1) in flags and not re.match(kept, text):
        text = f"--{head.group(1).replace('_', '-')}{text[head.end():]}"
    return UsageError(text)


def check_finite(name: str, value: Optional[float]) -> None:
    """Check that `value` (if given) is a finite number >= 0.

    Args:
        name: the flag's name, for the message.
        value: the value, or None.

    Raises:
        UsageError: NaN, infinite or negative.
    """
    if value is not None and not 0.0 <= value < float("inf"):  # NaN fails both comparisons
        raise UsageError(f"{name} must be a finite number >= 0, got {value}")


# ---------------------------------------------------------------- signals and errors


@contextmanager
def signals_as_interrupts(graceful: Optional[Callable[[str], bool]] = None) -> Iterator[None]:
    """Within the block SIGINT, SIGTERM and SIGHUP raise Interrupted in the main thread.
    With `graceful`, the first signal calls graceful(name) instead when it returns True
    (the tool stops at its next safe point); a second signal always raises. A signal ignored
    when the tool started stays ignored (`nohup` ignores SIGHUP, a shell's `&` SIGINT: the
    run must outlive the terminal). After the block, in a tool's own process (which then
    exits), the signals are ignored rather than handed back to Python's handlers.

    Args:
        graceful: a function of the signal's name, or None.

    Yields:
        None, with the handlers in place.

    Raises:
        Interrupted: a signal arrived.
    """
    received: list[str] = []
    _RAISED.clear()

    def handler(signum, frame):
        name = signal.Signals(signum).name
        received.append(name)
        if graceful is not None and len(received) == 1 and graceful(name):
            return
        _RAISED.append(signum)
        raise Interrupted(signum)

    try:
        with _handled_by(handler):
            yield
    finally:
        _RAISED.clear()


# The signals whose Interrupted signals_as_interrupts' handler raised (raise_swallowed_signal)
_RAISED: list[int] = []


def raise_swallowed_signal() -> None:
    """Raise Interrupted again for a signal whose Interrupted was raised but never reached
    the tool: torch.compile's guards run Python from C++ and take its exception for a failed
    guard, so the run would go on to its end. Call it at a safe point (between batches).

    Raises:
        Interrupted: such a signal arrived.
    """
    if _RAISED:
        raise Interrupted(_RAISED[0])


@contextmanager
def _handled_by(handler: Callable) -> Iterator[None]:
    """SIGNALS go to `handler` within the block, except those ignored (a signal ignored when
    the tool started stays ignored); the previous handlers are restored after it, except in
    a tool's own process, which is ending: there they stay ignored, as Python's would raise
    KeyboardInterrupt in its exit handlers (a second Ctrl-C just after the first)."""
    previous = {}
    try:
        for s in SIGNALS:
            if signal.getsignal(s) is not signal.SIG_IGN:
                previous[s] = signal.signal(s, handler)
    except ValueError:  # not the main thread: leave the signals alone
        pass
    ending = this_tool() is not None
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, signal.SIG_IGN if ending else old)


def ignore_further_signals() -> None:
    """The tool is stopping and publishes what it kept: a further signal (torchrun's SIGTERM
    after another process died, a second Ctrl-C) would interrupt that. Restored on leaving
    signals_as_interrupts (outside a tool's process: see _handled_by)."""
    try:
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass


def one_line(err: BaseException) -> str:
    """The first line of an error's message, or its class name when it has none.

    Args:
        err: the error.

    Returns:
        One line of text.
    """
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _out_of_memory(err: BaseException) -> bool:
    import torch

    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in str(err)


def run_tool(prog: str, body: Callable[[], int], value_error_status: int = 1,
             graceful: Optional[Callable[[str], bool]] = None,
             memory_hint: str = "lower --batch-size (or --num-samples), or use a smaller model") -> int:
    """Run a tool's body with signals handled, turning every expected failure into one
    line on stderr and an exit status.

    Args:
        prog: the tool's name, for the messages.
        body: the tool's work, a function of no arguments returning the exit status.
        value_error_status: the status of a ValueError or TypeError from a layer below.
        graceful: as for signals_as_interrupts.
        memory_hint: what the line of an out-of-memory error advises.

    Returns:
        The exit status: body's, 2 for a UsageError, 1 for an unusable input, an out-of-memory
        error or a failed extension build, 128 + the signal number when interrupted.

    Raises:
        RuntimeError: any other RuntimeError of the body (a bug, with its traceback).
    """
    from ddpd.checkpoint import CheckpointError
    from ddpd.training.distributed import PeerLost
    from ddpd.validation import MissingExtra

    def fail(message: str, status: int) -> int:
        print(f"{prog}: error: {message}", file=sys.stderr)
        return status

    try:
        with signals_as_interrupts(graceful), _warnings_as_lines(prog):
            return body()
    except Interrupted as stop:
        print(f"{prog}: interrupted by {stop.name}{stop.detail}", file=sys.stderr)
        return 128 + stop.signum
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except UsageError as err:
        return fail(one_line(err), 2)
    except PeerLost as err:
        return fail(f"{err}{err.detail}", 1)
    except (CheckpointError, InputError, MissingExtra, OSError, FloatingPointError) as err:
        return fail(one_line(err), 1)
    except (ValueError, TypeError) as err:  # the argument checks of the layers below
        return fail(one_line(err), value_error_status)
    except RuntimeError as err:
        if _out_of_memory(err):
            return fail(f"out of memory: {one_line(err)}; {memory_hint}", 1)
        if str(err).startswith("ddpd:"):  # the C++ extension could not be built or loaded
            return fail(one_line(err)[len("ddpd:"):].strip(), 1)
        raise


@contextmanager
def _warnings_as_lines(prog: str):
    """ddpd's own warnings (e.g. ddpd.sampling.NaNOutputWarning) as one line on stderr,
    `prog: warning: ...`, like the tools' other warnings, every time (each run that warns,
    e.g. each sampled configuration of ddpd-eval); others as Python shows them."""
    from ddpd.sampling import NaNOutputWarning

    with warnings.catch_warnings():
        warnings.simplefilter("always", NaNOutputWarning)  # a sampler's warning keys on its caller, in ddpd here
        default = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if category.__module__.split(".")[0] == "ddpd":
                print(f"{prog}: warning: {message}", file=sys.stderr)
            else:
                default(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


# ---------------------------------------------------------------- checkpoints by role


def vocabulary(config: dict) -> int:
    """The clean symbols a network reads (planner) or predicts (every other kind).

    Args:
        config: the checkpoint's config.json.

    Returns:
        The vocabulary size.
    """
    model = config["model"]
    return int(model["vocab_size"] if config["kind"] == "planner" else model["out_dim"])


def load_role(role: str, path: str, kinds: Sequence[str], device: torch.device, name: Optional[str] = None):
    """The model and config of the checkpoint `path` given for `role`.

    Args:
        role: the flag that named it (planner, denoiser, ...), for the message.
        path: the checkpoint directory.
        kinds: the model kinds the role accepts.
        device: the device to load it on.
        name: how the message names it where no --ROLE flag gave it (a bundle's directory);
            None for `--ROLE PATH`.

    Returns:
        (model, config).

    Raises:
        UsageError: its kind is not one of `kinds`.
        CheckpointError: the checkpoint cannot be loaded.
    """
    from ddpd.checkpoint import load_model

    model, config = load_model(path, str(device))
    if config["kind"] not in kinds:
        raise UsageError(f"{name or f'--{role} {path}'} holds a {config['kind']!r} model, expected "
                         f"{' or '.join(kinds)}")
    return model, config


def max_length(config: dict) -> int:
    """The longest sequence a network takes: its max_seq_len, or the default of one built from a
    config.json that does not give it (as load_model builds it).

    Args:
        config: the checkpoint's config.json.

    Returns:
        The length.
    """
    from ddpd.models.config import TransformerConfig

    return int(config["model"].get("max_seq_len", TransformerConfig.max_seq_len))


def training_length(name: str, config: dict) -> int:
    """The length a diffusion network was trained on: training.seq_len, else its max_seq_len
    (config.json, which no digest covers, is checked: an edited one is a one-line error).

    Args:
        name: the checkpoint's name, for the message.
        config: its config.json.

    Returns:
        The length, a positive int.

    Raises:
        CheckpointError: a training.seq_len that is not a positive int.
    """
    from ddpd.checkpoint import CheckpointError, training_settings

    length = training_settings(name, config).get("seq_len", max_length(config))
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise CheckpointError(f"{name}: config.json's training.seq_len is {length!r}, not a positive int")
    return length


def shared_facts(entries: Sequence[tuple[str, dict]]) -> dict[str, object]:
    """What a set of checkpoints used together must share: the vocabulary, the tokenizer and
    (diffusion models; not the AR judge) the schedule.

    Args:
        entries: (name, config) of each checkpoint.

    Returns:
        {"vocab_size", "tokenizer", "schedule", "seq_len", "seq_lens"} (seq_len: the shortest
        training length of the diffusion models, seq_lens: each one's by name).

    Raises:
        UsageError: naming the two that differ.
        CheckpointError: as training_length, or a tokenizer or schedule that cannot be used,
            naming its checkpoint.
    """
    facts: dict[str, object] = {}
    owners: dict[str, str] = {}
    lengths: dict[str, int] = {}
    for name, config in entries:
        _check_recorded(name, config)
        values = {"vocab_size": vocabulary(config), "tokenizer": config.get("tokenizer")}
        if config["kind"] != "ar":
            values["schedule"] = config.get("schedule", "linear")
            lengths[name] = training_length(name, config)
        for key, value in values.items():
            if key in facts and facts[key] != value:
                raise UsageError(f"{name} has {key} {value!r}, but {owners[key]} has {facts[key]!r}: "
                                 "they cannot be used together")
            facts.setdefault(key, value)
            owners.setdefault(key, name)
    facts["seq_len"] = min(lengths.values()) if lengths else None
    facts["seq_lens"] = lengths
    return facts


def _check_recorded(name: str, config: dict) -> None:
    """A checkpoint's tokenizer and schedule, which config.json records with no digest over
    them: an edited or damaged one is a CheckpointError naming the checkpoint."""
    from ddpd.checkpoint import CheckpointError
    from ddpd.process import get_schedule
    from ddpd.training.data import check_tokenizer_config

    try:
        if config.get("tokenizer") is not None:
            check_tokenizer_config(config["tokenizer"])
        if config["kind"] != "ar":
            get_schedule(config.get("schedule", "linear"))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{name}: config.json cannot be used: {one_line(err)}") from None


def warn_if_lengths_differ(prog: str, lengths: dict[str, int], hint: str = "") -> None:
    """Models used together run at the shortest length among them: say so on stderr when they
    differ, as the longer ones never see the length they were made for.

    Args:
        prog: the tool's name, for the message.
        lengths: each model's length by name.
        hint: text appended to the warning.
    """
    if len(set(lengths.values())) > 1:
        (short, length), *_, (long, longer) = sorted(lengths.items(), key=lambda item: item[1])
        print(f"{prog}: warning: {long} takes sequences of {longer} tokens, {short} of {length}: "
              f"using {length}{hint}", file=sys.stderr)
