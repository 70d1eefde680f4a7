"""The LMDB layer: one environment per path per process, transactions that grow the map, fork safety.

Nothing here knows about events or payload formats; it moves bytes in and out of named databases.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Literal, Optional, Set, TypeVar, Union, overload

import lmdb

try:
    import resource
except ImportError:  # pragma: no cover - not on Windows
    resource = None  # type: ignore[assignment]

from ..base._log import get_logger
from ..base._errors import IntegrityError, JournalError, JournalFullError, JournalLockedError, StepJournalError
from ._lmdb_check import check_env_structure, check_file_size, check_tree
from ._lmdb_open import check_format_for_writing, check_sizes, creation_lock, empty_data_file, open_db, open_env
from ..base._paths import check_lmdb_files, check_room_to_create, os_error, prepare_journal_folder

__all__ = ["Store", "DB_NAMES", "MAX_DBS", "open_in_this_process"]

log = get_logger(__name__)
T = TypeVar("T")  # what the function given to `Store.write` returns

# Named databases, fixed up front (py-lmdb: max_dbs must be known when the environment opens).
DB_NAMES = ("events", "payloads", "gen", "meta", "sessions", "steps", "runs", "rows")
MAX_DBS = 8
_DEFAULT_MAP_SIZE = 1 << 30
# Checked at open by a read-only journal checked as read (one node per session, run group or distinct
# payload); the event log and the step indexes (one entry per event or step) are checked when read.
_CHECKED_AT_OPEN = ("meta", "sessions", "runs", "payloads")

# One environment per real path per process (LMDB's rule); the pid tells a forked child that the
# environment it inherited is not its own.
_ENVS: Dict[str, tuple[int, "_SharedEnv"]] = {}
_ENVS_LOCK = threading.Lock()


def open_in_this_process(folder: str) -> bool:
    """Whether a `Store` of this process holds the journal at `folder` (a real path) open."""
    return _ENVS.get(folder, (None,))[0] == os.getpid()


# fork(): a child closes the environment it inherited before opening its own (py-lmdb refuses a
# second open of the same files in one process). Closing aborts every transaction open at that
# moment, and aborting a read transaction frees its slot in the lock file shared with the parent, so
# the parent's snapshot would stop being protected; a write transaction of another thread would make
# the close wait forever. So fork() first waits, bounded, for the transactions of other threads to end.
_FORK_WAIT_S = 10.0
_FORK_HELD: List[Union[threading.Lock, threading.RLock]] = []


def _before_fork() -> None:
    held: List[Union[threading.Lock, threading.RLock]] = []
    if _ENVS_LOCK.acquire(timeout=_FORK_WAIT_S):
        held.append(_ENVS_LOCK)
    pid = os.getpid()
    for owner, shared in list(_ENVS.values()):
        if owner != pid:
            continue
        if shared.lock.acquire(timeout=_FORK_WAIT_S):
            held.append(shared.lock)
        else:
            log.warning("fork_during_journal_transaction", hint="the child must not use journals opened here")
    _FORK_HELD[:] = held


def _after_fork_in_parent() -> None:
    while _FORK_HELD:
        _FORK_HELD.pop().release()


def _after_fork_in_child() -> None:
    global _ENVS_LOCK
    acquired = _ENVS_LOCK in _FORK_HELD
    _after_fork_in_parent()  # this thread holds them in the child too
    if not acquired:
        # Held by a thread that does not exist in the child: nobody would ever release it.
        _ENVS_LOCK = threading.Lock()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


class _SharedEnv:
    def __init__(self, env: lmdb.Environment, readonly: bool) -> None:
        self.env = env
        self.readonly = readonly
        self.users = 0
        # LMDB forbids resizing the map while this process has a transaction open; one lock per
        # environment serialises transactions and resizes between the threads of a process.
        self.lock = threading.RLock()
        self.dbs: Dict[str, Optional[lmdb._Database]] = {}  # None: absent from a journal opened read-only
        self.options: Dict[str, object] = {}  # what lmdb.open was given, to map it again
        # None: every tree of data.mdb was checked at open; else the named ones checked whole so far.
        self.checked: Optional[Set[str]] = None
        self.data_file = ""
        self.txns = threading.local()  # the read transactions open in each thread (see `Store.db`)


def _is_writable_location(path: str) -> bool:
    return os.access(path, os.W_OK)


def _acquire(path: str, *, readonly: bool, map_size: int, sync: bool, check: str = "open") -> _SharedEnv:
    key = os.path.realpath(path)
    pid = os.getpid()
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is not None and entry[0] != pid:
            # Inherited across fork(): never use the parent's environment. Closing our copy only
            # unmaps it and closes our descriptors (LMDB's locks belong to the parent's pid), and lets
            # py-lmdb open the path again in this process.
            del _ENVS[key]
            entry[1].env.close()
            entry = None
        if entry is not None:
            shared = entry[1]
            if shared.readonly and not readonly:
                raise JournalLockedError(f"journal {path!r} is already open read-only in this process; close that "
                                         "Journal before opening it for writing")
            if check == "open" and shared.checked is not None:  # opened checked as read: check the rest now
                check_env_structure(shared.env, shared.data_file, path)
                shared.checked = None
            shared.users += 1
            return shared
        prepare_journal_folder(path, key, readonly=readonly)
        try:
            return _open_env(path, key, readonly=readonly, map_size=map_size, sync=sync, pid=pid, check=check)
        except OSError as exc:  # lstat/stat of a folder this user cannot read ...
            raise os_error(path, exc, "open") from None


def _open_env(path: str, key: str, *, readonly: bool, map_size: int, sync: bool, pid: int,
              check: str = "open") -> _SharedEnv:
    """Open the LMDB environment of a checked journal folder and register it (under `_ENVS_LOCK`)."""
    check_lmdb_files(key)  # a file of someone else's is refused before anything waits on it
    data_file = os.path.join(key, "data.mdb")
    # data.mdb is empty only while another process's lmdb.open creates it (under the creation lock), or
    # when a creation was interrupted: wait for the one, refuse the other (`_lmdb_open.creation_lock`).
    with creation_lock(key, exclusive=not readonly) if _size(data_file) in (None, 0) else nullcontext():
        check_lmdb_files(key)  # again: what the creation made meanwhile
        if _size(data_file) == 0:
            raise empty_data_file(path)  # LMDB would silently start a new, empty journal over it
        # A journal copied to a read-only place cannot take LMDB's reader lock; nobody writes there.
        lock = not readonly or _is_writable_location(key)
        # Readahead stays on: py-lmdb touches every page of a value as it hands it out, so with it off a
        # payload not in the page cache is read 4 KiB at a time (an 8 MB value 0.24 s against 2 ms; a cold
        # `verify` 2.5x slower: docs/performance.md, "Cold page cache").
        options: Dict[str, object] = dict(max_dbs=MAX_DBS, subdir=True, readonly=readonly, lock=lock, sync=sync,
                                          metasync=sync, readahead=True, max_readers=256, mode=0o600)
        check_room_to_create(path, key, data_file, lock)
        try:
            env = open_env(path, key, map_size, options)
        except lmdb.Error as exc:
            raise os_error(path, exc, "open" if readonly or os.path.exists(data_file) else "create") from None
    try:
        check_file_size(env, data_file, path)
        if lock:
            # Processes killed inside a read transaction leave their reader slot taken; with 256
            # slots a long-lived journal would eventually refuse every reader (MDB_READERS_FULL).
            env.reader_check()
        lazy = check == "as-read" and readonly
        check_env_structure(env, data_file, path, trees=_CHECKED_AT_OPEN if lazy else None)
        if not readonly:
            check_format_for_writing(env, path)
    except StepJournalError:
        env.close()
        raise
    shared = _SharedEnv(env, readonly)
    shared.options = options
    shared.data_file = data_file
    shared.checked = set(_CHECKED_AT_OPEN) if lazy else None
    try:
        for name in DB_NAMES:
            shared.dbs[name] = open_db(env, name, create=not readonly, path=path)
    except lmdb.Error as exc:
        env.close()
        raise JournalError(f"cannot open journal {path!r}: {exc}") from None
    shared.users = 1
    _ENVS[key] = (pid, shared)
    return shared


def _size(file: str) -> Optional[int]:
    try:
        return os.stat(file).st_size
    except FileNotFoundError:
        return None


def _release(path: str, shared: _SharedEnv) -> None:
    key = os.path.realpath(path)
    with _ENVS_LOCK:
        shared.users -= 1
        entry = _ENVS.get(key)
        if shared.users <= 0:
            if entry is not None and entry[1] is shared:
                del _ENVS[key]
            if entry is not None and entry[0] == os.getpid():
                shared.env.close()


def folder_is_shared(path: str) -> bool:
    """True when the journal folder can be written by group or others."""
    mode = os.stat(path).st_mode
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


class Store:
    """Named LMDB databases under one folder, with transactions that survive map growth.

    Args:
        path: the journal folder (created owner-only when writable and missing).
        readonly: open without write access; never changes a byte on disk.
        map_size: the initial map size in bytes; it grows by itself.
        max_size: a cap on the map size in bytes; reaching it raises `JournalFullError`.
        sync: flush to disk at each commit (the default; a journal that loses its last record is not a journal).
        check: ``"open"``: check every tree of data.mdb at open; ``"as-read"`` (read-only): the small
            trees at open, each other one before it is first read (`db`, `db_reading`).
    """

    def __init__(self, path: str, *, readonly: bool = False, map_size: int = _DEFAULT_MAP_SIZE,
                 max_size: int | None = None, sync: bool = True, check: str = "open") -> None:
        self.path = os.fspath(path)
        check_sizes(map_size=map_size, max_size=max_size)
        self.readonly = readonly
        self._check = check
        self.max_size = max_size
        self._sync = sync
        self._map_size = map_size if max_size is None else min(map_size, max_size)
        self._pid = os.getpid()
        self._shared: _SharedEnv | None = _acquire(self.path, readonly=readonly, map_size=self._map_size, sync=sync,
                                                   check=check)
        if folder_is_shared(os.path.realpath(self.path)):
            log.warning("journal_folder_writable_by_others", path=self.path, hint="chmod 700 the folder")

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._shared is None

    def forked(self) -> bool:
        """True when this object was created in another process (we are a fork child)."""
        return os.getpid() != self._pid

    def reopen_after_fork(self) -> None:
        """Drop the inherited environment and open this process's own."""
        self._pid = os.getpid()
        self._shared = _acquire(self.path, readonly=self.readonly, map_size=self._map_size, sync=self._sync,
                                check=self._check)

    def close(self) -> None:
        if self._shared is None:
            return
        shared, self._shared = self._shared, None
        if os.getpid() == self._pid:
            _release(self.path, shared)

    def _env(self) -> _SharedEnv:
        if self._shared is None:
            raise JournalError(f"journal {self.path!r} is closed")
        return self._shared

    def used_bytes(self) -> int:
        """The bytes of LMDB's pages in use (what the size cap counts of the LMDB file)."""
        env = self._env().env
        return (env.info()["last_pgno"] + 1) * env.stat()["psize"]

    def db(self, name: str) -> Optional[lmdb._Database]:
        """The handle of a named database (None: absent from a journal opened read-only); checked as read, its
        whole tree is checked first (once)."""
        shared = self._env()
        handle = shared.dbs[name]
        if shared.checked is not None and name not in shared.checked and handle is not None:
            self._check_tree(shared, name, None)
            shared.checked.add(name)
        return handle

    def db_reading(self, txn: lmdb.Transaction[Any], name: str, lo: bytes,
                   hi: Optional[bytes]) -> Optional[lmdb._Database]:
        """`db`, for a read in `txn` of the keys lo..hi only (hi None: to the end): checked as read, only
        the pages that read can touch are checked first (`_lmdb_check.check_tree`)."""
        shared = self._env()
        handle = shared.dbs[name]
        if shared.checked is not None and name not in shared.checked and handle is not None:
            self._check_tree(shared, name, (lo, hi), txn)
        return handle

    def _check_tree(self, shared: _SharedEnv, name: str, keys, txn=None) -> None:
        # The tree as the reading transaction sees it (its record in the main tree, checked at open);
        # outside one, in a transaction of its own that keeps the pages from reuse meanwhile.
        txn = txn or getattr(shared.txns, "current", None)
        if txn is None:
            with shared.lock, shared.env.begin() as own:
                return self._check_tree(shared, name, keys, own)
        record = txn.get(name.encode())
        if record is not None:
            check_tree(shared.data_file, name, bytes(record), psize=shared.env.stat()["psize"],
                       last_pgno=shared.env.info()["last_pgno"], journal=self.path, keys=keys)

    # -- transactions ----------------------------------------------------------------------------
    @overload
    def read(self, *, buffers: Literal[False] = False) -> ContextManager[lmdb.Transaction[bytes]]: ...
    @overload
    def read(self, *, buffers: Literal[True]) -> ContextManager[lmdb.Transaction[memoryview]]: ...
    @contextmanager
    def read(self, *, buffers: bool = False) -> Iterator[lmdb.Transaction[Any]]:  # its values: as the overloads say
        """A read transaction; with `buffers=True` values are views that die with it."""
        shared = self._env()
        with shared.lock:
            for _attempt in range(3):
                try:
                    txn = shared.env.begin(buffers=True) if buffers else shared.env.begin()  # literals: lmdb's types
                    break
                except lmdb.MapResizedError:
                    # Another process grew the map; adopt its size and try again.
                    shared.env.set_mapsize(0)
                except lmdb.ReadersFullError:
                    # Slots of processes that died while reading; free them and try again.
                    if not shared.env.reader_check():
                        raise JournalError(f"journal {self.path!r} has more than 256 live readers; "
                                           "close some") from None
            else:  # pragma: no cover - a map resized three times in a row
                raise JournalError(f"journal {self.path!r} keeps being resized by another process")
            outer = getattr(shared.txns, "current", None)
            shared.txns.current = txn
            try:
                yield txn
            except (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.BadValsizeError) as exc:
                # LMDB's own pages are damaged (no checksum of ours covers them).
                raise IntegrityError(f"journal {self.path!r} is damaged: {exc}; run `stepjournal verify`") from None
            except lmdb.Error as exc:
                raise JournalError(f"journal {self.path!r}: read failed: {exc}") from None
            finally:
                shared.txns.current = outer
                txn.abort()

    def write(self, fn: Callable[[lmdb.Transaction[Any]], T], *, needed: int = 0, buffers: bool = False) -> T:
        """Run `fn(txn)` in a write transaction and commit; grow the map and retry when it is full.

        Args:
            fn: does the writes; it may run more than once, so it must not have other side effects.
            needed: bytes the transaction is about to write, so the map can grow ahead of time.
            buffers: values read in `fn` are views into the map (no copy), valid until its next write.

        Raises:
            JournalFullError: the size cap or the disk is full; the transaction left nothing behind.
        """
        if self.readonly:
            raise JournalError(f"journal {self.path!r} is open read-only")
        shared = self._env()
        with shared.lock:
            if needed:
                self._ensure_room(shared, needed)
            while True:
                try:
                    begun = shared.env.begin(write=True, buffers=True) if buffers else shared.env.begin(write=True)
                    with begun as txn:
                        return fn(txn)
                except lmdb.MapFullError:
                    self._grow(shared, max(needed, 1))
                except lmdb.MapResizedError:
                    shared.env.set_mapsize(0)
                except lmdb.Error as exc:
                    if _is_disk_full(exc) or _short_write_on_full_disk(exc, self.path, needed):
                        raise JournalFullError(
                            f"the disk holding journal {self.path!r} is full; nothing already recorded "
                            "was harmed. Free space, or continue without recording (see docs/reliability.md)"
                        ) from None
                    raise JournalError(f"journal {self.path!r}: write failed: {exc}") from None

    def _ensure_room(self, shared: _SharedEnv, needed: int) -> None:
        info = shared.env.info()
        used = (info["last_pgno"] + 1) * shared.env.stat()["psize"]
        if used + 2 * needed > info["map_size"]:
            self._grow(shared, needed)

    def _grow(self, shared: _SharedEnv, needed: int) -> None:
        current = shared.env.info()["map_size"]
        target = max(current * 2, current + 4 * needed)
        if self.max_size is not None:
            if current >= self.max_size:
                raise JournalFullError(
                    f"journal {self.path!r} reached its size cap of {self.max_size} bytes; nothing already "
                    "recorded was harmed. Raise max_size, or continue without recording (see docs/reliability.md)"
                )
            target = min(target, self.max_size)
        try:
            shared.env.set_mapsize(target)
        except lmdb.Error as exc:
            # LMDB unmaps the old map before mapping the larger one; when that mmap fails (the address
            # space or memory is short: RLIMIT_AS, overcommit limits) the environment is left with no
            # map at all, and the next transaction would crash. Map the journal again at its old size.
            self._remap(shared, current)
            raise JournalFullError(
                f"journal {self.path!r} could not grow its memory map from {current} to {target} bytes ({exc}): "
                "the process is short of address space or memory. Nothing already recorded was harmed and the "
                "journal stays usable; free memory or raise the limit (ulimit -v), or continue without recording"
            ) from None
        log.info("journal_map_grown", path=self.path, old_bytes=current, new_bytes=target)
        self._map_size = target

    def _remap(self, shared: _SharedEnv, map_size: int) -> None:
        """Open the environment again in place (its transactions all hold `shared.lock`, held here)."""
        shared.env.close()
        try:
            shared.env = open_env(self.path, os.path.realpath(self.path), map_size, shared.options)
            shared.dbs = {name: open_db(shared.env, name, create=False, path=self.path) for name in DB_NAMES}
        except lmdb.Error as exc:
            raise JournalError(
                f"journal {self.path!r} lost its memory map and cannot map it again ({exc}); nothing recorded was "
                "harmed. Free memory, then open a new Journal on it"
            ) from None
        log.warning("journal_map_restored", path=self.path, map_bytes=map_size)


def _short_write_on_full_disk(exc: Exception, path: str, needed: int) -> bool:
    """LMDB reports a write the disk cut short as EIO; tell that apart from a failing disk."""
    if "Input/output error" not in str(exc) and getattr(exc, "errno", None) != errno.EIO:
        return False
    margin = max(2 * needed, 16 << 20)
    try:
        st = os.statvfs(path)
        if st.f_bavail * st.f_frsize < margin:
            return True
        if resource is None:  # pragma: no cover
            return False
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        size = os.path.getsize(os.path.join(path, "data.mdb"))
    except OSError:
        return False
    return limit != resource.RLIM_INFINITY and size + margin > limit


def _is_disk_full(exc: Exception) -> bool:
    text = str(exc)
    # A full quota (EDQUOT) or a file-size limit (EFBIG) is as full as a full disk for the journal.
    return (any(words in text for words in ("No space left", "ENOSPC", "quota exceeded", "File too large"))
            or getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG))
