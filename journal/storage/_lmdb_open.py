"""Open LMDB environments and named databases while other processes create them or grow the map.

A new journal's ``data.mdb`` is created empty inside `lmdb.open`, which then writes its first pages;
another process that opens the journal meanwhile waits in LMDB's own lock, but the checks made before
that lock (an empty ``data.mdb`` is refused: LMDB would start a new journal over it) would see the
half-created file. So the creation and those checks exclude each other under `creation_lock`, an
`flock` on the journal folder itself (no file of its own).

LMDB reads the map's size when an environment opens and refuses a transaction (`MDB_MAP_RESIZED`)
once another process has committed past that size. py-lmdb begins a transaction inside `lmdb.open`,
so a growth committed between the two fails the open itself. Both calls here open again, which
reads the size the other process committed; the map only grows, so a few tries settle it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional

import lmdb

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

from ..base._errors import IntegrityError, JournalError
from ..base._log import get_logger
from ._format import check_format_of

__all__ = ["open_env", "open_db", "creation_lock", "check_sizes", "empty_data_file", "check_format_for_writing"]

log = get_logger(__name__)

_TRIES = 8


@contextmanager
def creation_lock(folder: str, *, exclusive: bool) -> Iterator[bool]:
    """Hold the journal `folder`'s `flock` around the checks before `lmdb.open` and the open itself.

    Taken when ``data.mdb`` is missing or empty at first sight: exclusive by a writer, which may
    create it; shared by a reader, which waits only for a creation under way. Held for the open
    alone (not the structure check after it); a journal with pages is opened without it.

    Yields:
        True while held; False where the folder cannot be locked (not readable, or a filesystem
        without `flock` on folders): then nothing waits, as without the lock, and an empty
        ``data.mdb`` is refused at once.
    """
    if fcntl is None:  # pragma: no cover
        yield False
        return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        log.info("journal_open_not_serialised", path=folder, reason=exc.strerror)
        yield False
        return
    held = True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    except OSError as exc:
        held = False
        log.info("journal_open_not_serialised", path=folder, reason=exc.strerror)
    try:
        yield held
    finally:
        try:
            if held:
                # Unlocked by name: a fork child made meanwhile (another thread's fork) shares the open
                # file, and closing this copy alone would leave the journal locked while that child lives.
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def check_sizes(**sizes: object) -> None:
    """Refuse a size (``map_size=``, ``max_size=``) that is not a whole number of bytes LMDB can take, or None."""
    for name, value in sizes.items():
        if value is not None and (type(value) is not int or not 0 <= value < 1 << 64):
            raise JournalError(f"{name}={value!r} is not a size: give a whole number of bytes (0 or more)")


def empty_data_file(path: str) -> IntegrityError:
    """The error for the journal at `path` whose ``data.mdb`` is empty with no creation under way."""
    return IntegrityError(
        f"journal {path!r} is damaged: data.mdb is empty (truncated, or its creation was interrupted "
        "before anything was recorded). Restore it from a copy, or move the folder away to start anew"
    )


def open_env(path: str, key: str, map_size: int, options: Dict[str, Any]) -> lmdb.Environment:
    """`lmdb.open(key, ...)`, opened again while another process grows the map (`path` names it in errors).

    The path is given as bytes: py-lmdb encodes a str path as strict UTF-8, which a folder name that is not
    UTF-8 (its bytes kept in the str as surrogates) cannot be.
    """
    for _ in range(_TRIES):
        try:
            return lmdb.open(os.fsencode(key), map_size=map_size, **options)
        except lmdb.MapResizedError:
            continue
    raise _resizing(path)


def check_format_for_writing(env: lmdb.Environment, path: str) -> None:
    """Refuse a journal of a newer format (`JournalFormatError`) before the caller creates the named databases
    this library knows and that format may lack.

    Reading the meta table maps data.mdb's pages: call it once the file's size and structure are checked
    (a truncated file would kill the process with SIGBUS here).
    """
    for _ in range(_TRIES):
        try:
            check_format_of(env, path, writing=True)
            return
        except lmdb.MapResizedError:
            env.set_mapsize(0)  # adopt the size another process committed meanwhile
    raise _resizing(path)


def open_db(env: lmdb.Environment, name: str, *, create: bool, path: str) -> Optional[lmdb._Database]:
    """The named database `name` (None when absent and not created), adopting a grown map as it opens."""
    for _ in range(_TRIES):
        try:
            return env.open_db(name.encode(), create=create)
        except lmdb.NotFoundError:
            return None
        except lmdb.MapResizedError:
            env.set_mapsize(0)  # 0: the size the other process committed
    raise _resizing(path)


def _resizing(path: str) -> JournalError:
    return JournalError(
        f"journal {path!r} was resized by another process {_TRIES} times while this one opened it; "
        "open it again once that process's growth settles"
    )
