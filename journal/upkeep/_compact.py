"""Compaction: give a journal's freed pages back to the disk (LMDB reuses freed pages, never shrinks its file).

`compact(path)` writes a compacted copy of ``data.mdb`` with LMDB's own copy (py-lmdb
``env.copy(path, compact=True)``) into a folder inside the journal, checks it, and swaps it in
with one `os.replace` (atomic on one filesystem). `compact(path, to=DIR)` writes the compacted
journal into a new folder instead and changes nothing of the original.

Refused while any process has the journal open: every process with an LMDB environment open holds
a shared `fcntl` lock on byte 0 of ``lock.mdb`` for as long as it is open (LMDB's own rule, in
every version and language), so an exclusive lock on that byte is granted only when no process has
the journal open. It is held for the whole compaction: a process opening the journal meanwhile
waits in LMDB's open. The swap changes the newest transaction id LMDB keeps in ``lock.mdb``, so
before letting go the lock file is emptied: a process that waited then fails to open (it may
retry), and the next one to open sets the lock file up again, as after a reboot.

On any failure before the swap the original is untouched and the partial copy removed; a crash
(SIGKILL) leaves at most a ``.compact-*`` folder, which the next compaction removes.

The journal's payload files (``payloads/``) are tidied under the same lock: what a write a crash cut
short left in ``payloads/tmp/``, and a whole file no event names (its event never committed), are
removed; nothing is removed when an event cannot be read (it might name one). `compact(path, to=DIR)`
copies the payload files the events name beside the compacted copy, and refuses when an event cannot
be read (the copy would lack the files it names).
"""

from __future__ import annotations

import os
import shutil
from typing import Optional, Tuple, Union

import attrs
import lmdb

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

from ..events._convert import decode_event
from ..base._errors import CompactError, JournalBusyError, JournalFullError, StepJournalError
from ..events._events import call_refs
from ..events._keys import seq_of
from ..payloads._file_store import PAYLOAD_FOLDER, FilePayloadStore
from ._verify import live_digests
from ..base._log import get_logger
from ..base._owned import closing, open_file, open_root
from ..base._paths import check_lmdb_files
from ..base._undo import remove_entry
from ..storage._format import check_format_of
from ..storage._lmdb_check import check_env_structure, check_file_size
from ..storage._lmdb_open import empty_data_file
from ..storage._store import MAX_DBS, open_in_this_process

__all__ = ["compact", "CompactResult", "CompactError", "JournalBusyError"]

log = get_logger(__name__)

_TMP_PREFIX = ".compact-"
_MARGIN = 16 << 20  # free space kept beyond the copy's size


@attrs.frozen
class CompactResult:
    """What a compaction did.

    Attributes:
        path: the journal compacted (or the folder written, with ``to``).
        before_bytes: size of ``data.mdb`` before.
        after_bytes: size of the compacted ``data.mdb``.
        files_removed: payload files removed: half-written ones, and whole ones no event names.
    """

    path: str
    before_bytes: int
    after_bytes: int
    files_removed: int = 0


def _lock_exclusive(lock_file: str, path: str) -> int:
    """Take the exclusive lock on byte 0 of ``lock.mdb``; refuse when any process has the journal open.
    It is emptied after the swap: opened as an owned path (`base/_owned.py`), never through a link."""
    try:
        with closing(open_root(os.path.dirname(lock_file))) as root:
            fd = open_file(root, "lock.mdb", os.O_RDWR, where=lock_file, in_place=True)
    except FileNotFoundError:
        raise CompactError(f"journal {path!r} has no lock.mdb; open it once for writing, then compact") from None
    except OSError as exc:
        raise CompactError(f"cannot open {lock_file!r} to lock the journal: {exc.strerror}") from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        os.close(fd)
        raise JournalBusyError(
            f"journal {path!r} is open in another process (a trainer, a reader, a CLI command); "
            "close it and compact again"
        ) from None
    return fd


def _entries(env: lmdb.Environment) -> dict:
    counts = {}
    with env.begin() as txn:
        for key, _ in txn.cursor():
            db = env.open_db(bytes(key), txn=txn, create=False)
            counts[bytes(key)] = txn.stat(db)["entries"]
    return counts


def _copy(src: str, dest_dir: str, path: str) -> int:
    """Write the compacted copy of `src`'s environment into `dest_dir`; check it; return its size."""
    env = lmdb.open(os.fsencode(src), readonly=True, lock=False, max_dbs=MAX_DBS, subdir=True)
    try:
        used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        free = shutil.disk_usage(dest_dir).free
        if free < used + _MARGIN:
            raise JournalFullError(
                f"compacting {path!r} needs up to {used + _MARGIN} free bytes in {dest_dir!r}, which has {free}; "
                "free space there (or compact to another folder with `to=`); nothing was changed"
            )
        expected = _entries(env)
        try:
            # py-lmdb takes a bytes path (a folder name that is not UTF-8); its stub says str only.
            env.copy(os.fsencode(dest_dir), compact=True)  # type: ignore[arg-type]
        except lmdb.Error as exc:
            raise CompactError(f"compacting {path!r} failed ({exc}); nothing was changed") from None
    finally:
        env.close()
    data = os.path.join(dest_dir, "data.mdb")
    fd = os.open(data, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    copy = lmdb.open(os.fsencode(dest_dir), readonly=True, lock=False, max_dbs=MAX_DBS, subdir=True)
    try:
        found = _entries(copy)
    finally:
        copy.close()
    if found != expected:
        raise CompactError(f"the compacted copy of {path!r} does not hold what the journal holds; nothing was changed")
    return os.path.getsize(data)


def _named_digests(folder: str) -> Tuple[set, Optional[int]]:
    """(the digests (hex) the journal's events name, the seq of the first event that cannot be read or None)."""
    env = lmdb.open(os.fsencode(folder), readonly=True, lock=False, max_dbs=MAX_DBS, subdir=True)
    named: set = set()
    try:
        with env.begin() as txn:
            db = env.open_db(b"events", txn=txn, create=False)
            for key, body in txn.cursor(db=db):
                try:
                    event = decode_event(bytes(body))
                except StepJournalError:
                    return named, seq_of(key)
                named.update(ref.digest for ref in call_refs(event))
    finally:
        env.close()
    return named, None


def _tidy_payload_files(folder: str) -> int:
    """Remove the payload files a crash left behind (see the module's doc); return how many."""
    files = FilePayloadStore(os.path.join(folder, PAYLOAD_FOLDER))
    removed = files.remove_partial_files()
    named, unreadable = _named_digests(folder) if os.path.isdir(files.folder) else (set(), None)
    if unreadable is not None:
        log.warning("payload_files_not_tidied", path=folder, reason="an event cannot be read; run `stepjournal verify`")
        return removed
    for digest in list(files.digests()):
        if digest.hex() not in named:
            removed += files.delete(digest)
    return removed


def _copy_payload_files(folder: str, to: str, path: str) -> None:
    """Copy the payload files the events name into the journal at `to`, each made durable; refuse when an
    event cannot be read (the copy would lack the files it names)."""
    source = FilePayloadStore(os.path.join(folder, PAYLOAD_FOLDER), readonly=True)
    named, unreadable = _named_digests(folder)
    if unreadable is not None:
        raise CompactError(
            f"event #{unreadable} of {path!r} cannot be read, so the payload files it names are unknown; "
            "nothing was written: run `stepjournal verify` on it, or copy the folder as it is")
    target = FilePayloadStore(os.path.join(to, PAYLOAD_FOLDER))
    copied = set()
    for digest in source.digests():
        if digest.hex() in named:
            target.put(digest, source.stored(digest))
            copied.add(digest.hex())
    missing = sorted(_live_digests(folder) - copied - _lmdb_payloads(to))
    if missing:
        raise CompactError(
            f"{len(missing)} payload(s) that records of {path!r} use are missing from it ({missing[0][:16]}…), so "
            "the copy would lack them; nothing was written: run `stepjournal verify` on it, "
            "or copy the folder as it is")


def _live_digests(folder: str) -> set:
    """The digests (hex) of the payloads the journal's unreleased records use (`live_digests`)."""
    env = lmdb.open(os.fsencode(folder), readonly=True, lock=False, max_dbs=MAX_DBS, subdir=True)
    try:
        with env.begin() as txn:
            db = env.open_db(b"events", txn=txn, create=False)
            return live_digests((seq_of(key), bytes(body)) for key, body in txn.cursor(db=db))
    finally:
        env.close()


def _lmdb_payloads(folder: str) -> set:
    """The digests (hex) the journal at `folder` holds in its LMDB payload table."""
    env = lmdb.open(os.fsencode(folder), readonly=True, lock=False, max_dbs=MAX_DBS, subdir=True)
    try:
        with env.begin() as txn:
            db = env.open_db(b"payloads", txn=txn, create=False)
            return {bytes(key).hex() for key in txn.cursor(db=db).iternext(keys=True, values=False)}
    finally:
        env.close()


def _check_format(folder: str, path: str) -> None:
    """Refuse a damaged journal, and one of a newer format (its events may name payload files this library
    cannot see). The first open of the journal: what a creator killed inside `lmdb.open` left is refused
    here, and a truncated or crafted data.mdb before any of its pages is mapped (SIGBUS otherwise)."""
    data_file = os.path.join(folder, "data.mdb")
    if os.path.getsize(data_file) == 0:
        raise empty_data_file(path)  # lock.mdb is held: no creation is under way
    try:
        env = lmdb.open(os.fsencode(folder), readonly=True, lock=False, max_dbs=MAX_DBS, subdir=True)
    except lmdb.Error as exc:
        raise CompactError(f"cannot read journal {path!r} ({exc}); nothing was changed: run "
                           f"`stepjournal verify` on it") from None
    try:
        check_file_size(env, data_file, path)
        check_env_structure(env, data_file, path)
        check_format_of(env, path, writing=True)
    finally:
        env.close()


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def compact(path: Union[str, "os.PathLike[str]"], *,
            to: Optional[Union[str, "os.PathLike[str]"]] = None) -> CompactResult:
    """Compact a closed journal in place (or, with `to`, into a new folder).

    Args:
        path: the journal folder; no process may have it open.
        to: a new (or empty) folder to write the compacted journal into, on any filesystem; the
            original is then left as it is.

    Raises:
        JournalBusyError: a process (this one included) has the journal open.
        JournalFullError: the target has not enough free space; nothing was changed.
        CompactError: the copy failed or did not check out; nothing was changed.
        IntegrityError: ``data.mdb`` is empty (its creation was interrupted); nothing was changed.
    """
    path = os.fspath(path)
    folder = os.path.realpath(path)
    data_file = os.path.join(folder, "data.mdb")
    if not os.path.isfile(data_file):
        raise CompactError(f"no journal at {path!r}: the folder or its data.mdb is missing")
    if fcntl is None:  # pragma: no cover
        raise CompactError("compaction needs fcntl locks (not available on this platform)")
    if open_in_this_process(folder):
        raise JournalBusyError(f"journal {path!r} is open in this process; close every Journal on it, then compact")
    check_lmdb_files(folder)
    lock_file = os.path.join(folder, "lock.mdb")
    fd = _lock_exclusive(lock_file, path)
    try:
        _check_format(folder, path)
        before = os.path.getsize(data_file)
        for name in os.listdir(folder):  # what a compaction killed midway left
            if name.startswith(_TMP_PREFIX):
                remove_entry(os.path.join(folder, name))  # a link itself, not where it points
        if to is not None:
            return _compact_to(folder, os.fspath(to), path, before)
        tmp = os.path.join(folder, f"{_TMP_PREFIX}{os.getpid()}")
        os.mkdir(tmp, 0o700)
        try:
            after = _copy(folder, tmp, path)
            os.chmod(os.path.join(tmp, "data.mdb"), 0o600)
            os.replace(os.path.join(tmp, "data.mdb"), data_file)
            _fsync_dir(folder)
            # The new data file starts its transaction ids again; a process that waited for the lock
            # must not trust the old lock file's, and the next opener sets an empty one up afresh.
            os.ftruncate(fd, 0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        removed = _tidy_payload_files(folder)
    finally:
        os.close(fd)
    log.info("journal_compacted", path=path, before_bytes=before, after_bytes=after, files_removed=removed)
    return CompactResult(path=path, before_bytes=before, after_bytes=after, files_removed=removed)


def _compact_to(folder: str, to: str, path: str, before: int) -> CompactResult:
    created = not os.path.lexists(to)  # a link to nowhere is a name taken, not a new folder
    if not created and (not os.path.isdir(to) or os.listdir(to)):
        raise CompactError(f"compact target {to!r} exists and is not an empty folder; name a new one")
    if created:
        os.makedirs(to, 0o700)
    try:
        after = _copy(folder, to, path)
        _copy_payload_files(folder, to, path)
    except BaseException:
        if created:
            shutil.rmtree(to, ignore_errors=True)
        else:
            for name in os.listdir(to):
                target = os.path.join(to, name)
                shutil.rmtree(target) if os.path.isdir(target) else os.unlink(target)
        raise
    log.info("journal_compacted", path=path, to=to, before_bytes=before, after_bytes=after)
    return CompactResult(path=to, before_bytes=before, after_bytes=after)
