"""`FilePayloadStore`: payloads as content-addressed files in a folder, written from their own buffers.

Each payload is one file, ``FOLDER/<first two hex digits>/<the other 62>``, holding the stored bytes
(an encoding, or a zstd frame of it) exactly as `LmdbPayloadStore` holds them in its table.

The write order keeps the journal's rule that an event never names a payload that is not durable:
the bytes go to a new file under ``FOLDER/tmp/`` (``writev`` of the buffers given, no joined copy),
``fsync``, ``rename`` to the digest's name, ``fsync`` of the folder, and only then does the journal
commit the event (`commit`). The 256 two-digit folders are made, durably, with the first file
(`_make_folders`), so a record flushes its file and its folder only (docs/reliability.md, "A payload
file's flushes"). A crash in between leaves at most a file no event names: an orphan in ``tmp/``
(`partial_files`) or a whole payload nothing references, both of which `verify` reports.

Every path of the folder (the folder itself, ``tmp/``, the two-digit folders, the files) is opened,
made, listed, renamed and removed through `base/_owned.py`, one folder descriptor at a time from the
folder above the payload folder: a link, a FIFO or someone else's file at one of those names is an
`UnsafePathError`, never followed, never waited on.

A file is never changed after its rename: a payload is replaced by renaming a new file over it, and
removed by unlinking it, neither of which touches a reader's open file. A replay maps the file
(``mmap``, private and copy-on-write) and hands the mapping to the load, whose tensors are views of
it; its size is checked against the event's first (a file cut short is refused, never mapped), the
digest over the mapping before anything is returned. Nothing may truncate or rewrite a file in
``payloads/`` in place while a process replays from it (a mapped page past a new end raises SIGBUS
when touched); `verify` reports any such damage afterwards. A zstd frame is decompressed from the
mapping into a buffer of its own. A full disk is `JournalFullError` from the write, and the partial
file is removed.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import stat
import threading
import weakref
from contextlib import contextmanager
from typing import Any, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

from ..base._digest import DIGEST_SIZE, digest_bytes
from ..base._errors import IntegrityError, JournalError, JournalFullError, PayloadMissingError, UnsafePathError
from ..base._owned import (closing, entries, kind_at, make_folder, make_temp, names_in, open_file, open_folder,
                           owned_folder, remove, replace, sync)
from ..base._pages import HANDED_OVER
from ._payload_store import LmdbPayloadStore, Release, WriteEvents, check_digest
from ._store_protocol import PayloadStoreBase
from ._payloads import ZSTD_MAGIC, own_nbytes, stored_bound, stored_digest_read, unwrap

__all__ = ["FilePayloadStore", "StagedFile", "TMP_FOLDER", "PAYLOAD_FOLDER", "local_payload_store"]

T = TypeVar("T")
# A journal's payload files: this folder of the journal's own.
PAYLOAD_FOLDER = "payloads"
# Where files are written before their rename; what is left there is a write a crash cut short.
TMP_FOLDER = "tmp"
# `writev` takes at most IOV_MAX buffers a call; Linux's is 1024.
_IOV_MAX = 1024
_READ_CHUNK = 1 << 22
_FULL = (errno.ENOSPC, errno.EDQUOT)
_FAN = re.compile(r"[0-9a-f]{2}")
_FAN_NAMES = [f"{n:02x}" for n in range(256)]


def local_payload_store(store: Any) -> LmdbPayloadStore:
    """A journal's own payload store: its LMDB table, with large payloads in its ``payloads/`` folder."""
    files = FilePayloadStore(os.path.join(store.path, PAYLOAD_FOLDER), readonly=store.readonly)
    return LmdbPayloadStore(store, files=files)


class FilePayloadStore(PayloadStoreBase):
    """Payloads as files under `folder`, one per digest (see the module's doc for the write order).

    Args:
        folder: the folder that holds the files (made on the first write).
        readonly: refuse every write (a reader's store).
    """

    def __init__(self, folder: str, *, readonly: bool = False) -> None:
        self.folder = os.fspath(folder)
        self.readonly = readonly
        # digest -> the files written ahead of its `put` (`stage`): one per caller that prepared it, as two callers
        # may record the same payload and either may go before its commit (its file then goes with it).
        self._staged: Dict[bytes, List["StagedFile"]] = {}  # guarded by `_STAGING`
        self._folders_made = False  # `_make_folders` ran in this object

    # Declared capabilities (`PayloadStore`): a blob's pieces are written as they are; `stage` writes a file
    # while its bytes are hashed.
    takes_pieces = True
    stages_writes = True

    def __repr__(self) -> str:
        return f"FilePayloadStore({self.folder!r})"

    def path_of(self, digest: bytes) -> str:
        """The file that holds the payload named `digest` (whether or not it exists)."""
        check_digest(digest)
        name = digest.hex()
        return os.path.join(self.folder, name[:2], name[2:])

    # -- writing ---------------------------------------------------------------------------------
    def put(self, digest: bytes, blob: Any) -> None:
        """Store `blob` (a bytes-like value, or a sequence of them written one after another) under
        `digest`, durably; a stored copy that still matches `digest` is kept as it is."""
        self._refuse_if_readonly()
        path = self.path_of(digest)
        staged = self._take_staged(digest)
        if staged is not None:
            staged.finish(path)
            return
        buffers = _buffers(blob)
        # The check is bounded by the size of the value being stored, never by the file's.
        nbytes = own_nbytes(buffers[0]) if len(buffers) == 1 else sum(b.nbytes for b in buffers)
        if self._intact(digest, nbytes):
            return
        self._write(path, buffers)

    def commit(self, items: Sequence[Tuple[bytes, Any]], write_events: WriteEvents[T]) -> T:
        for digest, blob in items:
            self.put(digest, blob)
        return write_events(None)

    def delete(self, digest: bytes) -> bool:
        self._refuse_if_readonly()
        name = digest.hex()
        try:
            with _folder(self.folder, name[:2]) as fan:
                if not remove(fan, name[2:], where=self.path_of(digest)):
                    return False
                sync(fan, where=os.path.dirname(self.path_of(digest)))
        except FileNotFoundError:
            return False
        return True

    def stage(self, blob: Any) -> "StagedFile":
        """Start writing `blob` (bytes-like, or a sequence of them) to a new file under ``tmp/`` on a
        thread of its own, so that the caller can hash the same bytes meanwhile; `StagedFile.named`
        then lets the `put` of that digest finish it (``fsync``, ``rename``, folder ``fsync``) instead
        of writing the bytes again."""
        self._refuse_if_readonly()
        return StagedFile(self, _buffers(blob))

    def discard_staged(self, digest: bytes) -> None:
        """Remove a file staged for `digest`, if any (its record was refused before it was stored)."""
        staged = self._take_staged(digest)
        if staged is not None:
            staged.remove()

    def _take_staged(self, digest: bytes) -> Optional["StagedFile"]:
        """A file this process staged for `digest`, now the caller's alone (its owner's `discard` leaves it)."""
        with _STAGING:
            files = self._staged.pop(digest, [])
            mine = [f for f in files if f.pid == os.getpid()]  # a forked child writes its own
            if len(mine) > 1:
                self._staged[digest] = mine[1:]
            return mine[0] if mine else None

    def partial_files(self) -> List[str]:
        """The files a write left in ``tmp/`` without renaming them (a crash cut it short), oldest first."""
        tmp = os.path.join(self.folder, TMP_FOLDER)
        try:
            with _folder(self.folder, TMP_FOLDER) as fd:
                return [os.path.join(tmp, name) for name, _ in entries(fd, where=tmp)]
        except FileNotFoundError:
            return []

    def remove_partial_files(self) -> int:
        """Delete what `partial_files` lists; return how many. Only for a journal no process is writing:
        a write in flight has its file there too."""
        self._refuse_if_readonly()
        tmp = os.path.join(self.folder, TMP_FOLDER)
        try:
            with _folder(self.folder, TMP_FOLDER) as fd:
                removed = sum(remove(fd, name, where=os.path.join(tmp, name)) for name, _ in entries(fd, where=tmp))
                if removed:
                    sync(fd, where=tmp)
        except FileNotFoundError:
            return 0
        return removed

    def _refuse_if_readonly(self) -> None:
        if self.readonly:
            raise JournalError(f"the payload folder {self.folder} was opened read-only; open it writable to write")

    def _intact(self, digest: bytes, nbytes: int) -> bool:
        """Whether the file of `digest` is there, a plain file holding the payload (else it is replaced), made
        durable: another writer may have renamed it there without syncing its folder yet."""
        try:
            f = self._opened(digest)
            if f is None:
                return False
            with f:
                if _file_digest(f, digest, nbytes) != digest:
                    return False
                os.fsync(f.fileno())
            name = digest.hex()
            with _folder(self.folder, name[:2]) as fan:
                sync(fan, where=os.path.dirname(self.path_of(digest)))
            return True
        except (IntegrityError, UnsafePathError, OSError):
            return False

    def _make_folders(self) -> None:
        """Make the payload folder, ``tmp/`` and the 256 two-digit folders that are missing, then fsync the
        journal folder and the payload folder, once a store.

        Why both, whoever made the folders: a new directory entry is durable only once its directory is synced,
        and an entry another process made is in the page cache, not yet durable, if that process was killed
        (or is still running) before its fsync; a file renamed into it, and the event naming that file, would
        be lost by a power cut after the acknowledgement. Made together, the folders cost these two flushes a
        store, not a flush of ``payloads/`` on most records of a young journal. A folder removed by hand later
        is made again, durably, by the rename's `owned_folder(create=True)`.
        """
        if self._folders_made:
            return
        parent, top_name = os.path.split(self.folder)
        with owned_folder(parent or os.curdir) as journal:
            try:
                make_folder(journal, top_name, where=self.folder)
            except FileExistsError:
                pass  # there already, made by this journal or another process: opened as a folder next
            with closing(open_folder(journal, top_name, where=self.folder)) as top:
                # Whatever is at a present name is opened later through `owned_folder`, which refuses a link.
                present = set(names_in(top, where=self.folder))
                for name in [TMP_FOLDER, *_FAN_NAMES]:
                    if name not in present:
                        try:
                            make_folder(top, name, where=os.path.join(self.folder, name))
                        except FileExistsError:
                            pass  # made meanwhile by another process, which may not have synced it yet
                sync(top, where=self.folder)
            sync(journal, where=parent or os.curdir)
        self._folders_made = True

    def _new_tmp(self) -> Tuple[int, str]:
        """A new file under ``tmp/`` (the folders made if missing), created under a name of its own: its
        descriptor (write-only, for `_write_tmp`) and its path."""
        try:
            self._make_folders()
            with _folder(self.folder, TMP_FOLDER, create=True) as tmp:
                fd, name = make_temp(tmp, "", where=os.path.join(self.folder, TMP_FOLDER), mode=0o644)
        except OSError as exc:
            if exc.errno in _FULL:
                raise JournalFullError(
                    f"the disk holding {self.folder} is full: no payload file could be made") from None
            raise
        return fd, os.path.join(self.folder, TMP_FOLDER, name)

    def _write_tmp(self, fd: int, tmp: str, buffers: List[memoryview]) -> None:
        """`buffers` written to the new file `tmp` through `fd`, the descriptor `_new_tmp` created it with (its
        name, opened again, may be another file's by now), fsynced and closed; on an error the file is removed."""
        try:
            try:
                _write_all(fd, buffers)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            _remove_quietly(tmp)
            raise self._full(exc, sum(b.nbytes for b in buffers)) from None

    def _rename_into_place(self, tmp: str, path: str, nbytes: int) -> None:
        """`tmp` (`nbytes` written and fsynced) renamed to `path`, then its folder fsynced."""
        fan = os.path.basename(os.path.dirname(path))
        try:
            with _folder(self.folder, TMP_FOLDER) as folder, _folder(self.folder, fan, create=True) as into:
                replace(folder, os.path.basename(tmp), into, os.path.basename(path), source=tmp, where=path)
                sync(into, where=os.path.dirname(path))
        except UnsafePathError:  # a link, a FIFO or a file at the two-digit folder's name: the record is refused
            _remove_quietly(tmp)
            raise
        except OSError as exc:
            _remove_quietly(tmp)
            raise self._full(exc, nbytes) from None

    def _full(self, exc: OSError, nbytes: int) -> Exception:
        """`JournalFullError` for a full disk, else `exc` itself."""
        if exc.errno in _FULL:
            return JournalFullError(
                f"the disk holding {self.folder} is full: a payload of {nbytes} bytes "
                "was not written and nothing names it; nothing already recorded was harmed. Free space, or "
                "continue without recording (see docs/reliability.md)"
            )
        return exc

    def _write(self, path: str, buffers: List[memoryview]) -> None:
        fd, tmp = self._new_tmp()
        self._write_tmp(fd, tmp, buffers)
        self._rename_into_place(tmp, path, sum(b.nbytes for b in buffers))

    # -- reading ---------------------------------------------------------------------------------
    def _missing(self, digest: bytes) -> PayloadMissingError:
        return PayloadMissingError(f"payload {digest.hex()[:16]}… is missing from {self.folder}")

    def _damaged(self, digest: bytes) -> IntegrityError:
        return IntegrityError(
            f"payload {digest.hex()[:16]}… in {self.folder} does not match its digest: the file is damaged",
            detail="digest mismatch",
        )

    def _open(self, digest: bytes, nbytes: Optional[int]) -> Tuple[Any, int]:
        """(the open file, its size), refused when missing or larger than a payload of `nbytes` may be."""
        f = self._opened(digest)
        if f is None:
            raise self._missing(digest)
        size = os.fstat(f.fileno()).st_size
        if size > stored_bound(nbytes):
            f.close()
            raise IntegrityError(
                f"payload {digest.hex()[:16]}… in {self.folder} is {size} bytes, more than a payload of "
                f"{nbytes} bytes may be; not read", detail="oversized file",
            )
        return f, size

    def _map(self, digest: bytes, nbytes: Optional[int]) -> Any:
        """The file mapped private and copy-on-write, its size checked against the event's first."""
        f, size = self._open(digest, nbytes)
        with f:
            head = os.pread(f.fileno(), len(ZSTD_MAGIC), 0)
            if size == 0 or (head != ZSTD_MAGIC and nbytes is not None and size != nbytes):
                raise IntegrityError(
                    f"payload {digest.hex()[:16]}… in {self.folder} is {size} bytes, its event says {nbytes}: the "
                    "file was cut short or grown; not served (run `stepjournal verify`)", detail="size mismatch",
                )
            return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)

    @contextmanager
    def view(self, digest: bytes, *, nbytes: Optional[int] = None) -> Iterator[Tuple[Any, Optional[Release]]]:
        blob = self._map(digest, nbytes)
        try:
            raw = unwrap(blob, digest.hex(), None, nbytes)
        except IntegrityError as exc:
            raise IntegrityError(f"{exc} ({self.folder})", detail=exc.detail) from None
        # The buffer was made for this read alone: the load keeps it, its tensors views of it.
        yield raw, (HANDED_OVER if raw is blob else None)

    def get(self, digest: bytes, *, nbytes: Optional[int] = None) -> bytes:
        with self.view(digest, nbytes=nbytes) as (raw, _):
            if digest_bytes(raw) != digest:
                raise self._damaged(digest)
            return bytes(raw)

    def check(self, digest: bytes, *, nbytes: Optional[int] = None, one_thread: bool = False) -> None:
        """`PayloadStore.check`; `one_thread`: hashed on this thread only (a caller checks one per core)."""
        f, _ = self._open(digest, nbytes)
        with f:
            if _file_digest(f, digest, nbytes, one_thread) != digest:
                raise self._damaged(digest)

    def _opened(self, digest: bytes) -> Optional[Any]:
        """The file of `digest` opened for reading (a plain file of this user, see `base/_owned.py`); None
        when there is none."""
        name = digest.hex()
        try:
            with _folder(self.folder, name[:2]) as fan:
                return os.fdopen(open_file(fan, name[2:], os.O_RDONLY, where=self.path_of(digest)), "rb")
        except FileNotFoundError:
            return None

    def total_bytes(self, *, besides: Optional[bytes] = None) -> int:
        """The bytes of every payload file, and of what ``tmp/`` holds (a walk of the folder), but the file
        this process staged for the digest `besides` (the payload whose room is being asked for)."""
        staged = self._staged.get(besides, []) if besides is not None else []
        own = next((f._tmp for f in staged if f.pid == os.getpid()), None)
        total = 0
        for fan in [TMP_FOLDER, *self._fans()]:
            try:
                with _folder(self.folder, fan) as fd:
                    total += sum(st.st_size for name, st in entries(fd, where=os.path.join(self.folder, fan))
                                 if stat.S_ISREG(st.st_mode) and os.path.join(self.folder, fan, name) != own)
            except FileNotFoundError:
                continue
        return total

    def stored(self, digest: bytes) -> Optional[Any]:
        """The file's bytes as they are stored, unchecked, as a read-only mapping of the file (a push of a
        GB payload holds page cache, not a copy of it); None when there is no such file."""
        f = self._opened(digest)
        if f is None:
            return None
        with f:
            if os.fstat(f.fileno()).st_size == 0:
                return b""
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def has(self, digest: bytes) -> bool:
        check_digest(digest)
        name = digest.hex()
        try:
            with _folder(self.folder, name[:2]) as fan:
                return kind_at(fan, name[2:]) is not None
        except FileNotFoundError:
            return False

    def __contains__(self, digest: object) -> bool:
        return isinstance(digest, bytes) and len(digest) == DIGEST_SIZE and self.has(digest)

    def _fans(self) -> List[str]:
        """The two-digit folders' names, sorted."""
        try:
            with _folder(self.folder) as fd:
                return sorted(name for name in names_in(fd, where=self.folder) if _FAN.fullmatch(name))
        except FileNotFoundError:
            return []

    def digests(self) -> Iterator[bytes]:
        for fan in self._fans():
            try:
                with _folder(self.folder, fan) as fd:
                    names = sorted(names_in(fd, where=os.path.join(self.folder, fan)))
            except FileNotFoundError:
                continue  # removed meanwhile
            for name in names:
                try:
                    digest = bytes.fromhex(fan + name)
                except ValueError:
                    continue  # not one of ours
                if len(digest) == DIGEST_SIZE and digest.hex() == fan + name:
                    yield digest


# Guards each store's staged files and which of `put` or `discard` has each file. Re-entrant: a collection inside
# it may run a prepared payload's finalizer (`StagedFile.discard`) in the same thread. Renewed in a fork child (a
# thread of the parent may have held it).
_STAGING = threading.RLock()


def _new_staging_lock() -> None:
    global _STAGING
    _STAGING = threading.RLock()


os.register_at_fork(after_in_child=_new_staging_lock)


class StagedFile:
    """A payload file written on a thread of its own while its writer hashes the same bytes
    (`FilePayloadStore.stage`), then put in place by the `put` of its digest.

    `named` registers it under its digest and ties it to the object that will be recorded (a
    `PreparedPayload`): if that object goes away unrecorded, the file is removed. A crash leaves it in
    ``tmp/``, where `verify` reports it and `compact` removes it, as any write a crash cut short.
    """

    def __init__(self, store: FilePayloadStore, buffers: List[memoryview]) -> None:
        self._store = store
        self.pid = os.getpid()  # the process whose thread writes it
        fd, self._tmp = store._new_tmp()
        self._nbytes = sum(b.nbytes for b in buffers)
        self._error: Optional[BaseException] = None
        self._digest: Optional[bytes] = None
        self._thread = threading.Thread(target=self._run, args=(fd, buffers), name="stepjournal-stage", daemon=True)
        self._thread.start()

    def _run(self, fd: int, buffers: List[memoryview]) -> None:
        try:
            self._store._write_tmp(fd, self._tmp, buffers)
        except BaseException as exc:  # raised where the record waits for it (`finish`)
            self._error = exc

    def named(self, digest: bytes, owner: Any) -> None:
        """The bytes hash to `digest`: the `put` of that digest finishes this file; and when `owner`
        goes away first (never recorded), the file is removed."""
        self._digest = digest
        with _STAGING:
            self._store._staged.setdefault(digest, []).append(self)
        weakref.finalize(owner, self.discard)

    def finish(self, path: str) -> None:
        """Wait for the write, then rename the file to `path` and fsync its folder (a file already there
        holds the same bytes, its name being their digest, and is replaced)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        self._store._rename_into_place(self._tmp, path, self._nbytes)

    def discard(self) -> None:
        """Wait for the write and remove the file (not recorded); a fork child leaves its parent's alone."""
        if os.getpid() != self.pid:
            return
        digest = self._digest
        if digest is not None:
            with _STAGING:
                files = self._store._staged.get(digest, [])
                if self not in files:
                    return  # a `put` took it (and puts it in place), or it went already
                files.remove(self)
                if not files:
                    del self._store._staged[digest]
        self.remove()

    def remove(self) -> None:
        """Wait for the write and remove the file (its caller took it from the staged files, or it never was)."""
        self._thread.join()
        _remove_quietly(self._tmp)


def _buffers(blob: Any) -> List[memoryview]:
    parts = blob if isinstance(blob, (list, tuple)) else [blob]
    return [memoryview(part).cast("B") for part in parts]


def _write_all(fd: int, buffers: List[memoryview]) -> None:
    """Every byte of `buffers`, in order, with as few system calls as the kernel allows (``writev``)."""
    pending = [b for b in buffers if b.nbytes]
    while pending:
        written = os.writev(fd, pending[:_IOV_MAX])
        while pending and written >= pending[0].nbytes:
            written -= pending[0].nbytes
            pending.pop(0)
        if written:
            pending[0] = pending[0][written:]


def _file_digest(f: Any, digest: bytes, nbytes: Optional[int], one_thread: bool = False) -> bytes:
    return stored_digest_read(f.read, digest.hex(), nbytes, one_thread=one_thread)


def _folder(folder: str, *names: str, create: bool = False) -> ContextManager[int]:
    """The descriptor of the payload folder `folder`, or of its sub-folder `names` (see `owned_folder`)."""
    parent, top = os.path.split(folder)
    return owned_folder(parent or os.curdir, top, *names, create=create)


def _remove_quietly(tmp: str) -> None:
    """Remove the file `tmp` that `_new_tmp` made, if it is still there."""
    payloads = os.path.dirname(os.path.dirname(tmp))
    try:
        with _folder(payloads, TMP_FOLDER) as folder:
            remove(folder, os.path.basename(tmp), where=tmp)
    except (FileNotFoundError, UnsafePathError):
        pass  # nothing of ours to remove there
