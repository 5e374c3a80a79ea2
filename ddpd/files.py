"""Durable output: atomic replacement, streamed output, one writer per output.

Every file ddpd writes (checkpoints, sample files, evaluation reports) goes through here:

- `atomic_file` / `write_text` / `write_bytes` / `atomic_directory`: built under a
  temporary name beside the destination, flushed and renamed over it (never over the
  working directory: `refuse_working_directory`);
- `StreamedFile`: lines appended to such a temporary, published by one rename at the end;
- `FileSet`: several files replaced as one set, with a journal a killed writer leaves;
- `partial_path`: where a writer stopped before its end leaves what it finished;
- `remove_stale_temps`: temporaries of dead writers, removed by the lock's holder;
- `OutputLock`: an exclusive `fcntl` lock on `.NAME.lock` beside a destination.

Errors are `OutputError`s (an OSError) naming the user's path and the cause. Lowest
layer: imports nothing from ddpd. docs/reliability.md ("Durable output") has the details."""
from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Optional

from ddpd._interrupts import signals_held

_HOST = socket.gethostname().replace(os.sep, "_") or "localhost"


class OutputError(OSError):
    """An output cannot be written: the message names the destination and the cause."""

    def __init__(self, path, cause: BaseException):
        reason = getattr(cause, "strerror", None) or str(cause)
        super().__init__(f"cannot write {os.fspath(path)}: {reason}")
        self.errno = getattr(cause, "errno", None)


class OutputLockedError(OSError):
    """Another process holds the lock of an output."""


# (pid, destination) of every OutputLock this process holds: remove_stale_temps cleans
# only under the lock, and a second lock of the same output by the same process would be
# refused (flock locks an open file, not a process). The pid: a forked child holds none.
_HELD: set = set()
_CLEANING = ", removing stale temporaries"  # the holder line of remove_stale_temps' brief lock
_CLEANING_WAIT = 5.0  # seconds a writer waits for such a holder before it is refused


NAME_MAX = 255  # bytes in one file name (Linux, macOS)
# What a temporary's name adds to the destination's: ".", ".tmp-", "-", the pid (at most
# 7 digits), "-" and mkstemp's 8 random characters.
_TEMP_EXTRA = 1 + 5 + len(os.fsencode(_HOST)) + 1 + 7 + 1 + 8


def _fitted(name: str, room: int) -> str:
    """`name` if it takes at most `room` bytes, else its head and a digest of the whole
    in `room` bytes: the names beside a destination (temporaries, the lock) must fit in
    NAME_MAX even when the destination's own name nearly fills it."""
    raw = os.fsencode(name)
    if len(raw) <= room:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:16]
    # whole characters: a listing shows none broken
    return raw[:room - len(digest) - 1].decode(sys.getfilesystemencoding(), "ignore") + "~" + digest


def _temp_head(path: str, kind: str) -> str:
    return f".{_fitted(os.path.basename(path), NAME_MAX - _TEMP_EXTRA)}.{kind}-"


def _temp_prefix(path: str, kind: str = "tmp") -> str:
    return f"{_temp_head(path, kind)}{_HOST}-{os.getpid()}-"


def destination(path) -> str:
    """The absolute path a write of `path` replaces. Symbolic links are followed: a link
    to a file or a checkpoint directory stays a link, and what it points to is
    replaced (replacing the link itself would cut it from its target).

    Args:
        path: the path a user named.

    Returns:
        The absolute path to replace.
    """
    return os.path.realpath(os.fspath(path))


def make_parents(path, parent: str) -> None:
    """os.makedirs(parent), an OutputError of `path` if it fails; where a file stands in the
    way the message names it (makedirs says 'File exists', of the directory it wanted).

    Args:
        path: the output the directories are made for (named in errors).
        parent: the directory to make.

    Raises:
        OutputError: the directory cannot be made.
    """
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = _nearest_existing(parent)
        raise OutputError(path, NotADirectoryError(errno.ENOTDIR, f"{blocker} is not a directory")) from None
    except OSError as err:
        raise OutputError(path, err) from None


def _nearest_existing(path: str) -> str:
    """`path`, or the nearest of its ancestors that exists (the root at worst)."""
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def check_output(path, directory: bool = False) -> None:
    """An OutputError at once, before any work, where `path` (a file, or a directory of
    outputs) cannot be written: the nearest existing directory on its way must be one, and
    writable; a file path must not name a directory or a special file. Nothing is made.

    Args:
        path: the output path.
        directory: whether `path` is a directory of outputs.

    Raises:
        OutputError: `path` cannot be written.
    """
    if not directory:
        path = _refuse_non_files(path)
    existing = _nearest_existing(os.path.abspath(os.fspath(path)) if directory else os.path.dirname(path))
    if not os.path.isdir(existing):
        raise OutputError(path, NotADirectoryError(errno.ENOTDIR, f"{existing} is not a directory"))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(path, PermissionError(errno.EACCES, f"{existing} is not writable"))
    _check_name_lengths(path, existing)


def _check_name_lengths(path, existing: str) -> None:
    """An OutputError where a name on `path` is longer than the file system below `existing` takes."""
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = NAME_MAX
    for size in (len(os.fsencode(name)) for name in os.fspath(path).split(os.sep)):
        if size > limit:
            raise OutputError(path, OSError(errno.ENAMETOOLONG, f"a name of {size} bytes, over the {limit} a file "
                                                                "name may take"))


def _refuse_non_files(path) -> str:
    """The destination of a file `path`; an OutputError where it names a directory or a file
    that is not regular (a device, FIFO or socket: renaming would replace it)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"output path must be a str or os.PathLike, got {type(path).__name__}")
    if os.fspath(path).endswith(("/", os.sep)):  # realpath would drop the slash and write a file
        raise OutputError(path, IsADirectoryError(errno.EISDIR, "the path ends with '/', which names a directory"))
    try:  # the name given, links followed: realpath turns /proc's (/dev/stdout to a pipe) into no path
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise OutputError(path, OSError(errno.EINVAL, "it is not a regular file"))
    path = destination(path)
    if os.path.isdir(path):
        raise OutputError(path, IsADirectoryError(errno.EISDIR, "it is a directory"))
    if os.path.exists(path) and not os.path.isfile(path):
        raise OutputError(path, OSError(errno.EINVAL, "it is not a regular file"))
    return path


def _check_destination(path) -> str:
    path = _refuse_non_files(path)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise OutputError(path, FileNotFoundError(errno.ENOENT, f"directory {parent} does not exist"))
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def remove_stale_temps(path, refuse_held: bool = False) -> list:
    """Delete the temporaries of `path` (files or directories `.NAME.tmp-*`, `.NAME.old-*`)
    left by processes of this host that no longer run; returns what was removed.
    Temporaries of live processes and of other hosts are kept. A `.NAME.old-*` while
    `path` is absent is the previous version that a writer killed between the two
    renames of `_replace_directory`'s fallback had set aside: it is renamed back; a set
    of files (FileSet) that `path` belongs to, left half renamed, is finished first.
    Only while holding `path`'s OutputLock (this process's, or taken for the cleaning): a
    process that holds it may be a live writer whose pid looks dead from here (another
    PID namespace), so nothing is removed while another process holds it.

    Args:
        path: the destination whose temporaries are cleaned.
        refuse_held: raise where another process holds the lock, rather than leave its
            temporaries (a resume finds nothing to resume beside a run yet to save).

    Returns:
        The paths removed.

    Raises:
        OutputLockedError: with refuse_held, another process holds the lock (named).
    """
    path = destination(path)
    if (os.getpid(), path) in _HELD:
        return _remove_stale(path)
    if not os.path.isdir(os.path.dirname(path)):
        return []  # nothing to clean, and the lock would make the directories
    try:
        lock = OutputLock(path, _CLEANING).acquire()
    except OutputLockedError:
        if refuse_held:
            raise
        return []
    except OSError:  # the directory is not writable: nothing to do here
        return []
    try:
        return _remove_stale(path)
    finally:
        lock.release()


def _remove_stale(path: str) -> list:
    parent = os.path.dirname(path)
    removed: list = []
    try:
        entries = os.listdir(parent)
    except OSError:
        return removed
    _finish_sets(path, entries)
    heads = {kind: _temp_head(path, kind) for kind in ("tmp", "old")}
    for entry in entries:
        for kind, head in heads.items():
            if not entry.startswith(head):
                continue
            parts = entry[len(head):].rsplit("-", 2)
            if len(parts) != 3 or parts[0] != _HOST or not parts[1].isdigit() or _pid_alive(int(parts[1])):
                continue
            stale = os.path.join(parent, entry)
            if kind == "old" and not os.path.lexists(path):
                _restore(stale, path)  # never deleted while it is the only version
                continue
            if os.path.isdir(stale) and not os.path.islink(stale):
                shutil.rmtree(stale, ignore_errors=True)
            else:
                try:
                    os.unlink(stale)
                except OSError:
                    continue
            removed.append(stale)
    return removed


def _restore(aside: str, path: str) -> None:
    try:
        os.rename(aside, path)
    except OSError:  # another process restored it first, or it cannot be: it stays
        pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _kept_mode(previous: str, default: int, directory: bool = False) -> int:
    """The permissions of `previous` (what a new version replaces) where it exists and is
    of the same kind, else `default`: replacing a private output must not widen it. Files
    keep their rwx bits only (no set-id bits on new content); directories their setgid too."""
    try:
        st = os.lstat(previous)
    except OSError:
        return default
    if directory:
        return stat.S_IMODE(st.st_mode) if stat.S_ISDIR(st.st_mode) else default
    return st.st_mode & 0o777 if stat.S_ISREG(st.st_mode) else default


def fsync_directory(directory: str) -> None:
    """Flush a directory's entries to disk (a rename inside it then survives a crash).

    Args:
        directory: the directory.
    """
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StreamedFile:
    """Text written to a temporary beside `path`, flushed at every `write`, and made
    `path` by `publish()` (or deleted by `discard()`). The temporary is created at once,
    so a destination that cannot be written is reported before any work is done.
    `one_writer`: hold `path`'s OutputLock until then, so that a second long writer of the
    same destination is refused at its start rather than replacing this one's output."""

    def __init__(self, path, binary: bool = False, one_writer: bool = False):
        self.path = _check_destination(path)
        self._lock = OutputLock(self.path).acquire() if one_writer else None
        remove_stale_temps(self.path)
        try:
            fd, self.temp = tempfile.mkstemp(prefix=_temp_prefix(self.path), dir=os.path.dirname(self.path))
        except OSError as err:
            self._release()
            raise OutputError(self.path, err) from None
        self._file: IO = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")
        self.published = False

    def write(self, text) -> None:
        """Append `text` to the temporary and flush it.

        Args:
            text: str, or bytes for a binary file.

        Raises:
            OutputError: the write failed (a full disk).
        """
        try:
            self._file.write(text)
            self._file.flush()
        except OSError as err:
            raise OutputError(self.path, err) from None

    def publish(self, drop_partial: bool = False) -> None:
        """Flush to disk and rename over `path` (with the permissions of the file it
        replaces; a new file gets the ordinary ones, subject to the umask).

        Args:
            drop_partial: then delete the partial result an earlier writer stopped before its
                end left beside `path` (partial_path), stale once `path` is complete; still
                under `path`'s lock, so never a partial result of a writer that follows.

        Raises:
            OutputError: the rename (or the deletion) failed.
        """
        self._publish_as(self.path, drop_partial)

    def publish_partial(self) -> str:
        """Publish what was written as a partial result, beside `path` (partial_path), never
        over it: a writer stopped before its end must not replace a complete `path`.

        Returns:
            The partial result's path.
        """
        target = partial_path(self.path)
        self._publish_as(target)
        return target

    def _publish_as(self, target: str, drop_partial: bool = False) -> None:
        try:
            self._complete()
            os.replace(self.temp, target)
        except OSError as err:
            self.discard()
            raise OutputError(target, err) from None
        self.published = True
        _flush_published(os.path.dirname(target))
        try:
            if drop_partial:
                _unlink_if_there(partial_path(self.path))
        except OSError as err:
            raise OutputError(partial_path(self.path), err) from None
        finally:
            self._release()

    def _complete(self) -> None:
        """The temporary on disk, closed, with the mode `path` will have."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.chmod(self.temp, _kept_mode(self.path, 0o666 & ~_umask()))

    def discard(self) -> None:
        """Delete the temporary; `path` is left as it was.
        """
        try:
            self._file.close()
        except OSError:
            pass
        try:
            os.unlink(self.temp)
        except FileNotFoundError:
            pass
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> StreamedFile:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if not self.published:
            self.discard()


@contextmanager
def atomic_file(path, mode: str = "w") -> Iterator[IO]:
    """A file object to write `path` with: the content replaces `path` in one rename
    when the block ends, or is deleted if the block raises.

    Args:
        path: the file to replace.
        mode: "w" or "wb".

    Yields:
        The open temporary file.

    Raises:
        OutputError: `path` cannot be written.
    """
    out = StreamedFile(path, binary="b" in mode)
    try:
        yield out._file
        out.publish()
    except OSError as err:
        out.discard()
        if isinstance(err, OutputError):
            raise
        raise OutputError(out.path, err) from None
    except BaseException:
        out.discard()
        raise


def write_text(path, text: str) -> None:
    """Replace `path` by `text` atomically (see atomic_file).

    Args:
        path: the file to replace.
        text: its new content.

    Raises:
        OutputError: `path` cannot be written.
    """
    with atomic_file(path) as f:
        f.write(text)


def write_bytes(path, data: bytes) -> None:
    """Replace `path` by `data` atomically (see atomic_file).

    Args:
        path: the file to replace.
        data: its new content.

    Raises:
        OutputError: `path` cannot be written.
    """
    with atomic_file(path, "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- partial results


def partial_path(path) -> str:
    """Where a writer stopped before its end leaves what it finished of `path`: beside it,
    `.partial` before the suffix (samples.jsonl -> samples.partial.jsonl), so that a partial
    result neither replaces a complete `path` nor passes for one.

    Args:
        path: the complete output's path.

    Returns:
        The partial result's path.
    """
    head, name = os.path.split(os.fspath(path))
    stem, suffix = os.path.splitext(name)
    room = NAME_MAX - len(os.fsencode(".partial" + suffix))
    return os.path.join(head, f"{_fitted(stem, room)}.partial{suffix}")


def remove_partial(path) -> None:
    """Delete the partial result of `path` (partial_path), once `path` is complete.

    Args:
        path: the complete output's path.

    Raises:
        OutputError: it cannot be deleted.
    """
    try:
        _unlink_if_there(partial_path(destination(path)))
    except OSError as err:
        raise OutputError(partial_path(path), err) from None


# ---------------------------------------------------------------- sets of files


class FileSet:
    """Files replaced together, as one set (a report's CSV, Markdown and plot): each is
    written to a temporary beside its destination (`open` returns its StreamedFile), and
    `publish()` renames them over their destinations once every one is complete on disk.
    The renames are first recorded in a journal (`.NAME.set-HOST-PID-XXXXXXXX` beside each
    destination directory, NAME the first file's): a writer killed between two renames
    leaves it, and the next writer of any file of the set finishes the renames
    (remove_stale_temps) before it writes, so the set is never left half old, half new
    for a writer to find. Without `publish()` (an error, the end of a `with` block), the
    temporaries are deleted and the previous set stays."""

    def __init__(self):
        self._files: list[StreamedFile] = []

    def open(self, path, binary: bool = False) -> StreamedFile:
        """A temporary for `path` (a path opened twice: the later content counts).

        Args:
            path: a file of the set.
            binary: open for bytes.

        Returns:
            The StreamedFile to write.
        """
        out = StreamedFile(path, binary=binary)
        for earlier in [f for f in self._files if f.path == out.path]:
            earlier.discard()
            self._files.remove(earlier)
        self._files.append(out)
        return out

    def publish(self) -> None:
        """Rename every temporary over its file, journalled so that a killed writer's set is
        finished by the next; a signal meanwhile is raised once the set is whole.

        Raises:
            OutputError: a rename failed.
        """
        with signals_held():  # raised between two renames, it left the set half old, half new
            self._publish()

    def _publish(self) -> None:
        if not self._files:
            return
        if len(self._files) == 1:
            self._files.pop().publish()
            return
        current = None
        try:
            for current in self._files:
                current._complete()
            journals = _write_journals([(f.temp, f.path) for f in self._files])
        except OSError as err:
            self.discard()
            raise err if isinstance(err, OutputError) else OutputError(current.path, err) from None
        for current in self._files:  # a failure here leaves the journal: the next writer finishes the set
            try:
                os.replace(current.temp, current.path)
            except OSError as err:
                self._files = []  # the journal and the temporaries stay, for the next writer
                raise OutputError(current.path, err) from None
            current.published = True
        for directory in {os.path.dirname(f.path) for f in self._files}:
            _flush_published(directory)
        for journal in journals:
            try:  # the set is published: a journal left (EIO) is finished and removed by the next writer
                _unlink_if_there(journal)
            except OSError:
                pass
        self._files = []

    def discard(self) -> None:
        """Delete every temporary; the files are left as they were.
        """
        for out in self._files:
            if not out.published:
                out.discard()
        self._files = []

    def __enter__(self) -> FileSet:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()


def _write_journals(renames: list[tuple]) -> list[str]:
    """A journal of `renames` ((temporary, destination) pairs) in each directory they go
    to, flushed to disk before any rename: it lists every journal, so that finishing the
    set from any of them removes them all."""
    directories = list(dict.fromkeys(os.path.dirname(dest) for _, dest in renames))
    first = renames[0][1]
    journals = []
    try:
        for directory in directories:
            fd, journal = tempfile.mkstemp(prefix=_temp_prefix(first, "set"), dir=directory)
            os.close(fd)
            journals.append(journal)
        text = json.dumps({"ddpd-file-set": 1, "renames": renames, "journals": journals})
        for journal in journals:
            with open(journal, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            fsync_directory(os.path.dirname(journal))
    except BaseException:
        for journal in journals:
            _unlink_if_there(journal)
        raise
    return journals


def _finish_sets(path: str, entries: list[str]) -> None:
    """Finish the renames of every set `path` belongs to whose writer died (its journal
    beside `path`, among `entries`); a journal that is not complete JSON was cut short
    before any rename, and is deleted."""
    parent = os.path.dirname(path)
    marker = f".set-{_HOST}-"
    for entry in entries:
        head, found, rest = entry.rpartition(marker)
        pid = rest.split("-", 1)[0]
        if not found or not head.startswith(".") or not pid.isdigit() or _pid_alive(int(pid)):
            continue
        journal = os.path.join(parent, entry)
        try:
            with open(journal, encoding="utf-8") as f:
                record = json.load(f)
            renames = [(str(temp), str(dest)) for temp, dest in record["renames"]]
            journals = [str(j) for j in record["journals"]]
        except (OSError, ValueError, KeyError, TypeError):
            if entry.startswith(_temp_head(path, "set")):
                _unlink_if_there(journal)
            continue
        if path not in (dest for _, dest in renames):
            continue
        try:
            for temp, dest in renames:
                if os.path.lexists(temp):  # the ones gone were renamed before the writer died
                    os.replace(temp, dest)
            for other in journals:
                _unlink_if_there(other)
        except OSError:  # cannot be finished now: the journal stays for a later writer
            continue


def _unlink_if_there(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------- directories


@contextmanager
def atomic_directory(path) -> Iterator[str]:
    """Yield a fresh temporary directory beside `path`; on success make it `path`
    (replacing an existing directory in one step where Linux allows), on any failure
    delete it. Stale temporaries of dead writers of `path` are removed first.

    Args:
        path: the directory to replace.

    Yields:
        The temporary directory's path, to fill.

    Raises:
        TypeError: `path` is not a str or os.PathLike.
        OutputError: `path` cannot be written, or is the working directory or holds it.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"output path must be a str or os.PathLike, got {type(path).__name__}")
    if not os.fspath(path):  # abspath would make it the working directory, which the swap would replace
        raise OutputError(path, ValueError("the path is empty"))
    refuse_working_directory(path)
    path = destination(path)
    parent = os.path.dirname(path)
    make_parents(path, parent)
    try:
        remove_stale_temps(path)
        tmp = tempfile.mkdtemp(prefix=_temp_prefix(path), dir=parent)
    except OSError as err:
        raise OutputError(path, err) from None
    try:
        yield tmp
        _publish_permissions(tmp, path)
        _sync_tree(tmp)
        with signals_held():  # between two renames `path` is absent
            _replace_directory(tmp, path)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OutputError):
            raise
        raise OutputError(path, err) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _flush_published(parent)


def _flush_published(directory: str) -> None:
    """fsync_directory after a rename that published the output: a directory that cannot be
    flushed leaves the rename less durable, not undone, so it fails no write."""
    try:
        fsync_directory(directory)
    except OSError:
        pass


def refuse_working_directory(path) -> None:
    """An OutputError where `path`, a directory to be replaced by a rename, is the working
    directory or one that holds it (`--out .`): the process, and the shell that started
    it, would be left in a deleted directory.

    Args:
        path: the directory to replace.

    Raises:
        OutputError: `path` is the working directory or one of its ancestors.
    """
    target = destination(path)
    try:
        here = os.path.realpath(os.getcwd())
    except FileNotFoundError:  # the working directory is gone already: nothing to keep
        return
    if here == target or here.startswith(target.rstrip(os.sep) + os.sep):
        raise OutputError(target, ValueError("it is the working directory or holds it, and the directory is "
                                             "replaced whole (by a rename); name a directory below it"))


def _replace_directory(new: str, path: str) -> None:
    if not os.path.exists(path):
        os.rename(new, path)
        return
    if _exchange(new, path):  # one atomic step: `path` is never absent
        _drop_previous(new)
        return
    # Two renames: killed between them, `path` is absent and its previous version is at
    # `old`, which the next writer's remove_stale_temps renames back.
    old = tempfile.mkdtemp(prefix=_temp_prefix(path, "old"), dir=os.path.dirname(path))
    os.rmdir(old)
    os.rename(path, old)
    try:
        os.rename(new, path)
    except OSError:  # a full directory, an I/O error: the previous version goes back, not left aside
        os.rename(old, path)
        raise
    _drop_previous(old)


def _drop_previous(previous: str) -> None:
    # the new version is in place: a previous one that cannot be deleted (a read-only folder
    # in it) is no failed save; it keeps its temporary name, which the next writer cleans
    if os.path.isdir(previous) and not os.path.islink(previous):
        shutil.rmtree(previous, ignore_errors=True)
        return
    try:  # a file the directory replaced (rmtree leaves it)
        os.remove(previous)
    except OSError:
        pass


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths with Linux renameat2(RENAME_EXCHANGE); False where
    the platform or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _publish_permissions(directory: str, previous: str) -> None:
    """The permissions of the same entries in `previous` (the version being replaced),
    ordinary ones (subject to the umask) for new entries, instead of the private ones
    that temporary directories and files are created with. Symbolic links are left
    alone: chmod would change what they point to."""
    umask = _umask()
    for root, dirs, files in os.walk(directory):
        before = os.path.join(previous, os.path.relpath(root, directory))
        os.chmod(root, _kept_mode(os.path.normpath(before), 0o777 & ~umask, directory=True))
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), _kept_mode(os.path.join(before, name), 0o666 & ~umask))


def _sync_tree(directory: str) -> None:
    """Flush the regular files below `directory`, then each directory's entries. Symbolic
    links and special files a user keeps there are not opened (a dead link fails, a FIFO
    waits for a writer): their directory's flush records them."""
    for root, _, files in os.walk(directory):
        for name in files:
            file = os.path.join(root, name)
            if stat.S_ISREG(os.lstat(file).st_mode):
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
        fsync_directory(root)


# ---------------------------------------------------------------- single writer


class OutputLock:
    """An exclusive lock on the output `path`, held from `acquire()` to `release()`
    (or the end of a `with` block, or the process): `fcntl.flock` on `.NAME.lock` beside
    `path`, which records the holder. A second `acquire()` of the same output, from any
    process, raises OutputLockedError naming the holder. What stands at the lock's path
    must be a regular file with no other link, never followed if it is a symbolic link:
    anything else is refused with an OutputError, and so is a holder line that cannot be
    written (a full disk), leaving nothing behind."""

    def __init__(self, path, _purpose: str = ""):
        self.path = destination(path)
        self._purpose = _purpose  # on the holder line
        parent, name = os.path.split(self.path)
        self.lock_path = os.path.join(parent, f".{_fitted(name, NAME_MAX - 6)}.lock")
        self._fd: Optional[int] = None
        self._made: list = []  # the directories acquire() created, deepest first

    def acquire(self) -> OutputLock:
        """Take the lock, or refuse at once.

        Returns:
            The lock itself.

        Raises:
            OutputLockedError: another process holds it (named in the message).
            OutputError: the lock file cannot be made, or is a link or special file.
        """
        parent = os.path.dirname(self.path)
        missing = parent
        while not os.path.exists(missing):
            self._made.append(missing)
            missing = os.path.dirname(missing)
        make_parents(self.path, parent)
        try:
            fd = self._lock_file()
            self._write_holder(fd)
        except BaseException:
            self._remove_made()
            raise
        self._fd = fd
        _HELD.add((os.getpid(), self.path))
        return self

    def _lock_file(self) -> int:
        """A descriptor of the lock file, locked: the file still at lock_path (the previous
        holder may delete it between our open and our lock)."""
        import fcntl

        patience = time.monotonic() + _CLEANING_WAIT
        while True:
            fd, created = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip()
                os.close(fd)
                # a cleaner (or a holder yet to write its line) lets go within milliseconds:
                # every rank of a torchrun cleans before process 0 takes the lock for the run
                if (not holder or holder.endswith(_CLEANING)) and time.monotonic() < patience:
                    time.sleep(0.01)
                    continue
                raise OutputLockedError(f"{self.path} is being written by {holder or 'another process'} "
                                        f"(lock {self.lock_path}); wait for it to finish or stop it") from None
            except OSError as err:  # no locks on this file system (ENOLCK), say
                if created:
                    self._discard(fd)
                os.close(fd)
                raise OutputError(self.path, err) from None
            try:
                same = os.stat(self.lock_path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def _discard(self, fd: int) -> None:
        """Delete the lock file this call created but could not lock, so that a refused
        writer leaves nothing behind: only while it is still the file at lock_path and
        empty (a holder writes its line as soon as it has locked it)."""
        try:
            here = os.stat(self.lock_path, follow_symlinks=False)
            mine = os.fstat(fd)
            if here.st_ino == mine.st_ino and here.st_dev == mine.st_dev and mine.st_size == 0:
                os.unlink(self.lock_path)
        except OSError:  # gone already, or cannot be deleted: the error raised names the cause
            pass

    def _open(self) -> tuple:
        """Open (or create) the lock file, refusing what is not a plain file of its own: a
        symbolic link (O_NOFOLLOW), a FIFO or device, a file with other hard links; the
        holder line would otherwise be written into another file (a link planted in /tmp).
        Returns the descriptor and whether this call created the file."""
        try:
            fd, created = self._open_or_create()
        except OSError as err:
            if err.errno == errno.ELOOP or os.path.islink(self.lock_path):
                self._refuse("is a symbolic link")
            raise OutputError(self.path, err) from None
        st = os.fstat(fd)
        what = "is not a regular file" if not stat.S_ISREG(st.st_mode) else \
            "has other links" if st.st_nlink > 1 else None
        if what is not None:
            os.close(fd)
            self._refuse(what)
        return fd, created

    def _open_or_create(self) -> tuple:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            return os.open(self.lock_path, flags | os.O_EXCL, 0o644), True
        except FileExistsError:  # another writer's, maybe held: never ours to delete
            return os.open(self.lock_path, flags, 0o644), False

    def _refuse(self, what: str) -> None:
        raise OutputError(self.path, OSError(errno.EEXIST, f"its lock {self.lock_path} {what}; remove it if no "
                                                           "ddpd process is writing there"))

    def _write_holder(self, fd: int) -> None:
        """The holder line, for the message of a refused second writer. It fails on a full
        disk: then the lock file goes (it is ours, and locked) and the error names the path."""
        try:
            os.ftruncate(fd, 0)
            line = f"pid {os.getpid()} on {_HOST} since {time.strftime('%Y-%m-%d %H:%M:%S')}{self._purpose}"
            os.write(fd, f"{line}\n".encode())
        except OSError as err:
            try:
                os.unlink(self.lock_path)
            except OSError:
                pass
            os.close(fd)
            raise OutputError(self.path, OSError(err.errno, f"{err.strerror or err} (writing its lock "
                                                            f"{self.lock_path})")) from None

    def release(self) -> None:
        """Release the lock and delete its file (while still holding it, so that no second
        writer locks a deleted file), and the directories acquire() made, where empty."""
        if self._fd is None:
            return
        try:
            os.unlink(self.lock_path)  # while still holding it, so no one locks a deleted file
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None
        _HELD.discard((os.getpid(), self.path))
        self._remove_made()

    def _remove_made(self) -> None:
        for directory in self._made:  # a run that wrote nothing leaves no empty directories behind
            try:
                os.rmdir(directory)
            except OSError:  # not empty: it holds the output, or something of someone else's
                break
        self._made = []

    def __del__(self) -> None:  # an abandoned holder releases its lock
        try:
            self.release()
        except Exception:  # at interpreter exit; the OS releases the lock with the process
            pass

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
