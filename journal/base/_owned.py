"""The paths a journal owns in its folder, created, opened, listed and removed under one rule.

LMDB's two files are checked before LMDB opens them (`_paths.check_lmdb_files`). Everything else the
journal keeps in its folder (``payloads/``, its ``tmp/`` and two-digit folders, the payload files,
``remotes.json`` and its temporary file, the ``writer-*.lock`` files) goes through these functions,
because a journal folder received from someone else may hold a link or a FIFO at any of those names:

- no link is followed, not even in a parent: a folder is opened with ``O_DIRECTORY | O_NOFOLLOW``
  relative to the descriptor of the folder above it, a file with ``O_NOFOLLOW`` relative to its
  folder's descriptor, a name is removed or renamed relative to it. The one path followed is the
  journal folder itself (`open_root`), which the user named;
- only plain files and folders of this user are used, checked with `fstat` on what was opened;
- a file is opened with ``O_NONBLOCK``, so a FIFO at its name is refused instead of hanging the verb;
- a temporary file is created ``O_CREAT | O_EXCL`` under a random name (as `mkstemp` does).

Anything else at an owned path is an `UnsafePathError`, one line naming the path and what it is.
A step relative to a folder's descriptor names no path in the interpreter's own audit events, so each
step here raises ``stepjournal.owned_path`` (the step as the interpreter names it, and the path) first.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import sys
from contextlib import contextmanager
from typing import Iterator, List, Optional, Tuple, Union

from ._errors import UnsafePathError

__all__ = ["file_kind", "open_root", "open_folder", "make_folder", "open_file", "make_temp", "names_in", "entries",
           "kind_at",
           "closing", "owned_folder", "remove", "replace", "sync"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _NONBLOCK | _CLOEXEC
# What an open of something other than a plain file or folder fails with under the flags above: a link
# (ELOOP; EMLINK on the BSDs), a file where a folder is wanted (ENOTDIR), a FIFO without reader opened
# for writing (ENXIO), a folder opened for writing (EISDIR), a device or socket (ENXIO, EOPNOTSUPP).
_REFUSED = (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EISDIR, errno.EOPNOTSUPP, errno.EMLINK)


def file_kind(mode: int) -> str:
    """What a file of `mode` (from `lstat`) is, in words: ``a FIFO``, ``a symbolic link``, ``a folder`` ..."""
    for test, kind in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a file")):
        if test(mode):
            return kind
    return "a special file"


@contextmanager
def closing(fd: int) -> Iterator[int]:
    """`fd`, closed when the block ends."""
    try:
        yield fd
    finally:
        os.close(fd)


def open_root(path: str) -> int:
    """The journal folder's descriptor; a link to the whole folder is followed (the user named the path).

    Raises:
        OSError: as `os.open` (``FileNotFoundError`` when there is no such folder).
    """
    return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)


def open_folder(parent: int, name: str, *, where: str, create: bool = False) -> int:
    """The descriptor of the folder `name` in the folder `parent` (a descriptor), never through a link.

    Args:
        where: its path, for messages.
        create: make it (owner-only) when missing; the new entry is made durable (`parent` is synced).

    Raises:
        UnsafePathError: `name` is a link, a file or anything but a folder of this user.
        FileNotFoundError: it does not exist (and `create` is false).
    """
    if create:
        try:
            make_folder(parent, name, where=where)
            sync(parent, where=os.path.dirname(where))
        except FileExistsError:
            pass
    try:
        _step("open", where)
        fd = os.open(name, _FOLDER, dir_fd=parent)
    except OSError as exc:
        raise _refused(exc, parent, name, where, "a folder") from None
    _check(fd, where, "a folder", stat.S_ISDIR, in_place=False)
    return fd


def make_folder(parent: int, name: str, *, where: str) -> None:
    """Make the folder `name` (owner-only) in the folder `parent` (a descriptor; `where`, its path). Its entry is
    durable only once `parent` is synced: the caller syncs it, once for several folders it makes.

    Raises:
        FileExistsError: something is already at `name` (a folder or not: open it to know).
    """
    _step("os.mkdir", where)
    os.mkdir(name, 0o700, dir_fd=parent)


@contextmanager
def owned_folder(root: str, *names: str, create: bool = False) -> Iterator[int]:
    """The descriptor of the folder `names` inside the folder `root`, opened one folder at a time from the
    one above it: `root` by its path (`open_root`), each name by `open_folder`, so no link is followed
    below `root` (`create`: each made when missing, durably).

    Raises:
        UnsafePathError: one of `names` is a link, a file or anything but a folder of this user.
        FileNotFoundError: one of them is missing.
    """
    fds = [open_root(root)]
    try:
        where = root
        for name in names:
            where = os.path.join(where, name)
            fds.append(open_folder(fds[-1], name, where=where, create=create))
        yield fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


def open_file(folder: int, name: str, flags: int, *, where: str, mode: int = 0o600, in_place: bool = False) -> int:
    """The descriptor of the plain file `name` in the folder `folder` (a descriptor), opened with `flags`
    without following a link and without blocking on a FIFO, then checked with `fstat`.

    Args:
        where: its path, for messages.
        mode: the permissions of a file `flags` create.
        in_place: the file will be written where it is (a lock file): one with other hard links,
            which are other files' names too, is refused.

    Raises:
        UnsafePathError: `name` is a link, a FIFO, a folder or anything but a plain file of this user.
        OSError: as `os.open` otherwise (``FileNotFoundError`` when it does not exist).
    """
    try:
        _step("open", where)
        fd = os.open(name, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode, dir_fd=folder)
    except OSError as exc:
        raise _refused(exc, folder, name, where, "a plain file") from None
    _check(fd, where, "a plain file", stat.S_ISREG, in_place=in_place)
    return fd


def make_temp(folder: int, prefix: str, *, where: str, mode: int = 0o600) -> Tuple[int, str]:
    """A new file in the folder `folder` (a descriptor; `where`, its path) under a random name, created
    exclusively (as `mkstemp` does: nothing that was there is ever opened); its descriptor (write-only)
    and its name."""
    name = prefix + secrets.token_hex(16)
    _step("open", os.path.join(where, name))
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode, dir_fd=folder), name


def remove(folder: int, name: str, *, where: str) -> bool:
    """Remove `name` from the folder `folder` (a descriptor): a file, or a link itself (never what it
    points to); False when there was none.

    Raises:
        UnsafePathError: `name` is a folder.
    """
    try:
        _step("os.remove", where)
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise _refused(exc, folder, name, where, "a plain file") from None
    return True


def replace(folder: int, name: str, into: int, new_name: str, *, source: str, where: str) -> None:
    """Rename `name` of the folder `folder` (its path `source`) to `new_name` of the folder `into` (its
    path `where`), replacing a file or a link there (the link itself, never what it points to).

    Raises:
        UnsafePathError: `new_name` is a folder.
    """
    try:
        _step("os.rename", source)
        os.rename(name, new_name, src_dir_fd=folder, dst_dir_fd=into)
    except OSError as exc:
        mode = kind_at(into, new_name) if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST) else None
        if mode is not None and stat.S_ISDIR(mode):
            raise _unsafe(where, "a folder", "a plain file") from None
        raise


def sync(fd: int, *, where: str) -> None:
    """`fsync` of the owned file or folder `fd` (`where`, its path): a step of its own (see `_step`)."""
    _step("os.fsync", where)
    os.fsync(fd)


def names_in(folder: int, *, where: str) -> List[str]:
    """The names in the folder `folder` (a descriptor; `where`, its path), of whatever kind."""
    _step("os.listdir", where)
    return os.listdir(folder)


def entries(folder: int, *, where: str) -> List[Tuple[str, os.stat_result]]:
    """The names in the folder `folder` (a descriptor; `where`, its path) with their `lstat`, oldest change
    first (one removed meanwhile is left out)."""
    found = []
    for name in names_in(folder, where=where):
        try:
            found.append((name, os.stat(name, dir_fd=folder, follow_symlinks=False)))
        except FileNotFoundError:
            continue
    return sorted(found, key=lambda entry: entry[1].st_mtime_ns)


def kind_at(folder: int, name: str) -> Optional[int]:
    """The `lstat` mode of `name` in the folder `folder` (a descriptor), None when it does not exist."""
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def _step(event: str, where: str) -> None:
    """The audit event ``stepjournal.owned_path`` before the step `event` at `where` (tests/kill_points.py
    stops a process there, as at the interpreter's own events)."""
    sys.audit("stepjournal.owned_path", event, where)


def _unsafe(where: str, what: str, wanted: str) -> UnsafePathError:
    return UnsafePathError(
        f"{where!r} is {what}, where the journal keeps {wanted} of its own (of this user): it never follows a "
        "link there nor uses anything else. Move it away, then run the command again"
    )


def _refused(exc: OSError, folder: int, name: str, where: str, wanted: str) -> Union[OSError, UnsafePathError]:
    """The error an open at an owned path failed with: `UnsafePathError` when the path holds something the
    journal does not use, else `exc` itself."""
    if exc.errno not in _REFUSED:
        return exc
    mode = kind_at(folder, name)
    if mode is None:
        return exc
    target = ""
    if stat.S_ISLNK(mode):
        try:
            target = f" to {os.readlink(name, dir_fd=folder)!r}"
        except OSError:
            pass
    return _unsafe(where, file_kind(mode) + target, wanted)


def _check(fd: int, where: str, wanted: str, is_wanted, *, in_place: bool) -> None:
    """Close `fd` and raise `UnsafePathError` unless it is `wanted` (checked by `is_wanted`) of this user."""
    st = os.fstat(fd)
    me = os.geteuid() if hasattr(os, "geteuid") else None
    problem = None
    if not is_wanted(st.st_mode):
        problem = file_kind(st.st_mode)
    elif me is not None and st.st_uid != me:
        problem = f"owned by user id {st.st_uid}"
    elif in_place and st.st_nlink != 1:
        problem = f"a file with {st.st_nlink} hard links (writing it would change the other names too)"
    if problem is not None:
        os.close(fd)
        raise _unsafe(where, problem, wanted)
