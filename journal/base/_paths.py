"""Paths from configs, the permissions of a journal folder, LMDB files that are safe to open, and
what a folder must be to hold a journal (with the `JournalError` an OS error becomes, saying what to do).

Run keys never become paths: they are LMDB keys inside the journal, so no run key can reach the file
system. A config that names a journal *relative to a base folder* (verl's ``dump_dir`` with a
subfolder, a sweep root with a run name) goes through `resolve_journal_path`, which refuses anything
that would land outside that folder.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from typing import List, Union

from ._errors import JournalError, JournalFullError, UnsafePathError
from ._owned import file_kind

__all__ = [
    "resolve_journal_path",
    "security_warnings",
    "check_lmdb_files",
    "prepare_journal_folder",
    "os_error",
    "JOURNAL_FILES",
    "writer_lock_name",
    "check_room_to_create",
]

# Free bytes a new journal's files need before LMDB creates them (lock.mdb with 256 reader slots is
# ~16 KiB, data.mdb starts with a few pages); see `check_room_to_create`.
_ROOM_TO_CREATE = 1 << 20
# What a journal folder holds: LMDB's two files, and one live-writer lock per run and mode (see `_writers`).
JOURNAL_FILES = frozenset({"data.mdb", "lock.mdb"})
_WRITER_LOCK = re.compile(r"writer-[0-9a-f]{32}\.lock")


def writer_lock_name(run: str, mode: str = "train") -> str:
    """The file name of the live-writer lock of (`run`, `mode`) in a journal folder.

    Per mode, so the processes of one multi-process trainer (modes ``train/p0``, ``train/p1`` ...)
    each hold their own; the ``train`` lock keeps the name earlier releases gave the run's lock.
    """
    key = run if mode == "train" else f"{run}\0{mode}"
    return "writer-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".lock"

PathLike = Union[str, "os.PathLike[str]"]


def resolve_journal_path(root: PathLike, path: PathLike) -> str:
    """Join a journal path from a config onto the folder it must stay in; refuse every way out.

    `root` is trusted (whoever runs the job chose it); `path` comes from a config and is not. The
    result has every symbolic link resolved, so a link inside `root` pointing elsewhere is caught
    here, at the time of the call.

    Args:
        root: the folder the journal must stay in, e.g. verl's ``dump_dir``.
        path: the relative path a config gives, e.g. ``"stepjournal"`` or ``"runs/exp1"``.

    Returns:
        The absolute, resolved path of the journal folder, inside `root` (never `root` itself).

    Raises:
        UnsafePathError: `path` is empty, absolute, holds a NUL, or leads outside `root` through
            ``..`` or a symbolic link.
    """
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip() or "\x00" in text:
        raise UnsafePathError(f"journal path {text!r} from the config is empty or not a plain path")
    if os.path.isabs(text) or os.path.splitdrive(text)[0]:
        raise UnsafePathError(
            f"journal path {text!r} from the config is absolute; give a path relative to {os.fspath(root)!r}"
        )
    base = os.path.realpath(os.fspath(root))
    resolved = os.path.realpath(os.path.join(base, text))
    if resolved == base or os.path.commonpath([base, resolved]) != base:
        raise UnsafePathError(
            f"journal path {text!r} from the config leads to {resolved!r}, outside {base!r} "
            "(through '..' or a symbolic link); keep journals inside the folder the config is about"
        )
    return resolved


def security_warnings(path: PathLike) -> List[str]:
    """Say what lets another user change (or swap) the journal at `path`; empty when nothing does.

    Checks the journal folder, its data and lock files (writable by group or others, owned by
    someone else) and its parent folder (writable by others without the sticky bit, so the journal
    could be renamed away and replaced).
    """
    folder = os.path.realpath(os.fspath(path))
    found: List[str] = []
    me = os.geteuid() if hasattr(os, "geteuid") else None
    for name in (None, "data.mdb", "lock.mdb"):
        target = folder if name is None else os.path.join(folder, name)
        what = "journal folder" if name is None else name
        try:
            st = os.stat(target)
        except FileNotFoundError:
            continue
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            who = "others" if st.st_mode & stat.S_IWOTH else "its group"
            found.append(f"{what} {target!r} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}); "
                         f"chmod {'700' if name is None else '600'} it")
        if me is not None and st.st_uid != me:
            found.append(f"{what} {target!r} belongs to user id {st.st_uid}, not to this user ({me})")
    parent = os.path.dirname(folder)
    st = os.stat(parent)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        found.append(f"the folder holding the journal, {parent!r}, is writable by others without the sticky "
                     "bit: anyone can rename the journal away and put another in its place")
    return found


def check_lmdb_files(folder: str) -> None:
    """Refuse LMDB files that would make LMDB read or write something other than this journal's own file.

    LMDB opens `data.mdb` and `lock.mdb` and writes the lock file even for a read-only open; through
    a link (symbolic or hard) it would write into whatever else the file is, and a FIFO or a device
    would hang or feed it anything. Checked with `lstat` (links are not followed), in every mode.
    """
    me = os.geteuid() if hasattr(os, "geteuid") else None
    for name in ("data.mdb", "lock.mdb"):
        target = os.path.join(folder, name)
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(
                f"{name} in journal folder {folder!r} is a symbolic link; LMDB would write wherever it points. "
                "Replace it by the real file (or link the whole folder instead)"
            )
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(
                f"{name} in journal folder {folder!r} is {file_kind(st.st_mode)}, not a regular file; LMDB cannot "
                f"use it safely. Move it away{' (LMDB recreates a missing lock.mdb)' if name == 'lock.mdb' else ''}"
            )
        if st.st_nlink != 1:
            raise UnsafePathError(
                f"{name} in journal folder {folder!r} has {st.st_nlink} hard links; LMDB writes it (lock.mdb even "
                "when reading) and would change the other names too. Copy the journal folder (cp -r makes "
                "unlinked copies) and open the copy"
            )
        if me is not None and st.st_uid != me:
            raise UnsafePathError(
                f"{name} in journal folder {folder!r} belongs to user id {st.st_uid}, not to this user ({me}); "
                "its owner can change it under you. Copy the journal folder to a place of your own and open the copy"
            )


def os_error(path: str, exc: BaseException, doing: str) -> JournalError:
    """A `JournalError` for an OS error met while `doing` something to the journal at `path`, saying what to do."""
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code == errno.EROFS or "Read-only file system" in text:
        return JournalError(
            f"cannot {doing} journal {path!r}: it is on a read-only file system. Open an existing journal there "
            "with ", ("readonly", True), " to read it, or give a path on a writable disk (copy the folder there to "
            "record more)"
        )
    if code in (errno.EACCES, errno.EPERM) or "Permission denied" in text or "Operation not permitted" in text:
        return JournalError(
            f"cannot {doing} journal {path!r}: permission denied. Give a folder this user can write, or fix the "
            "permissions of the folder (and of the folder above it, for a new journal)"
        )
    if code in (errno.ENOSPC, errno.EDQUOT) or "No space left" in text or "quota exceeded" in text:
        return JournalFullError(
            f"cannot {doing} journal {path!r}: the disk (or the quota) is full. Free space, or give a path on "
            "another disk"
        )
    if code == errno.ENOTDIR or "Not a directory" in text:
        return JournalError(
            f"cannot {doing} journal {path!r}: a part of the path is a file, not a folder. Give another path"
        )
    if code == errno.EEXIST:
        return JournalError(f"cannot {doing} journal {path!r}: {_file_in_the_way(path)}")
    detail = getattr(exc, "strerror", None) or text
    return JournalError(f"cannot {doing} journal {path!r}: {detail}. Check the path, or give another one")


def _file_in_the_way(path: str) -> str:
    return (
        "the path is a file, not a journal folder. Give the path of a journal folder (a new or empty folder "
        "for a new journal), or move the file away"
    )


def prepare_journal_folder(path: str, folder: str, *, readonly: bool) -> None:
    """Check (and for a writer, create) the journal folder before LMDB opens it.

    A writer gets a new folder (owner-only), an empty one, or one that already holds a journal
    (``data.mdb``); a folder of other files is refused, so a journal never mixes its files into a
    checkpoint or output folder. A reader needs a folder with a ``data.mdb``.

    Args:
        path: the path as the caller gave it (for messages).
        folder: its resolved form.
        readonly: whether the journal is opened read-only.

    Raises:
        JournalError: the path is a file; the folder is not a journal; it cannot be created or read
            (read-only file system, permissions, ...). `JournalFullError` when the disk is full.
    """
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise JournalError(f"cannot open journal {path!r}: {_file_in_the_way(path)}")
    if readonly:
        if not os.path.isdir(folder) or not os.path.exists(os.path.join(folder, "data.mdb")):
            raise JournalError(f"no journal at {path!r}: the folder or its data.mdb is missing")
        return
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        entries = os.listdir(folder)
    except OSError as exc:
        raise os_error(path, exc, "create") from None
    if "data.mdb" in entries:
        return
    others = sorted(name for name in entries if name not in JOURNAL_FILES and not _WRITER_LOCK.fullmatch(name))
    if others:
        shown = ", ".join(repr(name) for name in others[:5])
        shown += f" and {len(others) - 5} more" if len(others) > 5 else ""
        inside = os.path.join(path, "stepjournal")
        raise JournalError(
            f"cannot create a journal in {path!r}: the folder holds other files ({shown}) and no journal "
            f"(data.mdb); stepjournal does not mix its files into another folder. Give a new or empty folder, "
            "e.g. ", ("path", inside)
        )


def check_room_to_create(path: str, folder: str, data_file: str, lock: bool) -> None:
    """Refuse to let LMDB create its files on a (nearly) full disk: it would die of SIGBUS, not fail.

    LMDB sizes a new lock.mdb with ftruncate (a sparse file) and then writes into its memory map; on
    a full disk that page cannot be allocated and the process is killed by SIGBUS inside
    `lmdb.open`. So before a file is created, this much must be free.
    """
    creating = not os.path.exists(data_file) or (lock and not os.path.exists(os.path.join(folder, "lock.mdb")))
    if not creating:
        return
    try:
        st = os.statvfs(folder)
    except OSError:
        return  # nothing to go by; lmdb.open reports what it meets
    free = st.f_bavail * st.f_frsize
    if free < _ROOM_TO_CREATE:
        raise JournalFullError(
            f"cannot create journal {path!r}: the disk holding it has {free} bytes free, and a new journal's "
            f"files need {_ROOM_TO_CREATE}. Free space, or give a path on another disk"
        )
