"""Writing files so that nothing a user saved is ever half-written.

Every writer first writes a temporary file (or folder) beside the target, then renames it over
the target: on POSIX a rename within one filesystem is atomic, so a reader, or the user after a
crash or Ctrl-C, sees either the old file or the new one, never a mixture.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .signals import handled


def _normal_permissions(path: str | Path, directory: bool = False) -> None:
    """mkstemp/mkdtemp create owner-only files (0600/0700); give the permissions of a normal
    file or folder under the current umask instead."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


# Below this many free bytes a writer's failure is taken for a full disk
FULL_DISK_BYTES = 1 << 20


def disk_full_error(error: BaseException, path: Path) -> OSError | None:
    """A writer's failure on a full disk as one OSError naming the file (ENOSPC), or None for
    any other: torch.save says only "basic_ios::clear: iostream error", safetensors and numpy
    other words, none the file or the cause."""
    if not isinstance(error, Exception):  # Ctrl-C
        return None
    full = getattr(error, "errno", None) == errno.ENOSPC
    try:
        full = full or shutil.disk_usage(path.parent).free < FULL_DISK_BYTES
    except OSError:
        pass
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) if full else None


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp_path)` then rename the temporary file over `path` (atomic on POSIX).

    The temporary file sits in the target's folder (created if needed) so the rename never
    crosses filesystems; it is removed if `write` raises, even on KeyboardInterrupt. On a full
    disk the error is one OSError naming `path` (`disk_full_error`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        _normal_permissions(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        full = disk_full_error(e, path)  # asked before the removal frees the space
        Path(tmp).unlink(missing_ok=True)
        if full is not None:
            raise full from e
        raise


def remove_temporaries(path: Path) -> list[Path]:
    """Remove what the writers above left beside `path` when killed (SIGKILL, a power cut):
    `.NAME.XXXXXXXX.tmp` files or folders and `.NAME.XXXXXXXX.old` folders, XXXXXXXX being
    tempfile's eight characters. A live writer's look the same, so only the holder of `path`'s
    lock (`vit.utils.locks.hold`, which calls this) may: no other writer of `path` is alive.
    Returns what was removed."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.(tmp|old)")
    removed = []
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*"):
        if not pattern.fullmatch(leftover.name):
            continue
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
        removed.append(leftover)
    return removed


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file (UTF-8) atomically."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def temporary_folder_beside(path: Path, suffix: str = ".tmp") -> Path:
    """A fresh folder `.NAME.XXXXXXXX.tmp` (or `.old`) beside `path`: a name
    `remove_temporaries` sweeps once the writer that made it is gone."""
    return Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix))


def atomic_write_dir(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp_dir)` to fill a fresh folder, then put it in place of `path`.

    An existing `path` is replaced only after `write` succeeded: it is renamed aside, the new
    folder renamed in, and the old one deleted, so a failure at any point leaves either the old
    folder or the new one under `path`. `path` must be a folder (or absent), never a file.
    """
    path = Path(path).resolve()  # "." or "x/.." cannot be renamed; the folder they name can
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} exists and is not a folder; choose a folder path")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_folder_beside(path)
    old = None
    try:
        write(tmp)
        _normal_permissions(tmp, directory=True)
        for inner in tmp.rglob("*"):  # some writers (safetensors) create owner-only files
            _normal_permissions(inner, directory=inner.is_dir())
        if path.exists():
            old = temporary_folder_beside(path, suffix=".old")
            os.replace(path, old / path.name)
        os.replace(tmp, path)
    except BaseException as e:
        full = disk_full_error(e, path)  # asked before the removal frees the space
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / path.name).exists() and not path.exists():
            os.replace(old / path.name, path)  # put the previous folder back
        if full is not None:
            raise full from e
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def atomic_write_files(paths: list[Path], write: Callable[[Path], object]) -> None:
    """Files that belong together (an ONNX file and the weights file it names): `write(folder)`
    writes each of `paths`' names into a fresh folder beside them, then they are renamed into
    place, the first last (the one a reader opens), Ctrl-C and SIGTERM held back until all are
    (`signals_held`: one between two renames would leave a new file beside an old one). A
    failure before the renames leaves every previous file as it was; all of `paths` must be in
    one folder."""
    paths = [Path(p) for p in paths]
    folder = paths[0].parent
    if any(p.parent != folder for p in paths):
        raise ValueError(f"files written together must share one folder: {paths}")
    folder.mkdir(parents=True, exist_ok=True)
    tmp = temporary_folder_beside(paths[0])  # paths[0].parent is folder
    try:
        write(tmp)
        for path in paths:
            _normal_permissions(tmp / path.name)
        with signals_held():
            for path in reversed(paths):
                os.replace(tmp / path.name, path)
    except BaseException as e:
        full = disk_full_error(e, paths[0])  # asked before the removal frees the space
        if full is not None:
            raise full from e
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def signals_held() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM are noted, not acted on: each takes effect right
    after it, through the handler that was there. Python runs signal handlers in the main
    thread, whichever thread the signal reached (blocking it in this thread alone would not
    hold it), so only the main thread can hold them; elsewhere nothing is held."""
    signals = (signal.SIGINT, signal.SIGTERM)
    # (a handler set outside Python, None here, could not be put back)
    unheld = any(signal.getsignal(signum) is None for signum in signals)
    if unheld or threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame) -> None:
        noted.append(signum)

    try:
        with handled(signals, note):
            yield
    finally:
        for signum in noted:
            signal.raise_signal(signum)  # now, as it would have been


def check_marked(folder: Path, mark: str) -> None:
    """FileExistsError where `folder` exists without the `mark` file `marked_write_dir` keeps in
    what it writes: someone else's folder, never to be removed."""
    if folder.exists() and not (folder / mark).is_file():
        raise FileExistsError(
            f"{folder} exists and is not this script's; remove it or give another folder"
        )


def marked_write_dir(path: Path, tmp: Path, mark: str, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` to fill the fresh folder `tmp`, then rename it to `path` (absent).

    For long writes that are often stopped: `tmp` is one fixed name, marked by a `mark` file
    while it is written, so that one a killed run left (SIGKILL runs no cleanup) is known as
    this writer's own and removed by the next run, and one without the mark is refused
    (`check_marked`) and left as it is. `tmp` is removed if `write` raises, even on
    KeyboardInterrupt.
    """
    check_marked(tmp, mark)
    shutil.rmtree(tmp, ignore_errors=True)  # a killed run's, marked as this writer's
    tmp.mkdir(parents=True)
    (tmp / mark).write_text("")
    try:
        write(tmp)
        (tmp / mark).unlink()
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # stopped or failed: made here, removed here
