"""One line, not a traceback, when Ctrl-C stops a ddpd tool before the tool's own signal
handling starts: while torch and the tool's modules import, the first seconds of every
run (ddpd.cli.common.run_tool handles the rest). Only in the processes of the tools
(ddpd-sample, ddpd-train, ddpd-eval, or python -m ddpd.cli.<tool>): an uncaught
KeyboardInterrupt there prints `<tool>: interrupted`, and Python still ends the process
by SIGINT, as it does after a traceback. Other processes that import ddpd keep Python's
traceback. Light: ddpd's __init__ installs it before importing torch.

Also `signals_held`: code during which a signal handler must not raise (an import or a
checkpoint load, where an exception thrown across C++ aborts the process; a save and the
record of it, renames that publish several files) holds the signals and hands the first
to the handler in place when it ends."""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

TOOLS = {"ddpd-sample": "ddpd.cli.sample", "ddpd-train": "ddpd.cli.train", "ddpd-eval": "ddpd.cli.eval"}


def tool_name(argv0: str, orig_argv: list) -> str | None:
    """The tool a process runs: its console script's name in argv[0], or the module of -m
    among the interpreter's own options (python -m ddpd.cli.sample, as torchrun starts
    its workers); None for any other process."""
    name = os.path.basename(argv0)
    if name in TOOLS:
        return name
    module = _module_option(orig_argv)
    return next((tool for tool, path in TOOLS.items() if module == path), None)


def _module_option(orig_argv: list) -> str | None:
    """The module of -m, read from the interpreter's options as CPython parses them (option
    groups such as -um or -mddpd.cli.train, -X and -W with their argument), up to a script,
    -c or an unknown long option; None if no -m comes first."""
    words = iter(orig_argv[1:])
    for word in words:
        if word == "--check-hash-based-pycs":
            next(words, None)
            continue
        if word == "-" or not word.startswith("-") or word.startswith("--"):
            return None
        for i, char in enumerate(word[1:], start=1):
            if char == "c":
                return None
            if char in "mXW":
                argument = word[i + 1:] or next(words, None)
                if char == "m":
                    return argument
                break
    return None


def this_tool() -> str | None:
    """The tool this process runs (tool_name of its command line), or None."""
    # sys.orig_argv: Python 3.10+; with 3.9 only the console scripts are recognised
    return tool_name(sys.argv[0] if sys.argv else "", getattr(sys, "orig_argv", []))


def install() -> str | None:
    """In a tool's process, print an uncaught KeyboardInterrupt as one line; returns the
    tool's name (None in any other process)."""
    name = this_tool()
    if name is None:
        return None
    traceback = sys.excepthook

    def one_line(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt):
            print(f"{name}: interrupted", file=sys.stderr)
        else:
            traceback(kind, value, tb)

    sys.excepthook = one_line
    return name


HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextmanager
def signals_held() -> Iterator[None]:
    """Within the block SIGINT, SIGTERM and SIGHUP wait; when it ends the first of them is
    raised again, to the handler in place before (the tools' raises Interrupted there, a
    safe point). For code a handler's exception must not cut: importing torch._dynamo and
    triton runs C++ that calls back into Python, and an exception raised there ended a
    ddpd-train --resume with SIGABRT, its lock and temporaries left behind; steps whose
    halves must not be told apart (a file written and counted). Signals are handled in the
    main thread only: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list = []
    previous = {}
    for number in HELD_SIGNALS:
        handler = signal.getsignal(number)
        if handler is not signal.SIG_IGN and handler is not None:  # None: a handler not set from Python
            previous[number] = signal.signal(number, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if held:
            signal.raise_signal(held[0])
