"""The standard streams of ddpd's tools: a tool's output survives what happens to them.

- `standard_streams()`, first thing in a tool: closed stdin/stdout/stderr (`2>&-`) are
  reopened on /dev/null, and stderr is wrapped so that its failures (a full disk, a
  reader gone) lose its own lines and nothing else.
- `Stdout`: the lines a tool prints, going on without them when stdout's reader went
  away (`| head -1`) or stdout fails, and reporting the failure once the files are written.

Lowest layer: imports nothing from ddpd (the tools of ddpd.cli and `python -m
ddpd.pretrained` use it).
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Optional


class Stdout:
    """Lines for stdout that survive a reader that went away (`| head -1`) or a stdout
    that fails (a full disk): after either nothing more is printed and `closed` tells the
    tool; a failure other than the broken pipe is kept in `error` for the tool to report
    once its files are written (`check`). A progress bar on the terminal is cleared
    while a line is printed, so that none is left between the lines; characters stdout's
    encoding lacks are printed as backslash escapes."""

    def __init__(self):
        self.closed = False
        self.error: Optional[OSError] = None

    def print(self, text: str) -> None:
        """Print a line on stdout; a reader that went away is remembered, not raised.

        Args:
            text: the line.
        """
        from tqdm import tqdm

        if self.closed:
            return
        try:
            with tqdm.external_write_mode(file=sys.stdout):
                sys.stdout.write(_encodable(text, sys.stdout) + "\n")
                sys.stdout.flush()
        except OSError as err:
            self.closed = True
            if not isinstance(err, BrokenPipeError):
                self.error = err
            # Python would report the failure again when it flushes stdout at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)

    def check(self, kept: str = "") -> None:
        """OSError (one line, exit status 1) if printing failed other than by a reader
        that went away; `kept` says where the results are all the same.

        Args:
            kept: where the results are, for the message.

        Raises:
            OSError: printing failed.
        """
        if self.error is not None:
            reason = self.error.strerror or str(self.error)
            raise OSError(f"cannot write stdout: {reason}{'; ' + kept if kept else ''}")


@contextmanager
def stdout_to_stderr():
    """File descriptor 1 pointed at 2 meanwhile (what C++ code prints there goes to stderr):
    stdout carries the tools' output, and torch 2.7-2.8's gloo prints its connection to the
    peers on it when a torchrun process joins the group.

    Yields:
        None, with stdout's descriptor on stderr's (both left as they are if either is closed).
    """
    saved = None
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError):  # a stream closed: nothing to keep apart
        if saved is not None:
            os.close(saved)
            saved = None
    try:
        yield
    finally:
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _encodable(text: str, stream) -> str:
    """`text` with the characters `stream`'s encoding lacks as backslash escapes: on an ASCII or
    Latin-1 stdout (PYTHONIOENCODING, the locale) GPT-2 text or a table's '±' stopped the tool
    (ddpd-sample then published no --out)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # a stream naming no codec Python knows: left to the stream
        pass
    return text


def standard_streams() -> None:
    """A tool started with stdin, stdout or stderr closed (`2>&-`) gets /dev/null there:
    Python leaves sys.stderr None (progress bars and error lines then failed, or errors
    went to stdout), and the next file opened would take the descriptor, so that text
    written to stderr by C++ code would land in an output file."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, mode, closefd=False))
        if getattr(sys, name) is None:  # the descriptor was taken by a file opened meanwhile
            setattr(sys, name, open(os.devnull, mode))
    if not isinstance(sys.stderr, _Tolerant):
        sys.stderr = _Tolerant(sys.stderr)


class _Tolerant:
    """stderr whose failures (a full disk, a reader gone: `2>&1 | true`) lose its own
    lines and nothing else: a warning that could not be printed ended the tool before it
    published its output."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):  # ValueError: written after the stream was closed
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):  # fileno, isatty, encoding, ... of the stream
        # _stream: an instance made without __init__ (copy.copy) would recurse. Dunders: Python
        # 3.9's copy.copy took the stream's __getstate__ (StringIO's) for this object's own.
        if name == "_stream" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._stream, name)
