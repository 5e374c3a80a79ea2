"""ddpd.files: atomic replacement, streamed output, stale temporaries, the output lock."""
import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from ddpd import files
from ddpd._interrupts import signals_held


def _entries(folder):
    return sorted(os.listdir(folder))


def test_write_text_replaces_atomically(tmp_path):
    target = tmp_path / "report.json"
    files.write_text(target, "old")
    files.write_text(target, "new")
    assert target.read_text() == "new" and _entries(tmp_path) == ["report.json"]


def test_full_disk_keeps_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    files.write_text(target, '{"complete": true}')

    def full(fd):  # a full disk shows when the data is flushed
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError) as info:
        files.write_text(target, "x" * 4096)
    assert str(info.value) == f"cannot write {target}: No space left on device"
    assert target.read_text() == '{"complete": true}' and _entries(tmp_path) == ["report.json"]


def test_enospc_from_the_file_object_names_the_destination(tmp_path, monkeypatch):
    target = tmp_path / "s.jsonl"
    out = files.StreamedFile(target)

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    out._file = Full()
    with pytest.raises(files.OutputError, match=f"cannot write {target}: No space left on device"):
        out.write("line\n")
    out.discard()
    assert _entries(tmp_path) == []


def test_an_oserror_inside_an_atomic_file_names_the_destination(tmp_path):
    """What the file object raises inside the block (a full disk on write) is an OutputError
    naming the destination; the previous file stays and the temporary goes."""
    target = tmp_path / "report.json"
    files.write_text(target, "old")
    with pytest.raises(files.OutputError, match=f"cannot write {target}: No space left on device"):
        with files.atomic_file(target) as f:
            f.write("new")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert target.read_text() == "old" and _entries(tmp_path) == ["report.json"]


def test_a_failed_publish_deletes_the_temporary_and_releases_the_lock(tmp_path, monkeypatch):
    def refused(a, b):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    out = files.StreamedFile(tmp_path / "s.jsonl", one_writer=True)
    out.write("line\n")
    monkeypatch.setattr(files.os, "replace", refused)
    with pytest.raises(files.OutputError, match=f"cannot write {tmp_path / 's.jsonl'}: Input/output error"):
        out.publish()
    assert _entries(tmp_path) == []
    files.OutputLock(tmp_path / "s.jsonl").acquire().release()


def test_a_temporary_that_cannot_be_made_releases_the_lock_at_once(tmp_path, monkeypatch):
    """Released by the refusal itself, not later by the collector of the half-made writer
    (which the error's traceback keeps alive while a tool reports it)."""
    monkeypatch.setattr(files.tempfile, "mkstemp", _failing(errno.ENOSPC))
    with pytest.raises(files.OutputError, match="No space left on device") as refused:
        files.StreamedFile(tmp_path / "s.jsonl", one_writer=True)
    monkeypatch.undo()
    assert refused.tb is not None and _entries(tmp_path) == []
    files.OutputLock(tmp_path / "s.jsonl").acquire().release()


def test_a_directory_that_cannot_be_flushed_after_the_rename_leaves_the_file_published(tmp_path, monkeypatch):
    """The flush of the directory came after os.replace had put the file in place, and its
    failure reported a failed write (OutputError) and discarded a temporary already renamed."""
    target = tmp_path / "s.jsonl"
    files.write_text(target, "old\n")
    monkeypatch.setattr(files, "fsync_directory", _failing(errno.EIO))
    with files.StreamedFile(target, one_writer=True) as out:
        out.write("new\n")
        out.publish(drop_partial=True)
        assert out.published
    assert target.read_text() == "new\n" and _entries(tmp_path) == ["s.jsonl"]
    files.OutputLock(target).acquire().release()


def test_streamed_file_is_flushed_as_it_goes_and_published_at_the_end(tmp_path):
    target = tmp_path / "s.jsonl"
    with files.StreamedFile(target) as out:
        out.write("one\n")
        assert open(out.temp).read() == "one\n"  # on disk before the end
        assert not target.exists()
        out.publish()
    assert target.read_text() == "one\n" and _entries(tmp_path) == ["s.jsonl"]
    with files.StreamedFile(target) as out:
        out.write("two\n")  # never published: the block ends without it
    assert target.read_text() == "one\n" and _entries(tmp_path) == ["s.jsonl"]


def _fifo(tmp):
    os.mkfifo(tmp / "fifo")
    return tmp / "fifo"


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "missing" / "s.jsonl", "does not exist"),
    (lambda tmp: tmp, "it is a directory"),
    (_fifo, "it is not a regular file"),
    (lambda tmp: f"{tmp}/s.jsonl/", "the path ends with '/'"),  # realpath dropped the slash: a file was written
])
def test_unwritable_destinations_fail_at_once(tmp_path, make, message):
    path = make(tmp_path)
    before = _entries(tmp_path)
    with pytest.raises(files.OutputError, match=message):
        files.StreamedFile(path)
    assert _entries(tmp_path) == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names a pipe through /proc/self/fd")
def test_a_link_to_a_pipe_is_refused_by_the_name_given(tmp_path):
    """`--out /dev/stdout` into a pipe: realpath made the link a path that does not exist
    (/proc/PID/fd/pipe:[N]), refused as "No such file or directory" under that name."""
    read_end, write_end = os.pipe()
    try:
        path = f"/proc/self/fd/{write_end}"
        for check in (files.check_output, files.StreamedFile):
            with pytest.raises(files.OutputError) as refused:
                check(path)
            assert str(refused.value) == f"cannot write {path}: it is not a regular file"
    finally:
        os.close(read_end)
        os.close(write_end)


def _dead_pid():
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


@pytest.mark.integration
def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    host, dead = files._HOST, _dead_pid()
    stale = [f".ck.tmp-{host}-{dead}-abc123", f".ck.old-{host}-{dead}-x_y"]
    kept = [f".ck.tmp-{host}-{os.getpid()}-abc", f".ck.tmp-other-host-{dead}-abc", f".other.tmp-{host}-{dead}-a", "ck"]
    for name in stale[:1] + kept[:2]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"partial")
    for name in stale[1:] + kept[2:]:
        (tmp_path / name).write_text("x")
    removed = files.remove_stale_temps(tmp_path / "ck")
    assert sorted(os.path.basename(p) for p in removed) == sorted(stale)
    assert _entries(tmp_path) == sorted(kept)


@pytest.mark.integration
def test_a_writer_of_a_file_removes_the_temporaries_of_its_dead_writers(tmp_path):
    stale = tmp_path / f".s.jsonl.tmp-{files._HOST}-{_dead_pid()}-abcdefgh"
    stale.write_text("cut short")
    files.write_text(tmp_path / "s.jsonl", "whole")
    assert _entries(tmp_path) == ["s.jsonl"]


@pytest.mark.integration
def test_a_partial_result_goes_beside_its_output_never_over_it(tmp_path):
    """A writer stopped before its end publishes what it finished as NAME.partial.SUFFIX, the
    complete file (if any) left as it was; the name fits however long the output's is."""
    out = tmp_path / "s.jsonl"
    out.write_text("complete\n")
    stream = files.StreamedFile(out, one_writer=True)
    stream.write("half\n")
    assert stream.publish_partial() == str(tmp_path / "s.partial.jsonl")
    assert out.read_text() == "complete\n" and (tmp_path / "s.partial.jsonl").read_text() == "half\n"
    assert sorted(os.listdir(tmp_path)) == ["s.jsonl", "s.partial.jsonl"]  # no temporary, no lock
    assert files.partial_path("runs/q/sweep.csv") == os.path.join("runs/q", "sweep.partial.csv")
    assert files.partial_path("samples") == "samples.partial"
    long = files.partial_path(tmp_path / ("x" * 250 + ".jsonl"))
    assert len(os.path.basename(long).encode()) <= files.NAME_MAX and long.endswith(".partial.jsonl")
    files.remove_partial(out)
    files.remove_partial(out)  # none left: nothing to do
    assert os.listdir(tmp_path) == ["s.jsonl"]


def test_a_complete_output_can_drop_the_partial_result_of_an_earlier_writer(tmp_path, monkeypatch):
    """drop_partial deletes NAME.partial.SUFFIX while the lock is still held (so never one a
    later writer published); without it the partial result stays."""
    out, partial = tmp_path / "s.jsonl", tmp_path / "s.partial.jsonl"
    partial.write_text("half\n")
    with files.StreamedFile(out, one_writer=True) as stream:
        stream.publish()
    assert partial.exists()
    deleted = []
    real = files._unlink_if_there

    def unlink(path):
        deleted.append((path, os.path.exists(tmp_path / ".s.jsonl.lock")))
        real(path)

    monkeypatch.setattr(files, "_unlink_if_there", unlink)
    with files.StreamedFile(out, one_writer=True) as stream:
        stream.write("whole\n")
        stream.publish(drop_partial=True)
    assert deleted == [(str(partial), True)] and sorted(os.listdir(tmp_path)) == ["s.jsonl"]
    assert out.read_text() == "whole\n"


@pytest.mark.parametrize("length", [200, 250, 255])
def test_names_that_nearly_fill_a_file_name_can_be_written(tmp_path, length):
    """The temporaries and the lock beside a destination add to its name: they are cut
    short with a digest, so any name the file system takes can be written."""
    name = "é" * (length // 2) + "x" * (length % 2)  # two-byte characters: some cut in the middle
    assert len(os.fsencode(name)) == length
    files.write_text(tmp_path / name, "text")
    with files.OutputLock(tmp_path / name):
        with files.atomic_directory(tmp_path / f"d{name[1:]}") as directory:
            open(os.path.join(directory, "f"), "w").close()
    assert _entries(tmp_path) == sorted([name, f"d{name[1:]}"])
    assert (tmp_path / name).read_text() == "text" and os.listdir(tmp_path / f"d{name[1:]}") == ["f"]
    other = name[:-1] + "z"  # same head, another name: another digest
    assert files._temp_prefix(str(tmp_path / name)) != files._temp_prefix(str(tmp_path / other))
    stale = files._temp_prefix(str(tmp_path / name)).replace(f"-{os.getpid()}-", f"-{_dead_pid()}-") + "abcdefgh"
    assert len(os.fsencode(stale)) <= 255
    (tmp_path / stale).write_text("partial")
    assert files.remove_stale_temps(tmp_path / name) == [str(tmp_path / stale)]


def test_temporary_names_fit_beside_a_full_name_whatever_the_pid(tmp_path):
    """A pid may take 7 digits (Linux's pid_max is 4194304): the temporary of a destination
    whose name fills NAME_MAX must still fit, with the longest pid."""
    prefix = files._temp_prefix(str(tmp_path / ("x" * 255)))
    longest = prefix.replace(f"-{os.getpid()}-", "-4194304-") + "abcdefgh"  # mkstemp adds 8 characters
    assert len(os.fsencode(longest)) == files.NAME_MAX


def test_a_name_of_exactly_name_max_bytes_is_taken_whole(tmp_path):
    """A name that just fits is neither refused by the check before work nor cut short with a
    digest: only one byte more is too long."""
    files.check_output(tmp_path / ("x" * files.NAME_MAX))
    files.check_output(tmp_path / ("x" * files.NAME_MAX), directory=True)
    with pytest.raises(files.OutputError, match=f"a name of {files.NAME_MAX + 1} bytes"):
        files.check_output(tmp_path / ("x" * (files.NAME_MAX + 1)))
    stem = "x" * (files.NAME_MAX - len(".partial.jsonl"))
    assert files.partial_path(tmp_path / f"{stem}.jsonl") == str(tmp_path / f"{stem}.partial.jsonl")


def test_a_dead_link_in_the_way_of_the_parents_is_named(tmp_path):
    """check_output's nearest entry on the way is the link itself, not the directory holding it."""
    os.symlink(tmp_path / "gone", tmp_path / "runs")
    with pytest.raises(files.OutputError, match=f"{tmp_path / 'runs'} is not a directory"):
        files.check_output(tmp_path / "runs" / "eval", directory=True)


def test_a_symbolic_link_is_written_through_and_kept(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "today.jsonl").write_text("old")
    os.symlink("runs/today.jsonl", tmp_path / "latest.jsonl")
    files.write_text(tmp_path / "latest.jsonl", "new")
    os.symlink("runs/absent.jsonl", tmp_path / "dangling.jsonl")
    with files.StreamedFile(tmp_path / "dangling.jsonl") as out:
        out.write("made")
        out.publish()
    assert os.readlink(tmp_path / "latest.jsonl") == "runs/today.jsonl"
    assert (tmp_path / "runs" / "today.jsonl").read_text() == "new"
    assert (tmp_path / "runs" / "absent.jsonl").read_text() == "made"
    (tmp_path / "runs" / "ck").mkdir()
    os.symlink("runs/ck", tmp_path / "ck")
    with files.atomic_directory(tmp_path / "ck") as directory:
        open(os.path.join(directory, "f"), "w").close()
    assert os.readlink(tmp_path / "ck") == "runs/ck" and os.listdir(tmp_path / "runs" / "ck") == ["f"]
    assert _entries(tmp_path) == ["ck", "dangling.jsonl", "latest.jsonl", "runs"]
    with files.OutputLock(tmp_path / "ck"):  # one output, whichever name it is written by
        with pytest.raises(files.OutputLockedError):
            files.OutputLock(tmp_path / "runs" / "ck").acquire()


def test_the_partial_result_of_a_link_is_the_one_beside_its_target(tmp_path):
    """A writer through a link leaves its partial result beside the target: remove_partial by
    the link's name removes that one."""
    (tmp_path / "runs").mkdir()
    os.symlink("runs/today.jsonl", tmp_path / "latest.jsonl")
    with files.StreamedFile(tmp_path / "latest.jsonl") as out:
        out.write("half\n")
        assert out.publish_partial() == str(tmp_path / "runs" / "today.partial.jsonl")
    files.remove_partial(tmp_path / "latest.jsonl")
    assert os.listdir(tmp_path / "runs") == []


@pytest.mark.integration
def test_a_writer_killed_inside_the_two_rename_fallback_loses_nothing(tmp_path):
    """Without renameat2's exchange a directory is replaced by two renames; a writer
    killed between them leaves no `ck`, only its previous version set aside, which the
    next writer restores instead of deleting it as stale."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model").write_text("version 1")
    script = f"""
import os
from ddpd import files
files._exchange = lambda a, b: False
renames = []
def rename(a, b):
    renames.append(b)
    if len(renames) == 2:
        os._exit(137)  # killed between the renames: no cleanup runs
    real(a, b)
real, files.os.rename = files.os.rename, rename
with files.atomic_directory({str(tmp_path / "ck")!r}) as new:
    open(os.path.join(new, "model"), "w").write("version 2")
"""
    proc = subprocess.run([sys.executable, "-c", script])
    assert proc.returncode == 137
    aside = [entry for entry in _entries(tmp_path) if entry.startswith(".ck.old-")]
    assert not (tmp_path / "ck").exists() and len(aside) == 1
    temps = [str(tmp_path / entry) for entry in _entries(tmp_path) if entry.startswith(".ck.tmp-")]
    assert len(temps) == 1 and files.remove_stale_temps(tmp_path / "ck") == temps
    assert _entries(tmp_path) == ["ck"] and (tmp_path / "ck" / "model").read_text() == "version 1"


def test_a_lock_removes_the_directories_it_made_if_they_stay_empty(tmp_path):
    with files.OutputLock(tmp_path / "a" / "new" / "run"):
        assert (tmp_path / "a" / "new").is_dir()
    assert _entries(tmp_path) == []  # a run that failed before writing leaves nothing
    with files.OutputLock(tmp_path / "a" / "new" / "run"):
        files.write_text(tmp_path / "a" / "new" / "run", "output")
    assert _entries(tmp_path / "a" / "new") == ["run"]


@pytest.mark.integration
def test_output_lock_refuses_a_second_writer_and_names_the_holder(tmp_path):
    first = files.OutputLock(tmp_path / "run").acquire()
    with pytest.raises(files.OutputLockedError, match=f"being written by pid {os.getpid()} on "):
        files.OutputLock(tmp_path / "run").acquire()
    script = f"from ddpd.files import OutputLock; OutputLock({str(tmp_path / 'run')!r}).acquire()"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 1 and f"being written by pid {os.getpid()}" in proc.stderr
    first.release()
    assert _entries(tmp_path) == []  # the lock file goes with the lock
    with files.OutputLock(tmp_path / "run"):
        pass


def test_an_empty_directory_path_is_refused_not_read_as_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "precious.txt").write_text("keep")
    with pytest.raises(files.OutputError, match="the path is empty"):
        with files.atomic_directory(""):
            pass
    assert sorted(os.listdir(tmp_path)) == ["precious.txt"]


def test_the_working_directory_and_its_ancestors_are_never_replaced(tmp_path, monkeypatch):
    """`--out .` swapped the working directory for a new one: the shell that ran the tool
    was left in a deleted directory."""
    here = tmp_path / "a" / "b"
    here.mkdir(parents=True)
    (here / "precious.txt").write_text("keep")
    monkeypatch.chdir(here)
    for path in (".", "..", str(tmp_path / "a"), "../b"):
        with pytest.raises(files.OutputError, match="is the working directory or holds it"):
            with files.atomic_directory(path):
                pass
    assert sorted(os.listdir(here)) == ["precious.txt"] and os.getcwd() == str(here)
    with files.atomic_directory("below") as directory:  # a directory inside it is fine
        Path(directory, "x").write_text("new")
    with files.atomic_directory(tmp_path / "a" / "sibling"):
        pass
    assert sorted(os.listdir(here)) == ["below", "precious.txt"]
    (tmp_path / "run-2").mkdir()
    monkeypatch.chdir(tmp_path / "run-2")
    with files.atomic_directory(tmp_path / "run"):  # the working directory's name begins with it
        pass


def test_a_file_in_the_way_of_the_parents_is_named(tmp_path):
    """makedirs said 'File exists' (of the directory it wanted) where a file stands in the way."""
    (tmp_path / "keep.jsonl").write_text("x")
    for make in (lambda path: files.atomic_directory(path).__enter__(),
                 lambda path: __import__("ddpd.eval.report", fromlist=["write_text"]).write_text("t", path)):
        with pytest.raises(files.OutputError, match=f"{tmp_path / 'keep.jsonl'} is not a directory"):
            make(str(tmp_path / "keep.jsonl" / "sub" / "out"))
    assert (tmp_path / "keep.jsonl").read_text() == "x"


# ---------------------------------------------------------------- what stands at the lock's path


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file\n")
    return victim


@pytest.mark.parametrize("plant, what", [
    (lambda lock, victim: os.symlink(victim, lock), "is a symbolic link"),
    (lambda lock, victim: os.link(victim, lock), "has other links"),
    (lambda lock, victim: os.mkfifo(lock), "is not a regular file"),
])
def test_a_lock_path_that_is_not_a_plain_file_of_its_own_is_refused(tmp_path, monkeypatch, plant, what):
    """A symbolic link at `.NAME.lock` (planted in /tmp, say) had its target truncated and
    overwritten with the holder line; a hard link the same; a FIFO gave a bare [Errno 22].
    Such a path is refused before any lock is taken: a followed link would be locked, found
    not to be the file at its path and retried without end, so a lock fails the test instead."""
    import fcntl

    def never(fd, operation):
        raise AssertionError("a lock was taken on a lock path that is not a plain file of its own")

    monkeypatch.setattr(fcntl, "flock", never)
    victim = _victim(tmp_path)
    lock = tmp_path / ".run.lock"
    plant(lock, victim)
    for take in (lambda: files.OutputLock(tmp_path / "run").acquire(),
                 lambda: files.StreamedFile(tmp_path / "run", one_writer=True)):  # ddpd-sample --out
        with pytest.raises(files.OutputError) as info:
            take()
        assert str(info.value) == (f"cannot write {tmp_path / 'run'}: its lock {lock} {what}; "
                                   "remove it if no ddpd process is writing there")
    assert victim.read_text() == "someone else's file\n"
    assert _entries(tmp_path) == [".run.lock", "victim.txt"]  # nothing of ours left behind


@pytest.mark.parametrize("fails", ["ftruncate", "write"])
def test_a_full_disk_while_writing_the_holder_line_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, fails):
    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, fails, full)
    with pytest.raises(files.OutputError) as info:
        files.OutputLock(tmp_path / "new" / "run").acquire()
    assert str(info.value) == (f"cannot write {tmp_path / 'new' / 'run'}: No space left on device "
                               f"(writing its lock {tmp_path / 'new' / '.run.lock'})")
    assert _entries(tmp_path) == []  # neither the lock file nor the directory made for it


# ---------------------------------------------------------------- permissions of a replaced output


def _mode(path):
    return os.stat(path).st_mode & 0o7777


def test_a_replaced_file_keeps_the_mode_of_its_previous_version(tmp_path):
    target = tmp_path / "samples.jsonl"
    files.write_text(target, "one\n")
    os.chmod(target, 0o600)
    files.write_text(target, "two\n")
    assert _mode(target) == 0o600
    os.chmod(target, 0o640)
    with files.StreamedFile(target, one_writer=True) as out:
        out.write("three\n")
        out.publish()
    assert _mode(target) == 0o640 and target.read_text() == "three\n"


def test_a_replaced_file_drops_the_set_id_bits_of_its_previous_version(tmp_path):
    target = tmp_path / "tool.sh"
    target.write_text("old")
    os.chmod(target, 0o4755)
    files.write_text(target, "new")
    assert _mode(target) == 0o755


def test_new_directories_get_the_ordinary_mode_and_replaced_ones_keep_setgid(tmp_path):
    """Not the private mode temporary directories are made with; a group-shared checkpoint
    directory (setgid) stays one."""
    ordinary = 0o777 & ~files._umask()
    with files.atomic_directory(tmp_path / "ck") as new:
        os.mkdir(os.path.join(new, "sub"))
    assert (_mode(tmp_path / "ck"), _mode(tmp_path / "ck" / "sub")) == (ordinary, ordinary)
    os.chmod(tmp_path / "ck", 0o2770)
    with files.atomic_directory(tmp_path / "ck"):
        pass
    assert _mode(tmp_path / "ck") == 0o2770


def test_a_parent_that_cannot_be_flushed_after_the_swap_leaves_the_directory_published(tmp_path, monkeypatch):
    """The flush of the parent came after the swap had put the new directory in place, and its
    failure raised a raw OSError (not an OutputError) for a save that was done."""
    real = files.fsync_directory

    def fsync_directory(directory):
        if directory == os.path.realpath(tmp_path):  # the temporary's own directories flush
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(directory)

    with files.atomic_directory(tmp_path / "ck") as new:
        (Path(new) / "model").write_text("old")
    monkeypatch.setattr(files, "fsync_directory", fsync_directory)
    with files.atomic_directory(tmp_path / "ck") as new:
        (Path(new) / "model").write_text("new")
    assert (tmp_path / "ck" / "model").read_text() == "new" and _entries(tmp_path) == ["ck"]


def test_a_file_where_a_link_stood_gets_the_ordinary_mode(tmp_path):
    """A link's own mode (0o777) is not a previous version's: the new file is not world-writable."""
    (tmp_path / "ck").mkdir()
    os.symlink("elsewhere", tmp_path / "ck" / "model")
    with files.atomic_directory(tmp_path / "ck") as new:
        open(os.path.join(new, "model"), "w").close()
    assert _mode(tmp_path / "ck" / "model") == 0o666 & ~files._umask()


def test_a_replaced_directory_keeps_the_modes_of_its_previous_version(tmp_path):
    umask = files._umask()
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    os.chmod(outside, 0o600)  # not the mode a new entry gets: a chmod through the link would show
    ck = tmp_path / "ck"
    with files.atomic_directory(ck) as new:
        open(os.path.join(new, "model"), "w").close()
    os.chmod(ck, 0o700)
    os.chmod(ck / "model", 0o600)
    with files.atomic_directory(ck) as new:
        open(os.path.join(new, "model"), "w").close()
        open(os.path.join(new, "added"), "w").close()
        os.symlink(outside, os.path.join(new, "link"))  # a kept entry: its target is not ours to change
    assert (_mode(ck), _mode(ck / "model")) == (0o700, 0o600)
    assert _mode(ck / "added") == 0o666 & ~umask and _mode(outside) == 0o600


def test_a_directory_replacing_a_file_gets_a_directory_s_mode(tmp_path):
    """A private file's rw bits, with no x, would make the new directory unusable; the file
    replaced is deleted, not left under a temporary name."""
    ck = tmp_path / "ck"
    ck.write_text("not a directory")
    os.chmod(ck, 0o600)
    with files.atomic_directory(ck) as new:
        open(os.path.join(new, "model"), "w").close()
    assert ck.is_dir() and _mode(ck) == 0o777 & ~files._umask()
    assert os.listdir(tmp_path) == ["ck"]


def test_a_socket_kept_in_a_directory_is_not_opened_to_flush(tmp_path, monkeypatch):
    """Only regular files are opened and flushed: opening a socket fails (ENXIO)."""
    ck = tmp_path / "ck"
    with files.atomic_directory(ck) as new:
        monkeypatch.chdir(new)  # a short name: socket paths are limited to about 100 bytes
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind("sock")
        monkeypatch.chdir(tmp_path)
    assert stat.S_ISSOCK(os.lstat(ck / "sock").st_mode)


# ---------------------------------------------------------------- stale temporaries, under the lock


@contextmanager
def _held_by_another_process(path):
    script = ("import sys; from ddpd.files import OutputLock; "
              f"lock = OutputLock({str(path)!r}).acquire(); print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        yield path
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


@pytest.fixture
def held_elsewhere(tmp_path):
    """A process (not this one) holding the lock of tmp_path/'run'."""
    with _held_by_another_process(tmp_path / "run") as path:
        yield path


@pytest.mark.integration
def test_stale_temporaries_are_kept_while_another_process_holds_the_lock(held_elsewhere, tmp_path):
    """From another PID namespace a running writer's pid looks dead: its temporary was
    deleted under it by anyone who merely tried to write (or resume) the same output."""
    in_flight = tmp_path / f".run.tmp-{files._HOST}-{_dead_pid()}-abcdefgh"
    in_flight.mkdir()
    assert files.remove_stale_temps(held_elsewhere) == []
    assert in_flight.is_dir()


@pytest.mark.integration
def test_a_lock_released_here_and_taken_elsewhere_keeps_its_temporaries(tmp_path):
    """Once released here and taken by another process, the lock's temporaries are that one's."""
    with files.OutputLock(tmp_path / "run"):
        pass
    in_flight = tmp_path / f".run.tmp-{files._HOST}-{_dead_pid()}-abcdefgh"
    in_flight.mkdir()
    with _held_by_another_process(tmp_path / "run"):
        assert files.remove_stale_temps(tmp_path / "run") == []
    assert in_flight.is_dir()


@pytest.mark.integration
def test_a_refused_resume_leaves_the_running_trainers_temporaries(held_elsewhere, tmp_path, capsys):
    from ddpd.cli.train import main

    in_flight = tmp_path / f".run.tmp-{files._HOST}-{_dead_pid()}-abcdefgh"
    in_flight.mkdir()
    (in_flight / "model.safetensors").write_bytes(b"being written")
    assert main(["planner", "--out", str(held_elsewhere), "--resume", "--no-progress"]) != 0
    assert (in_flight / "model.safetensors").read_bytes() == b"being written"


@pytest.mark.integration
def test_a_cleaning_that_must_not_pass_a_holder_names_it(held_elsewhere):
    """refuse_held: ddpd-train --resume of a run yet to save names the run, not a missing checkpoint."""
    with pytest.raises(files.OutputLockedError, match=r"is being written by pid \d+ on "):
        files.remove_stale_temps(held_elsewhere, refuse_held=True)


def test_a_holder_that_never_writes_its_line_is_refused_once_the_wait_is_over(tmp_path, monkeypatch):
    """A writer waits for a holder yet to write its line, for _CLEANING_WAIT seconds only."""
    import fcntl

    (tmp_path / ".run.lock").touch()
    with open(tmp_path / ".run.lock") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: locks as another process
        monkeypatch.setattr(files, "_CLEANING_WAIT", 0.0)
        with pytest.raises(files.OutputLockedError, match="is being written by another process"):
            files.OutputLock(tmp_path / "run").acquire()


def test_a_writer_waits_for_a_holder_to_write_its_line_and_names_it(tmp_path, monkeypatch):
    """A holder locks its file before it writes its line: a writer that finds the lock held
    and the file empty waits for the line, and its refusal names the holder, not 'another
    process'."""
    import fcntl

    (tmp_path / ".run.lock").touch()
    with open(tmp_path / ".run.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: locks as another process
        monkeypatch.setattr(files, "_CLEANING_WAIT", 1e9)  # the wait never runs out here
        monkeypatch.setattr(files.time, "sleep", lambda seconds: held.write("pid 4242 on elsewhere\n") and
                            held.flush())  # the holder writes its line while we wait
        with pytest.raises(files.OutputLockedError, match=r"^.*/run is being written by pid 4242 on elsewhere "):
            files.OutputLock(tmp_path / "run").acquire()


@pytest.mark.integration
def test_a_writer_waits_for_a_cleaner_rather_than_being_refused(tmp_path, monkeypatch):
    """remove_stale_temps holds the lock for milliseconds (every rank of a torchrun cleans
    before process 0 locks the output for the run): a writer that meets it waits."""
    cleaner = files.OutputLock(tmp_path / "run", files._CLEANING).acquire()
    monkeypatch.setattr(files.time, "sleep", lambda seconds: cleaner.release())  # it lets go while we wait
    with files.OutputLock(tmp_path / "run") as lock:
        assert open(lock.lock_path).read().startswith(f"pid {os.getpid()} on ")


@pytest.mark.integration
def test_stale_temporaries_are_removed_by_the_holder_of_the_lock(tmp_path):
    stale = tmp_path / f".run.tmp-{files._HOST}-{_dead_pid()}-abcdefgh"
    stale.write_text("partial")
    with files.OutputLock(tmp_path / "run"):
        assert files.remove_stale_temps(tmp_path / "run") == [str(stale)]
    assert _entries(tmp_path) == []


# ---------------------------------------------------------------- sets of files


def _publish_set(tmp_path, version, kill_after=None):
    """Publish report.csv and report.md of `version` in a process killed (SIGKILL's
    equivalent: no cleanup) after `kill_after` renames."""
    script = f"""
import os
from ddpd import files
renames, real = [], os.replace
def replace(a, b):
    real(a, b)
    renames.append(b)
    if len(renames) == {kill_after!r}:
        os._exit(137)
files.os.replace = replace
with files.FileSet() as reports:
    for name in ("report.csv", "report.md"):
        reports.open({str(tmp_path)!r} + "/" + name).write("{version}")
    reports.publish()
"""
    return subprocess.run([sys.executable, "-c", script]).returncode


def _failing_at(call: int, real, error: int):
    """`real` (a rename) whose call number `call` fails with OSError(error) and does nothing."""
    calls = []

    def rename(a, b):
        calls.append(b)
        if len(calls) == call:
            raise OSError(error, os.strerror(error))
        real(a, b)

    return rename


def _report_set(tmp_path):
    return [(tmp_path / name).read_text() for name in ("report.csv", "report.md")]


@pytest.mark.integration
def test_a_set_of_files_is_published_as_one(tmp_path):
    assert _publish_set(tmp_path, "v1") == 0
    assert _report_set(tmp_path) == ["v1", "v1"] and _entries(tmp_path) == ["report.csv", "report.md"]
    assert _publish_set(tmp_path, "v2", kill_after=1) == 137
    assert _report_set(tmp_path) == ["v2", "v1"]  # killed between the renames
    with files.OutputLock(tmp_path / "report.md"):  # the next writer of either file finishes the set first
        files.remove_stale_temps(tmp_path / "report.md")
    assert _report_set(tmp_path) == ["v2", "v2"] and _entries(tmp_path) == ["report.csv", "report.md"]


def _signalled_after(real):
    def call(*args):
        real(*args)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before kill returns
    return call


def test_a_signal_between_the_renames_of_a_set_waits_for_the_set(tmp_path, monkeypatch, signal_raises):
    """The handler's exception between two renames discarded the rest: half old, half new, for good."""
    for name in ("report.csv", "report.md"):
        files.write_text(tmp_path / name, "v1")
    monkeypatch.setattr(files.os, "replace", _signalled_after(os.replace))
    with pytest.raises(signal_raises), files.FileSet() as reports:
        for name in ("report.csv", "report.md"):
            reports.open(tmp_path / name).write("v2")
        reports.publish()
    assert _report_set(tmp_path) == ["v2", "v2"] and _entries(tmp_path) == ["report.csv", "report.md"]


def test_a_signal_between_the_two_renames_of_a_directory_waits_for_the_second(tmp_path, monkeypatch, signal_raises):
    """Without renameat2's exchange: the handler's exception left `ck` absent, its previous
    version set aside until the next writer."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model").write_text("version 1")
    monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    monkeypatch.setattr(files.os, "rename", _signalled_after(os.rename))
    with pytest.raises(signal_raises), files.atomic_directory(tmp_path / "ck") as new:
        (Path(new) / "model").write_text("version 2")
    assert _entries(tmp_path) == ["ck"] and (tmp_path / "ck" / "model").read_text() == "version 2"


@contextmanager
def _handlers(handlers):
    previous = {number: signal.signal(number, handler) for number, handler in handlers.items()}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def test_the_first_signal_held_is_raised_when_the_block_ends_and_only_then():
    """SIGHUP waits as SIGINT and SIGTERM do; the first of the block is the one handed on."""
    events = []

    def record(signum, frame):
        events.append(signal.Signals(signum).name)

    with _handlers({signal.SIGTERM: record, signal.SIGHUP: record}):
        with signals_held():
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGTERM)
            events.append("end of block")
        assert signal.getsignal(signal.SIGTERM) is record and signal.getsignal(signal.SIGHUP) is record
    assert events == ["end of block", "SIGHUP"]


def test_a_signal_ignored_before_the_block_takes_no_held_signals_place():
    """nohup's SIGHUP stays ignored: the SIGTERM after it is the one handed on, not lost."""
    events = []
    with _handlers({signal.SIGHUP: signal.SIG_IGN, signal.SIGTERM: lambda signum, frame: events.append(signum)}):
        with signals_held():
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    assert events == [signal.SIGTERM]


def test_signals_are_held_only_in_the_main_thread():
    """Python handles signals in the main thread only (signal.signal raises elsewhere): in
    another thread the block runs with the handlers as they are."""
    seen = []

    def block():
        with signals_held():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=block)
    thread.start()
    thread.join()
    assert seen == [signal.getsignal(signal.SIGTERM)]


def test_the_handlers_are_back_after_a_block_that_raised_and_took_no_signal():
    events = []

    def record(signum, frame):
        events.append(signum)

    with _handlers({signal.SIGTERM: record, signal.SIGINT: record}):
        with pytest.raises(RuntimeError), signals_held():
            assert signal.getsignal(signal.SIGTERM) is not record and signal.getsignal(signal.SIGINT) is not record
            raise RuntimeError
        assert signal.getsignal(signal.SIGTERM) is record and signal.getsignal(signal.SIGINT) is record
    assert events == []


def test_a_signal_whose_handler_python_did_not_set_is_left_alone(monkeypatch):
    """getsignal answers None for a handler set outside Python: it is neither replaced nor
    restored (signal.signal would refuse None), and the other signals are held as usual."""
    events = []
    real = signal.getsignal
    monkeypatch.setattr(signal, "getsignal", lambda number: None if number == signal.SIGHUP else real(number))
    with _handlers({signal.SIGHUP: signal.SIG_IGN, signal.SIGTERM: lambda signum, frame: events.append(signum)}):
        with signals_held():
            assert real(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)
        assert real(signal.SIGHUP) is signal.SIG_IGN
    assert events == [signal.SIGTERM]


def test_a_signal_held_by_a_nested_block_waits_for_the_outer_one():
    events = []
    with _handlers({signal.SIGTERM: lambda signum, frame: events.append(signum)}):
        with signals_held():
            with signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
            events.append("end of inner block")
        assert signal.getsignal(signal.SIGTERM) is not None
    assert events == ["end of inner block", signal.SIGTERM]


def test_only_the_first_of_several_held_signals_is_handed_on():
    events = []
    with _handlers({signal.SIGTERM: lambda signum, frame: events.append(signum)}):
        with signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
    assert events == [signal.SIGTERM]


def test_a_set_whose_rename_failed_is_finished_once_its_writer_is_dead(tmp_path, monkeypatch):
    """The journal and the temporaries stay after a failed rename; a cleaner leaves them while
    the writer lives (its renames may be under way) and finishes the set once it is dead."""
    for name in ("report.csv", "report.md"):
        files.write_text(tmp_path / name, "v1")
    real = os.replace
    monkeypatch.setattr(files.os, "replace", _failing_at(2, real, errno.EIO))
    with pytest.raises(files.OutputError, match="report.md: Input/output error"), files.FileSet() as reports:
        for name in ("report.csv", "report.md"):
            reports.open(tmp_path / name).write("v2")
        reports.publish()
    monkeypatch.setattr(files.os, "replace", real)
    assert _report_set(tmp_path) == ["v2", "v1"]
    files.remove_stale_temps(tmp_path / "report.md")  # its writer (this process) lives
    assert _report_set(tmp_path) == ["v2", "v1"] and len(_entries(tmp_path)) == 4  # + journal, temporary
    monkeypatch.setattr(files, "_pid_alive", lambda pid: False)
    files.remove_stale_temps(tmp_path / "report.md")
    assert _report_set(tmp_path) == ["v2", "v2"] and _entries(tmp_path) == ["report.csv", "report.md"]


def test_a_directory_that_cannot_be_flushed_after_the_renames_leaves_the_set_published(tmp_path, monkeypatch):
    """The flush of the directories came after every rename had put the set in place, and its
    failure raised a raw OSError and left the journal behind."""
    for name in ("report.csv", "report.md"):
        files.write_text(tmp_path / name, "v1")
    renamed, real = [], os.replace

    def replace(a, b):
        renamed.append(b)
        real(a, b)

    def fsync_directory(directory):
        if renamed:  # the journal's own flush, before the renames, succeeds
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(files.os, "replace", replace)
    monkeypatch.setattr(files, "fsync_directory", fsync_directory)
    with files.FileSet() as reports:
        for name in ("report.csv", "report.md"):
            reports.open(tmp_path / name).write("v2")
        reports.publish()
    assert _report_set(tmp_path) == ["v2", "v2"] and _entries(tmp_path) == ["report.csv", "report.md"]


def test_a_journal_that_cannot_be_deleted_after_the_renames_leaves_the_set_published(tmp_path, monkeypatch):
    """Deleting the journal came after every rename had put the set in place, and its failure
    raised a raw OSError for a set that was whole; the next writer removes the journal."""
    for name in ("report.csv", "report.md"):
        files.write_text(tmp_path / name, "v1")
    real = files._unlink_if_there

    def unlink(path):
        if os.path.basename(path).startswith(".report"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(path)

    monkeypatch.setattr(files, "_unlink_if_there", unlink)
    with files.FileSet() as reports:
        for name in ("report.csv", "report.md"):
            reports.open(tmp_path / name).write("v2")
        reports.publish()
    assert _report_set(tmp_path) == ["v2", "v2"] and len(_entries(tmp_path)) == 3  # the journal, left
    monkeypatch.setattr(files, "_unlink_if_there", real)
    monkeypatch.setattr(files, "_pid_alive", lambda pid: False)  # its writer gone, as the next writer sees it
    files.remove_stale_temps(tmp_path / "report.csv")
    assert _entries(tmp_path) == ["report.csv", "report.md"] and _report_set(tmp_path) == ["v2", "v2"]


@pytest.mark.parametrize("owner, name", [
    (files, "fsync_directory"),  # the journal's directory, after its content: no journal is left
    (files.os, "fsync"),  # before the renames: the previous set stays
], ids=["journal", "before renames"])
def test_a_set_that_fails_before_its_renames_leaves_the_previous_one(tmp_path, monkeypatch, owner, name):
    files.write_text(tmp_path / "a.csv", "old")

    def full(_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(files.OutputError, match="No space left on device"):
        with files.FileSet() as reports:
            reports.open(tmp_path / "a.csv").write("new")
            reports.open(tmp_path / "b.md").write("new")
            monkeypatch.setattr(owner, name, full)
            reports.publish()
    assert _entries(tmp_path) == ["a.csv"] and (tmp_path / "a.csv").read_text() == "old"


def test_a_file_opened_twice_in_a_set_keeps_the_later_content_and_one_temporary(tmp_path):
    with files.FileSet() as reports:
        reports.open(tmp_path / "a.csv").write("first")
        reports.open(tmp_path / "a.csv").write("second")
        assert len(_entries(tmp_path)) == 1  # the earlier temporary is gone
        reports.open(tmp_path / "b.md").write("b")
        reports.publish()
    assert _entries(tmp_path) == ["a.csv", "b.md"] and (tmp_path / "a.csv").read_text() == "second"


def test_an_empty_set_publishes_nothing(tmp_path):
    with files.FileSet() as reports:
        reports.publish()
    assert _entries(tmp_path) == []


def _journal(tmp_path, owner, text):
    journal = tmp_path / f".{owner}.set-{files._HOST}-1-abcdefgh"
    journal.write_text(text)
    return journal


def test_a_journal_cut_short_is_deleted_by_a_writer_of_its_set_only(tmp_path, monkeypatch):
    """Cut short before any rename: nothing to finish. A writer of another file leaves it."""
    journal = _journal(tmp_path, "report.csv", '{"ddpd-file-set": 1, "ren')
    monkeypatch.setattr(files, "_pid_alive", lambda pid: False)
    files.remove_stale_temps(tmp_path / "other.csv")
    assert journal.exists()
    files.remove_stale_temps(tmp_path / "report.csv")
    assert _entries(tmp_path) == []


def test_a_journal_of_another_set_or_that_cannot_be_finished_stays(tmp_path, monkeypatch):
    (tmp_path / "report.tmp").write_text("v2")
    renames = [[str(tmp_path / "report.tmp"), str(tmp_path / "report.csv")]]
    journal = _journal(tmp_path, "report.csv", json.dumps({"renames": renames, "journals": []}))
    monkeypatch.setattr(files, "_pid_alive", lambda pid: False)
    files.remove_stale_temps(tmp_path / "report.md")  # not in the set
    assert _entries(tmp_path) == [journal.name, "report.tmp"]
    monkeypatch.setattr(files.os, "replace", _failing(errno.EIO))
    files.remove_stale_temps(tmp_path / "report.csv")  # a later writer finishes it
    monkeypatch.undo()
    assert _entries(tmp_path) == [journal.name, "report.tmp"]


def test_a_file_named_like_a_journal_but_not_hidden_is_left_alone(tmp_path, monkeypatch):
    """Journals are hidden (`.NAME.set-...`): a user's file whose name only contains the marker is not one."""
    files.write_text(tmp_path / "report.csv", "v1")
    (tmp_path / "report.tmp").write_text("v2")
    lookalike = tmp_path / f"report.csv.set-{files._HOST}-1-abcdefgh"
    renames = [[str(tmp_path / "report.tmp"), str(tmp_path / "report.csv")]]
    lookalike.write_text(json.dumps({"ddpd-file-set": 1, "renames": renames, "journals": [str(lookalike)]}))
    monkeypatch.setattr(files, "_pid_alive", lambda pid: False)
    files.remove_stale_temps(tmp_path / "report.csv")
    assert (tmp_path / "report.csv").read_text() == "v1"
    assert _entries(tmp_path) == ["report.csv", lookalike.name, "report.tmp"]


# ---------------------------------------------------------------- refusals and failures of the OS


def _failing(code):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


def test_parents_that_cannot_be_made_name_the_output_and_the_cause(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "makedirs", _failing(errno.EACCES))
    with pytest.raises(files.OutputError) as refused:
        with files.atomic_directory(tmp_path / "runs" / "ck"):
            pass
    assert str(refused.value) == f"cannot write {tmp_path / 'runs' / 'ck'}: Permission denied"
    assert _entries(tmp_path) == []


def test_a_directory_that_is_not_writable_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "access", lambda path, mode: False)  # root may write anywhere
    with pytest.raises(files.OutputError) as refused:
        files.check_output(tmp_path / "s.jsonl")
    assert str(refused.value) == f"cannot write {tmp_path / 's.jsonl'}: {tmp_path} is not writable"


def test_name_lengths_are_checked_against_name_max_where_the_file_system_does_not_say(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "pathconf", _failing(errno.EINVAL))
    files.check_output(tmp_path / ("x" * files.NAME_MAX))
    with pytest.raises(files.OutputError, match=f"a name of 256 bytes, over the {files.NAME_MAX} a file name"):
        files.check_output(tmp_path / ("x" * 256))


@pytest.mark.parametrize("write", [files.check_output, files.StreamedFile, files.write_text, files.atomic_directory])
def test_a_path_that_is_not_a_path_is_a_type_error(write):
    with pytest.raises(TypeError, match="output path must be a str or os.PathLike, got int"):
        if write is files.atomic_directory:
            write(3).__enter__()
        elif write is files.write_text:
            write(3, "text")
        else:
            write(3)


def test_a_special_file_that_appears_after_the_first_look_is_refused(tmp_path, monkeypatch):
    """The first look (by the name given) found nothing; a FIFO stands there at the second."""
    fifo, real = _fifo(tmp_path), os.stat
    looks = []

    def stat(path, *args, **kwargs):
        looks.append(path)
        return _failing(errno.ENOENT)() if len(looks) == 1 else real(path, *args, **kwargs)

    monkeypatch.setattr(files.os, "stat", stat)
    with pytest.raises(files.OutputError, match="it is not a regular file"):
        files.StreamedFile(fifo)
    assert _entries(tmp_path) == ["fifo"]


# ---------------------------------------------------------------- stale temporaries: what stays


def test_temporaries_of_a_process_of_another_user_are_kept(tmp_path, monkeypatch):
    """kill(pid, 0) answers EPERM for a live process this user may not signal."""
    kept = tmp_path / f".ck.tmp-{files._HOST}-1-abcdefgh"
    kept.mkdir()
    monkeypatch.setattr(files.os, "kill", _failing(errno.EPERM))
    assert files.remove_stale_temps(tmp_path / "ck") == [] and kept.is_dir()


def test_a_stale_temporary_that_is_a_link_to_a_directory_is_unlinked_not_followed(tmp_path, monkeypatch):
    """The link goes; the directory it points to, someone else's, stays whole."""
    target = tmp_path / "kept"
    target.mkdir()
    (target / "model").write_text("a user's")
    stale = tmp_path / f".ck.tmp-{files._HOST}-1-abcdefgh"
    stale.symlink_to(target)
    monkeypatch.setattr(files, "_pid_alive", lambda pid: False)
    assert files.remove_stale_temps(tmp_path / "ck") == [str(stale)]
    assert _entries(tmp_path) == ["kept"] and (target / "model").read_text() == "a user's"


def test_no_cleaning_where_the_lock_cannot_be_taken(tmp_path, monkeypatch):
    """A directory that is not writable: nothing is removed, and nothing is raised."""
    stale = tmp_path / f".ck.tmp-{files._HOST}-1-abcdefgh"
    stale.mkdir()
    monkeypatch.setattr(files, "_pid_alive", lambda pid: False)
    real = os.open
    refused = _failing(errno.EACCES)
    monkeypatch.setattr(files.os, "open", lambda p, *a: refused() if p.endswith(".lock") else real(p, *a))
    assert files.remove_stale_temps(tmp_path / "ck") == [] and stale.is_dir()


def test_no_cleaning_where_the_directory_cannot_be_listed(tmp_path, monkeypatch):
    stale = tmp_path / f".ck.tmp-{files._HOST}-1-abcdefgh"
    stale.mkdir()
    monkeypatch.setattr(files, "_pid_alive", lambda pid: False)
    monkeypatch.setattr(files.os, "listdir", _failing(errno.EACCES))
    assert files.remove_stale_temps(tmp_path / "ck") == []
    monkeypatch.undo()
    assert _entries(tmp_path) == [stale.name]


def test_a_set_aside_version_that_cannot_be_renamed_back_is_kept(tmp_path, monkeypatch):
    aside = tmp_path / f".ck.old-{files._HOST}-1-abcdefgh"
    aside.mkdir()
    (aside / "model").write_text("version 1")
    monkeypatch.setattr(files, "_pid_alive", lambda pid: False)
    monkeypatch.setattr(files.os, "rename", _failing(errno.EXDEV))
    assert files.remove_stale_temps(tmp_path / "ck") == []
    assert (aside / "model").read_text() == "version 1"


# ---------------------------------------------------------------- temporaries and partial results on failure


def test_a_partial_result_that_cannot_be_dropped_is_named_once_the_output_is_published(tmp_path):
    out, partial = tmp_path / "s.jsonl", tmp_path / "s.partial.jsonl"
    partial.mkdir()  # not a file: it cannot be unlinked
    with files.StreamedFile(out, one_writer=True) as stream:
        stream.write("whole\n")
        with pytest.raises(files.OutputError) as refused:
            stream.publish(drop_partial=True)
    assert str(refused.value) == f"cannot write {partial}: Is a directory"
    assert out.read_text() == "whole\n" and _entries(tmp_path) == ["s.jsonl", "s.partial.jsonl"]  # lock released
    with pytest.raises(files.OutputError) as refused:
        files.remove_partial(out)
    assert str(refused.value) == f"cannot write {partial}: Is a directory"


def test_a_temporary_whose_buffered_data_cannot_be_flushed_is_still_deleted(tmp_path, monkeypatch):
    """A block that fails with unflushed data: closing the temporary fails too (a full disk)."""
    files.write_text(tmp_path / "report.json", "old")
    with pytest.raises(ValueError, match="bad row"):
        with files.atomic_file(tmp_path / "report.json") as f:
            monkeypatch.setattr(f, "close", _failing(errno.ENOSPC))
            f.write("new")
            raise ValueError("bad row")
    assert _entries(tmp_path) == ["report.json"] and (tmp_path / "report.json").read_text() == "old"


def test_an_interrupted_atomic_file_leaves_the_previous_file(tmp_path):
    files.write_text(tmp_path / "report.json", "old")
    with pytest.raises(KeyboardInterrupt):
        with files.atomic_file(tmp_path / "report.json") as f:
            f.write("new")
            raise KeyboardInterrupt
    assert _entries(tmp_path) == ["report.json"] and (tmp_path / "report.json").read_text() == "old"


# ---------------------------------------------------------------- directories: failures


def test_a_temporary_directory_that_cannot_be_made_names_the_output(tmp_path, monkeypatch):
    monkeypatch.setattr(files.tempfile, "mkdtemp", _failing(errno.ENOSPC))
    with pytest.raises(files.OutputError) as refused:
        with files.atomic_directory(tmp_path / "ck"):
            pass
    assert str(refused.value) == f"cannot write {tmp_path / 'ck'}: No space left on device"
    assert _entries(tmp_path) == []


def test_an_output_error_inside_an_atomic_directory_is_raised_as_it_is(tmp_path):
    """A file of the checkpoint that cannot be written names that file, not the directory."""
    (tmp_path / "ck").mkdir()
    failed = files.OutputError(tmp_path / "ck" / "model", OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(files.OutputError) as refused:
        with files.atomic_directory(tmp_path / "ck") as new:
            (Path(new) / "model").write_text("version 2")
            raise failed
    assert refused.value is failed and _entries(tmp_path) == ["ck"] and _entries(tmp_path / "ck") == []


def test_a_directory_is_written_from_a_working_directory_that_is_gone(tmp_path, monkeypatch):
    (tmp_path / "gone").mkdir()
    monkeypatch.chdir(tmp_path / "gone")
    os.rmdir(tmp_path / "gone")
    with files.atomic_directory(tmp_path / "ck") as new:
        (Path(new) / "model").write_text("version 1")
    assert _entries(tmp_path) == ["ck"] and (tmp_path / "ck" / "model").read_text() == "version 1"


@pytest.mark.parametrize("without", ["platform", "renameat2"])
def test_a_directory_is_replaced_where_renameat2_is_missing(tmp_path, monkeypatch, without):
    """Not Linux, or a C library without renameat2 (glibc < 2.28): the two renames."""
    if without == "platform":
        monkeypatch.setattr(files.sys, "platform", "darwin")
    else:
        monkeypatch.setattr(files.ctypes, "CDLL", lambda *args, **kwargs: object())
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / name).touch()
    assert files._exchange(str(tmp_path / "a"), str(tmp_path / "b")) is False
    assert _entries(tmp_path / "a") == ["a"] and _entries(tmp_path / "b") == ["b"]  # not swapped
    with files.atomic_directory(tmp_path / "a") as new:
        (Path(new) / "model").write_text("version 2")
    assert _entries(tmp_path) == ["a", "b"] and _entries(tmp_path / "a") == ["model"]


@pytest.mark.parametrize("exchange", [True, False])
def test_a_previous_version_that_cannot_be_deleted_fails_no_save(tmp_path, monkeypatch, exchange):
    """Once the new version was in place, a previous one that could not be deleted (a read-only
    folder a user kept in the checkpoint) made the save raise OutputError, though it had succeeded."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model").write_text("version 1")
    if not exchange:
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    real = shutil.rmtree

    def rmtree(path, ignore_errors=False, **kwargs):
        if not ignore_errors:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        real(path, ignore_errors=True, **kwargs)

    monkeypatch.setattr(files.shutil, "rmtree", rmtree)
    with files.atomic_directory(tmp_path / "ck") as new:
        Path(new, "model").write_text("version 2")
    assert (tmp_path / "ck" / "model").read_text() == "version 2"


def test_a_second_rename_of_the_fallback_that_fails_puts_the_previous_version_back(tmp_path, monkeypatch):
    """The new version could not be renamed in (ENOSPC): `ck` was left absent, its previous
    version set aside under a temporary name until a later writer's cleaning."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model").write_text("version 1")
    monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    monkeypatch.setattr(files.os, "rename", _failing_at(2, os.rename, errno.ENOSPC))
    with pytest.raises(files.OutputError, match=f"^cannot write {tmp_path / 'ck'}: No space left on device$"):
        with files.atomic_directory(tmp_path / "ck") as new:
            (Path(new) / "model").write_text("version 2")
    assert _entries(tmp_path) == ["ck"] and (tmp_path / "ck" / "model").read_text() == "version 1"


# ---------------------------------------------------------------- the lock: failures and races


def test_a_file_system_without_locks_is_named(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setattr(fcntl, "flock", _failing(errno.ENOLCK))
    with pytest.raises(files.OutputError) as refused:
        files.OutputLock(tmp_path / "run").acquire()
    assert str(refused.value) == f"cannot write {tmp_path / 'run'}: No locks available"


def test_a_file_system_without_locks_leaves_only_what_was_there(tmp_path, monkeypatch):
    """The refused call deletes the lock file and directories it made, never a lock file that
    was there before it (another process may hold it)."""
    import fcntl

    monkeypatch.setattr(fcntl, "flock", _failing(errno.ENOLCK))
    with pytest.raises(files.OutputError, match="No locks available"):
        files.OutputLock(tmp_path / "runs" / "q" / "run").acquire()
    assert _entries(tmp_path) == []
    (tmp_path / ".run.lock").write_text("")
    with pytest.raises(files.OutputError, match="No locks available"):
        files.OutputLock(tmp_path / "run").acquire()
    assert _entries(tmp_path) == [".run.lock"]


def test_a_lock_file_another_writer_took_before_the_refusal_stays(tmp_path, monkeypatch):
    """Made by this call, but written (a holder's line) by another writer before this call's
    lock failed: it is that writer's now, and is not deleted under it."""
    import fcntl

    def taken_then_refused(fd, operation):
        (tmp_path / ".run.lock").write_text("pid 1 on elsewhere since 2026-01-01 00:00:00\n")
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", taken_then_refused)
    with pytest.raises(files.OutputError, match="No locks available"):
        files.OutputLock(tmp_path / "run").acquire()
    assert _entries(tmp_path) == [".run.lock"]


def test_a_lock_file_deleted_before_it_is_locked_is_made_again(tmp_path, monkeypatch):
    """The previous holder deletes the file between our open and our lock: the holder line
    must go into the file at the lock's path, which the next writer opens."""
    import fcntl

    real, calls = fcntl.flock, []

    def flock(fd, operation):
        calls.append(fd)
        if len(calls) == 1:
            os.unlink(tmp_path / ".run.lock")
        real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    with files.OutputLock(tmp_path / "run"):
        assert len(calls) == 2 and open(tmp_path / ".run.lock").read().startswith(f"pid {os.getpid()} on ")


def test_a_lock_file_that_cannot_be_made_leaves_no_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "open", _failing(errno.EROFS))
    with pytest.raises(files.OutputError) as refused:
        files.OutputLock(tmp_path / "runs" / "q" / "run").acquire()
    monkeypatch.undo()
    assert str(refused.value) == f"cannot write {tmp_path / 'runs' / 'q' / 'run'}: Read-only file system"
    assert _entries(tmp_path) == []


def test_a_holder_line_that_cannot_be_written_is_named_even_if_the_lock_file_stays(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "write", _failing(errno.ENOSPC))
    monkeypatch.setattr(files.os, "unlink", _failing(errno.EIO))
    with pytest.raises(files.OutputError, match=r"No space left on device \(writing its lock "):
        files.OutputLock(tmp_path / "run").acquire()


def test_a_lock_whose_file_was_deleted_is_released(tmp_path):
    lock = files.OutputLock(tmp_path / "run").acquire()
    os.unlink(lock.lock_path)
    lock.release()
    assert lock._fd is None and (os.getpid(), lock.path) not in files._HELD


def test_an_output_error_keeps_the_errno_of_its_cause(tmp_path, monkeypatch):
    """Callers tell a full disk from other failures by errno, as with any OSError."""
    monkeypatch.setattr(files.os, "fsync", _failing(errno.ENOSPC))
    with pytest.raises(files.OutputError) as info:
        files.write_text(tmp_path / "report.json", "x")
    assert info.value.errno == errno.ENOSPC
    assert files.OutputError(tmp_path / "x", ValueError("the path is empty")).errno is None


def test_a_set_killed_between_its_renames_leaves_a_journal_of_every_rename(tmp_path, monkeypatch):
    """The journal's format: what the next writer reads to finish the set."""
    monkeypatch.setattr(files.os, "replace", _failing_at(2, os.replace, errno.EIO))
    with pytest.raises(files.OutputError), files.FileSet() as reports:
        outs = [reports.open(tmp_path / name) for name in ("report.csv", "report.md")]
        reports.publish()
    journal = tmp_path / next(e for e in _entries(tmp_path) if e.startswith(f".report.csv.set-{files._HOST}-"))
    assert json.loads(journal.read_text()) == {"ddpd-file-set": 1, "renames": [[o.temp, o.path] for o in outs],
                                               "journals": [str(journal)]}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
def test_two_directories_are_swapped_in_one_step_on_linux(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / name).touch()
    assert files._exchange(str(tmp_path / "a"), str(tmp_path / "b")) is True
    assert _entries(tmp_path / "a") == ["b"] and _entries(tmp_path / "b") == ["a"]


def test_stale_temporaries_are_found_on_a_host_whose_name_has_hyphens(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_HOST", "gpu-node-7")
    monkeypatch.setattr(files, "_pid_alive", lambda pid: False)
    stale = tmp_path / ".ck.tmp-gpu-node-7-12345-abcdefgh"
    stale.write_text("cut short")
    assert files.remove_stale_temps(tmp_path / "ck") == [str(stale)] and _entries(tmp_path) == []


def test_a_lock_file_is_readable_by_others_who_are_refused(tmp_path):
    """A writer of another user reads the holder line to say who holds the output."""
    with files.OutputLock(tmp_path / "run") as lock:
        assert _mode(lock.lock_path) == 0o644 & ~files._umask()


def test_a_partial_name_cut_short_ends_with_a_tilde_and_sixteen_hex_digits_of_the_stem(tmp_path):
    """The name a listing shows: the head that fits, then a digest naming the whole stem."""
    stem = "s" * (files.NAME_MAX - len(".jsonl") - 4)
    digest = hashlib.sha256(stem.encode()).hexdigest()[:16]
    head = stem[:files.NAME_MAX - len(".partial.jsonl") - len(digest) - 1]
    partial = files.partial_path(tmp_path / f"{stem}.jsonl")
    assert partial == str(tmp_path / f"{head}~{digest}.partial.jsonl")
    assert len(os.fsencode(os.path.basename(partial))) == files.NAME_MAX


def test_a_directory_that_cannot_be_entered_is_refused_before_any_work(tmp_path, monkeypatch):
    """Write permission without search (x) still cannot create a file in it."""
    monkeypatch.setattr(files.os, "access", lambda path, mode: not mode & os.X_OK)
    with pytest.raises(files.OutputError, match="is not writable"):
        files.check_output(tmp_path / "s.jsonl")


def test_a_streamed_file_in_a_missing_directory_names_the_directory(tmp_path):
    target = tmp_path / "missing" / "s.jsonl"
    with pytest.raises(files.OutputError) as refused:
        files.StreamedFile(target)
    assert str(refused.value) == f"cannot write {target}: directory {tmp_path / 'missing'} does not exist"
    assert refused.value.errno == errno.ENOENT and _entries(tmp_path) == []


@pytest.fixture
def private_umask():
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def test_a_new_file_gets_the_ordinary_mode_under_the_umask(tmp_path, private_umask):
    """Not a fixed 0o644: a private umask keeps a new output private."""
    files.write_text(tmp_path / "report.json", "{}")
    assert _mode(tmp_path / "report.json") == 0o640


def test_a_set_of_one_file_whose_rename_fails_leaves_only_the_previous_file(tmp_path, monkeypatch):
    """One rename needs no journal: nothing is left for a later writer to finish."""
    files.write_text(tmp_path / "report.csv", "v1")
    monkeypatch.setattr(files.os, "replace", _failing(errno.EIO))
    with pytest.raises(files.OutputError, match="report.csv: Input/output error"), files.FileSet() as reports:
        reports.open(tmp_path / "report.csv").write("v2")
        reports.publish()
    assert _entries(tmp_path) == ["report.csv"] and (tmp_path / "report.csv").read_text() == "v1"


def test_a_stale_temporary_that_cannot_be_deleted_is_not_reported_removed(tmp_path, monkeypatch):
    stale = tmp_path / f".ck.tmp-{files._HOST}-1-abcdefgh"
    stale.write_text("cut short")
    monkeypatch.setattr(files, "_pid_alive", lambda pid: False)
    real = os.unlink

    def unlink(path, *args, **kwargs):  # the lock file still goes
        if ".tmp-" in os.fspath(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        real(path, *args, **kwargs)

    monkeypatch.setattr(files.os, "unlink", unlink)
    assert files.remove_stale_temps(tmp_path / "ck") == [] and stale.exists()
