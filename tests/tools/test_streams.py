"""The standard streams of the tools (ddpd.streams), in this process: Stdout's failures and
their report, stdout sent to stderr for a while, and the stderr whose failures lose only its
own lines. The tools' runs with closed or failing streams are in tests/tools/test_cli_sample.py."""
import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpd.streams import Stdout, _Tolerant, standard_streams, stdout_to_stderr
from hang_guard import HANG_GUARD_SECONDS

ROOT = Path(__file__).resolve().parents[2]


class FailingStream(io.StringIO):
    """A stdout whose writes fail with `error`, on a real descriptor (a file under tmp_path)."""

    def __init__(self, error: OSError, fd: int):
        super().__init__()
        self.error, self.fd, self.writes = error, fd, 0

    def write(self, text):
        self.writes += 1
        raise self.error

    def fileno(self):
        return self.fd


def failing_stdout(monkeypatch, tmp_path, error: OSError) -> FailingStream:
    fd = os.open(tmp_path / "stdout", os.O_WRONLY | os.O_CREAT)
    stream = FailingStream(error, fd)
    monkeypatch.setattr(sys, "stdout", stream)
    return stream


def test_a_reader_that_went_away_closes_stdout_and_is_no_error(monkeypatch, tmp_path):
    stream = failing_stdout(monkeypatch, tmp_path, BrokenPipeError(errno.EPIPE, "Broken pipe"))
    out = Stdout()
    out.print("a")
    assert out.closed and out.error is None
    out.print("b")  # nothing more is written once closed
    assert stream.writes == 1
    out.check("the files are in x")  # no error to report
    # the descriptor now writes to /dev/null: Python's flush at exit reports nothing again
    assert os.path.samestat(os.fstat(stream.fd), os.stat(os.devnull))
    os.close(stream.fd)


def test_each_printed_line_is_flushed_at_once(monkeypatch):
    """A reader (`| head -1`, a progress watcher) sees each line when it is printed."""
    buffer = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(buffer, encoding="utf-8"))
    Stdout().print("one")
    assert buffer.getvalue() == b"one\n"


def test_a_progress_bar_is_cleared_while_a_line_is_printed_and_drawn_again_after(monkeypatch):
    """A bar on stderr is blanked before the line goes to stdout and redrawn after it, so that
    no half bar is left in front of the line on the terminal."""
    from tqdm import tqdm

    writes = []

    class Tagged(io.StringIO):
        def __init__(self, tag):
            super().__init__()
            self.tag = tag

        def write(self, text):
            writes.append((self.tag, text))
            return len(text)

    monkeypatch.setattr(sys, "stdout", Tagged("out"))
    monkeypatch.setattr(sys, "stderr", Tagged("err"))
    bar = tqdm(total=3, file=sys.stderr, ascii=True)
    bar.update(1)
    writes.clear()
    Stdout().print("line")
    printed = list(writes)
    bar.close()
    line = printed.index(("out", "line\n"))
    assert any(tag == "err" and text.startswith("\r ") and not text.strip() for tag, text in printed[:line])
    assert any(tag == "err" and "1/3" in text for tag, text in printed[line + 1:])


def test_a_failing_stdout_is_reported_once_by_check_with_where_the_results_are(monkeypatch, tmp_path):
    stream = failing_stdout(monkeypatch, tmp_path, OSError(errno.ENOSPC, "No space left on device"))
    out = Stdout()
    out.print("a")
    out.print("b")
    assert out.closed and stream.writes == 1 and out.error.errno == errno.ENOSPC
    with pytest.raises(OSError, match=r"^cannot write stdout: No space left on device; the files are in x$"):
        out.check("the files are in x")
    with pytest.raises(OSError, match=r"^cannot write stdout: No space left on device$"):
        out.check()
    os.close(stream.fd)


def test_a_failure_without_a_strerror_is_reported_by_its_text(monkeypatch, tmp_path):
    stream = failing_stdout(monkeypatch, tmp_path, OSError("the device went away"))
    out = Stdout()
    out.print("a")
    with pytest.raises(OSError, match=r"^cannot write stdout: the device went away$"):
        out.check()
    os.close(stream.fd)


def test_stdout_goes_to_stderr_inside_the_block_and_comes_back_after(capfd):
    os.write(1, b"before ")
    with stdout_to_stderr():
        os.write(1, b"inside")
    os.write(1, b"after")
    out, err = capfd.readouterr()
    assert (out, err) == ("before after", "inside")


def test_text_buffered_for_stdout_is_flushed_there_before_the_block(capfd, monkeypatch):
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))
    sys.stdout.write("buffered")  # not flushed yet
    with stdout_to_stderr():
        os.write(1, b"inside")
    out, err = capfd.readouterr()
    assert (out, err) == ("buffered", "inside")


def test_a_closed_stdout_leaves_the_descriptors_as_they_are(capfd, monkeypatch):
    """sys.stdout closed (flush raises ValueError): no error, and descriptor 1 stays stdout."""
    closed = open(os.devnull, "w")
    closed.close()
    monkeypatch.setattr(sys, "stdout", closed)
    with stdout_to_stderr():
        os.write(1, b"still stdout")
    assert capfd.readouterr() == ("still stdout", "")


def test_without_a_sys_stdout_the_block_still_sends_stdout_to_stderr(capfd, monkeypatch):
    """sys.stdout None (a closed stdout at the start, before standard_streams): nothing to flush."""
    monkeypatch.setattr(sys, "stdout", None)
    with stdout_to_stderr():
        os.write(1, b"inside")
    os.write(1, b"after")
    assert capfd.readouterr() == ("after", "inside")


def test_the_tolerant_stderr_loses_its_own_lines_and_nothing_else():
    class Broken(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            raise ValueError("I/O operation on closed file.")

    wrapped = _Tolerant(Broken())
    assert wrapped.write("four") == 4  # as if written
    wrapped.flush()
    closed = io.StringIO()
    closed.close()
    assert _Tolerant(closed).write("ab") == 2
    working = _Tolerant(io.StringIO())
    assert working.write("abc") == 3 and working.getvalue() == "abc"


def test_a_copy_of_the_tolerant_stderr_writes_to_the_same_stream():
    """copy.copy makes the copy without __init__: looking up its dunders (__setstate__) must not
    reach the stream's own, and an instance without a stream has no attributes rather than
    recursing on the missing _stream."""
    import copy

    stream = io.StringIO()
    wrapped = _Tolerant(stream)
    again = copy.copy(wrapped)
    assert again._stream is stream and again.write("ab") == 2 and stream.getvalue() == "ab"
    assert not hasattr(wrapped, "__next__")  # the stream's dunders are not the wrapper's
    bare = _Tolerant.__new__(_Tolerant)
    with pytest.raises(AttributeError, match="_stream"):
        bare.encoding


def test_standard_streams_wraps_stderr_once(monkeypatch):
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    standard_streams()
    standard_streams()
    assert isinstance(sys.stderr, _Tolerant) and sys.stderr._stream is stderr


# Started with stderr closed: standard_streams() reopens it, prints a line to it, and says which
# descriptor stderr writes to and whether a file opened afterwards took descriptor 2.
CLOSED_STDERR = """
import os, sys
{before}
from ddpd.streams import standard_streams
standard_streams()
os.fstat(2)
sys.stderr.write("to stderr\\n")
sys.stderr.flush()
late = open(os.devnull)
print(sys.stderr.fileno(), late.fileno() == 2, opened.read() if {read} else "")
"""


@pytest.mark.parametrize("taken", [False, True])
def test_a_stderr_closed_at_the_start_is_reopened_on_dev_null(tmp_path, taken):
    """`2>&-`: descriptor 2 is opened on /dev/null and sys.stderr writes there, so that no file
    opened later takes it; where a file took it first (`taken`), sys.stderr writes to /dev/null
    instead of into that file."""
    path = tmp_path / "taken"
    path.write_text("")
    before = f"opened = open({str(path)!r}, 'r+')" if taken else "opened = None"
    script = CLOSED_STDERR.format(before=before, read=taken)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_SECONDS,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=lambda: os.close(2))
    assert done.returncode == 0, done.stderr
    fileno, late_took_two, text = done.stdout.split(" ", 2)
    assert late_took_two == "False" and text.strip() == "" and path.read_text() == ""
    if taken:
        assert fileno != "2"  # the file keeps descriptor 2: stderr is a /dev/null of its own
    else:
        assert fileno == "2"


# Started with stdin and stdout closed: standard_streams() reopens both; the script reads stdin,
# closes sys.stdout, and says on stderr what it read, whether descriptor 1 is still open and which
# descriptor a file opened afterwards takes.
CLOSED_STDIN_STDOUT = """
import os, sys
from ddpd.streams import standard_streams
standard_streams()
text = sys.stdin.read()
sys.stdout.close()
late = open(os.devnull)
sys.stderr.write(repr(text) + " " + str(os.path.samestat(os.fstat(1), os.stat(os.devnull))) + " " + str(late.fileno()))
"""


def test_a_stdin_and_stdout_closed_at_the_start_read_empty_and_outlive_their_streams(tmp_path):
    """`<&- >&-`: stdin reads as empty (not a write-only /dev/null that fails to read), and closing
    the sys.stdout made for descriptor 1 leaves the descriptor on /dev/null, so no file opened
    later takes it."""
    def close_0_and_1():
        os.close(0)
        os.close(1)

    done = subprocess.run([sys.executable, "-c", CLOSED_STDIN_STDOUT], capture_output=True, text=True,
                          timeout=HANG_GUARD_SECONDS, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          preexec_fn=close_0_and_1)
    assert done.returncode == 0, done.stderr
    assert done.stderr.split() == ["''", "True", "3"]
