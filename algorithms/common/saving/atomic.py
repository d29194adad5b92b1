"""Atomic writes: a kill at any instant leaves the old complete file (or folder) or the new one, never a mix.

The one place that writes through a temporary name: every file the project writes to stay (model files, replay
buffers, checkpoints, exported folders, the precision probe's cache) goes through :func:`atomic_write` or
:func:`atomic_directory` (``tests/test_layout.py`` fails on a temporary file or a rename anywhere else).

Two context managers::

    with atomic_write("model.zip") as f:          # f: a file opened for writing ("wb" or "w")
        f.write(data)

    with atomic_directory("export/") as folder:   # folder: an empty temporary folder beside "export/"
        model.save_pretrained(folder)

**Files.** :func:`atomic_write` writes to a temporary file beside the target (same folder, so the same file
system), named ``.<name>.<pid>.<random>.tmp``; on success it flushes, ``fsync``\\ s, renames it over the target
with ``os.replace`` (atomic on POSIX and Windows) and ``fsync``\\ s the folder. On an exception the temporary
file is removed and the target is untouched. A process killed mid-write leaves its temporary file behind; the
next atomic write to the same target removes the leftovers of processes that no longer run.

**Folders** (the swap). :func:`atomic_directory` yields an empty temporary folder beside the target; on
success it ``fsync``\\ s every file in it, then swaps it into place:

1. no folder at the target yet: one ``rename`` (atomic);
2. on Linux: one ``renameat2(RENAME_EXCHANGE)``, which exchanges the two folders atomically, then the old one
   (now at the temporary name) is deleted. A kill at any instant leaves the old complete folder or the new one
   at the target;
3. elsewhere (or on a file system without ``RENAME_EXCHANGE``): ``rename(target, .<name>.old)`` then
   ``rename(temporary, target)``, then the old folder is deleted. A kill between the two renames leaves the
   target missing, the old complete folder at ``.<name>.old`` and the new complete one at its temporary name;
   the next :func:`atomic_directory` on that target, or :func:`recover_directory`, puts the old one back.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "atomic_directory",
    "atomic_write",
    "check_writable",
    "disk_full",
    "recover_directory",
    "remove_stale_temporaries",
]

_WRITE_MODES = ("wb", "w", "wt")
#: the errors of a full disk (or quota, or file-size limit)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full(error: OSError, target: Path) -> OSError:
    """The error of a write that ran out of space, naming the target and the disk it is on."""
    folder = target.parent.resolve()
    free = shutil.disk_usage(folder).free if folder.exists() else None
    left = f", {free:,} bytes free there" if free is not None else ""
    return OSError(
        error.errno,
        f"no space left to write {os.fspath(target)!r} on the disk holding {os.fspath(folder)!r} "
        f"({error.strerror}{left}); nothing was replaced: free some space or write elsewhere",
    )


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb", encoding: str | None = None) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` for writing; on success it replaces ``path`` atomically
    (:func:`atomic_path`).

    :param path: the file to write (its folder must exist)
    :param mode: ``"wb"`` (bytes, default) or ``"w"`` (text)
    :param encoding: the text encoding for ``mode="w"`` (default: UTF-8)
    :raises ValueError: for another mode, or when ``path`` is an existing folder
    """
    if mode not in _WRITE_MODES:
        raise ValueError(f"mode must be one of {_WRITE_MODES}, got {mode!r}")
    with atomic_path(path) as temporary:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        kwargs = {} if "b" in mode else {"encoding": encoding or "utf-8", "newline": ""}
        with os.fdopen(fd, mode, **kwargs) as handle:
            yield handle


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that opens the file itself (the ``gguf`` package's); on success
    the file written there is flushed to disk (fsync) and replaces ``path`` atomically, with ``path``'s permissions;
    on an exception it is deleted (a full disk named as such).

    :raises ValueError: when ``path`` is an existing folder
    """
    target = Path(os.fspath(path))
    if target.is_dir():
        raise ValueError(f"cannot write the file {os.fspath(target)!r}: it is an existing folder")
    remove_stale_temporaries(target.parent, target.name)
    temporary = _temporary_name(target)
    try:
        yield temporary
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        _copy_permissions(target, temporary)
        os.replace(temporary, target)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            raise disk_full(error, target) from None
        raise
    _fsync_directory(target.parent)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; on success it takes the place of ``path`` atomically.

    See the module docstring for the swap. On an exception the temporary folder is deleted and ``path`` is
    untouched.

    :param path: the folder to write (its parent must exist); an existing folder there is replaced whole
    :raises ValueError: when ``path`` exists and is not a folder
    """
    target = Path(os.fspath(path))
    if target.exists() and not target.is_dir():
        raise ValueError(f"cannot write the folder {os.fspath(target)!r}: a file is in the way")
    recover_directory(target)
    remove_stale_temporaries(target.parent, target.name)
    temporary = _temporary_name(target)
    os.mkdir(temporary)
    try:
        yield temporary
        _fsync_tree(temporary)
        _swap_into_place(temporary, target)
    except BaseException as error:
        shutil.rmtree(temporary, ignore_errors=True)
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            raise disk_full(error, target) from None
        raise


def recover_directory(path: str | os.PathLike[str]) -> None:
    """Finish a folder swap interrupted by a kill (the fallback swap of :func:`atomic_directory`): put the old
    folder back when the target is missing, or delete the old one left by a completed swap."""
    target = Path(os.fspath(path))
    backup = _backup_name(target)
    if not backup.is_dir():
        return
    if target.exists():
        shutil.rmtree(backup, ignore_errors=True)
    else:
        os.rename(backup, target)
        _fsync_directory(target.parent)


# ---------------------------------------------------------------------------------------------- internals
def _temporary_name(target: Path) -> Path:
    return target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _backup_name(target: Path) -> Path:
    return target.parent / f".{target.name}.old"


def remove_stale_temporaries(folder: str | os.PathLike[str], targets: str | Callable[[str], bool]) -> None:
    """Delete the temporaries ``.<target>.<pid>.<random>.tmp`` that writes killed half-way left in ``folder``, for
    the target name ``targets`` (or the names it accepts), of processes that no longer run.

    :param folder: the folder the targets are written in
    :param targets: a target's name, or a test of a target's name (e.g. every checkpoint folder)
    """
    accept = targets if callable(targets) else targets.__eq__
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            name = entry.name
            if not (name.startswith(".") and name.endswith(".tmp")):
                continue
            parts = name[1 : -len(".tmp")].rsplit(".", 2)  # target, pid, random
            if len(parts) != 3 or not accept(parts[0]) or not parts[1].isdigit() or _process_exists(int(parts[1])):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def check_writable(folder: str | os.PathLike[str]) -> None:
    """Create and delete a temporary file in ``folder``: raises the ``OSError`` a write there would meet."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
        pass


def _process_exists(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # it exists (another user's), or we cannot tell: keep its file
    return True


def _copy_permissions(target: Path, temporary: Path) -> None:
    """Keep an existing target's permission bits (a new file gets the default ``0o666 & ~umask``)."""
    with contextlib.suppress(OSError):
        os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))


def _fsync_directory(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError), open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_directory(Path(root))


def _swap_into_place(temporary: Path, target: Path) -> None:
    if not os.path.lexists(target):
        os.rename(temporary, target)
    elif _exchange(temporary, target):
        shutil.rmtree(temporary, ignore_errors=True)  # it now holds the old folder
    else:
        backup = _backup_name(target)
        if backup.exists():
            shutil.rmtree(backup)
        os.rename(target, backup)
        os.rename(temporary, target)  # a kill before this line is undone by recover_directory()
        _fsync_directory(target.parent)
        shutil.rmtree(backup, ignore_errors=True)
    _fsync_directory(target.parent)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(first: Path, second: Path) -> bool:
    """Atomically exchange two paths with Linux's ``renameat2(RENAME_EXCHANGE)``; ``False`` where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # the kernel or the file system cannot exchange: use the two-rename swap
    raise OSError(code, os.strerror(code), os.fspath(second))
