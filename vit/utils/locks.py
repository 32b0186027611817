"""One writer per run folder and per output file: an OS file lock held while a command writes.

The lock is the operating system's (`flock`) on a small lock file: a folder's is `FOLDER/.lock`,
a file's is `.NAME.lock` beside it. The OS drops it when its process ends, however it ends, so a
killed run leaves no stale lock: the next command takes it at once. The file says which process
holds it (its PID and command), so a refused command can name it. Its holder, the one writer,
removes the temporaries a killed writer left beside the path (`files.remove_temporaries`).
Locks are advisory: they stop this package's commands from writing one place at once, nothing
else; and they hold on the machine whose filesystem the path is on (a network filesystem may
not honour them: docs/errors.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .files import remove_temporaries

try:
    import fcntl
except ImportError:  # Windows: no flock; the commands run without the lock there
    fcntl = None

LOCK_NAME = ".lock"  # inside a locked folder


class LockError(RuntimeError):
    """The lock of a path could not be taken: another process holds it (InUseError), or its
    lock file cannot be made there (CannotLockError)."""


class CannotLockError(LockError):
    """The lock file cannot be made beside (or in) `path`: a location that cannot be written
    though it looked writable (/proc, a root's view of a read-only place)."""

    def __init__(self, path: Path, error: OSError) -> None:
        self.path = path
        super().__init__(f"{path}: cannot write there ({error.strerror or error})")


class InUseError(LockError):
    """Another process holds the lock: `path` (the folder or file), `pid` and `command` (its
    command line, when known)."""

    def __init__(self, path: Path, pid: int | None, command: str) -> None:
        self.path, self.pid, self.command = path, pid, command
        who = f"process {pid}" if pid else "another process"
        running = f" ({command})" if command else ""
        super().__init__(
            f"{path}: in use by {who}{running}, which is writing there; wait for it to "
            f"finish, or choose another {'folder' if path.is_dir() else 'file'}"
        )


def lock_file(path: Path, folder: bool) -> Path:
    """Where the lock of `path` lives: FOLDER/.lock, or .NAME.lock beside a file."""
    path = Path(path)
    return path / LOCK_NAME if folder else path.parent / f".{path.name}.lock"


def holder(path: Path, folder: bool) -> tuple[int | None, str] | None:
    """(pid, command) of the process that holds `path`'s lock now, or None if none does.
    Writes nothing (a probe before any work; `hold` is what takes the lock)."""
    target = lock_file(path, folder)
    if fcntl is None or not target.is_file():
        return None
    try:
        fd = os.open(target, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(fd)
    finally:
        os.close(fd)  # also drops the probe's own lock, had it taken it
    return None


@contextmanager
def hold(path: Path, folder: bool) -> Iterator[None]:
    """Hold `path`'s lock for the block, or raise InUseError at once if another process holds
    it. Folders that do not exist (the locked folder, or an output file's folder) are made for
    the lock file and removed again at the end if the block left them empty, so a refused or
    failed start leaves nothing behind."""
    path = Path(path)
    if fcntl is None:
        yield
        return
    target = lock_file(path, folder)
    made = [d for d in [target.parent, *target.parent.parents] if not d.exists()]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = _acquire(path, target)
    except OSError as e:
        raise CannotLockError(path, e) from e
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n{' '.join(sys.argv)}\n".encode())
        # the lock makes this the path's only writer: temporaries beside it are a killed one's
        remove_temporaries(path)
        yield
    finally:
        # Removed while still held: a process that opened it meanwhile finds it gone (see
        # _acquire) instead of locking an orphan beside the next holder.
        target.unlink(missing_ok=True)
        os.close(fd)
        for folder_made in made:  # deepest first
            try:
                folder_made.rmdir()  # only if the block wrote nothing there
            except OSError:
                break


def _acquire(path: Path, target: Path) -> int:
    """Open and lock `target`; InUseError naming the holder if another process has it."""
    while True:
        fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, command = _read_holder(fd)
            os.close(fd)
            raise InUseError(path, pid, command) from None
        try:
            same = os.stat(target).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed this file as we opened it: take the new one


def _read_holder(fd: int) -> tuple[int | None, str]:
    """(pid, command) as the holder wrote them into its lock file."""
    try:
        lines = os.pread(fd, 4096, 0).decode(errors="replace").splitlines()
    except OSError:
        return None, ""
    pid = int(lines[0]) if lines and lines[0].strip().isdigit() else None
    return pid, lines[1].strip() if len(lines) > 1 else ""
