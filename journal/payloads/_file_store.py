"""`FilePayloadStore`: payloads as content-addressed files in a folder, written from their own buffers.

Each payload is one file, ``FOLDER/<first two hex digits>/<the other 62>``, holding the stored bytes
(an encoding, or a zstd frame of it) exactly as `LmdbPayloadStore` holds them in its table.

The write order keeps the journal's rule that an event never names a payload that is not durable:
the bytes go to a new file under ``FOLDER/tmp/`` (``writev`` of the buffers given, no joined copy),
``fsync``, ``rename`` to the digest's name, ``fsync`` of the folder, and only then does the journal
commit the event (`commit`). A crash in between leaves at most a file no event names: an orphan in
``tmp/`` (`partial_files`) or a whole payload nothing references, both of which `verify` reports.

A file is never changed after its rename: a payload is replaced by renaming a new file over it, and
removed by unlinking it, neither of which touches a reader's open file. A replay maps the file
(``mmap``, private and copy-on-write) and hands the mapping to the load, whose tensors are views of
it: no copy, and a tensor written to changes only its own pages. Before mapping, the file's size is
checked against the event's (an uncompressed payload is exactly ``nbytes`` long), so a file cut short
is refused, never mapped; the digest is checked over the mapping before anything is returned.
The rule for files that change underneath: nothing may truncate or rewrite a file in ``payloads/``
in place while a process replays from it (a mapped page past a new end raises SIGBUS when touched);
`verify` reports any such damage afterwards. A zstd frame is decompressed from the mapping into a
buffer of its own. A full disk is `JournalFullError` from the write, and the partial file is removed.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import uuid
import weakref
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

from ..base._digest import DIGEST_SIZE, digest_bytes
from ..base._errors import IntegrityError, JournalError, JournalFullError, PayloadMissingError
from ..base._pages import HANDED_OVER
from ._payload_store import LmdbPayloadStore, Release, WriteEvents, check_digest
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


def local_payload_store(store: Any) -> LmdbPayloadStore:
    """A journal's own payload store: its LMDB table, with large payloads in its ``payloads/`` folder."""
    files = FilePayloadStore(os.path.join(store.path, PAYLOAD_FOLDER), readonly=store.readonly)
    return LmdbPayloadStore(store, files=files)


class FilePayloadStore:
    """Payloads as files under `folder`, one per digest (see the module's doc for the write order).

    Args:
        folder: the folder that holds the files (made on the first write).
        readonly: refuse every write (a reader's store).
    """

    def __init__(self, folder: str, *, readonly: bool = False) -> None:
        self.folder = os.fspath(folder)
        self.readonly = readonly
        self._staged: Dict[bytes, "StagedFile"] = {}  # digest -> a file written ahead of its `put` (`stage`)

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
        staged = self._staged.pop(digest, None)
        if staged is not None and staged.pid == os.getpid():  # a forked child writes its own
            staged.finish(path)
            return
        buffers = _buffers(blob)
        # The check is bounded by the size of the value being stored, never by the file's.
        nbytes = own_nbytes(buffers[0]) if len(buffers) == 1 else sum(b.nbytes for b in buffers)
        if os.path.exists(path) and self._intact(path, digest, nbytes):
            return
        self._write(path, buffers)

    def commit(self, items: Sequence[Tuple[bytes, Any]], write_events: WriteEvents) -> T:
        for digest, blob in items:
            self.put(digest, blob)
        return write_events(None)

    def delete(self, digest: bytes) -> bool:
        self._refuse_if_readonly()
        path = self.path_of(digest)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        _fsync_folder(os.path.dirname(path))
        return True

    def stage(self, blob: Any) -> "StagedFile":
        """Start writing `blob` (bytes-like, or a sequence of them) to a new file under ``tmp/`` on a
        thread of its own, so that the caller can hash the same bytes meanwhile; `StagedFile.named`
        then lets the `put` of that digest finish it (``fsync``, ``rename``, folder ``fsync``) instead
        of writing the bytes again."""
        self._refuse_if_readonly()
        return StagedFile(self, _buffers(blob))

    def discard_staged(self, digest: bytes) -> None:
        """Remove the file staged for `digest`, if any (its record was refused before it was stored)."""
        staged = self._staged.pop(digest, None)
        if staged is not None:
            staged.discard()

    def partial_files(self) -> List[str]:
        """The files a write left in ``tmp/`` without renaming them (a crash cut it short), oldest first."""
        tmp = os.path.join(self.folder, TMP_FOLDER)
        try:
            names = os.listdir(tmp)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            path = os.path.join(tmp, name)
            try:
                found.append((os.stat(path).st_mtime_ns, path))
            except FileNotFoundError:
                continue  # a write in flight renamed it meanwhile: not left behind
        return [path for _, path in sorted(found)]

    def remove_partial_files(self) -> int:
        """Delete what `partial_files` lists; return how many. Only for a journal no process is writing:
        a write in flight has its file there too."""
        self._refuse_if_readonly()
        found = self.partial_files()
        for path in found:
            os.unlink(path)
        if found:
            _fsync_folder(os.path.join(self.folder, TMP_FOLDER))
        return len(found)

    def _refuse_if_readonly(self) -> None:
        if self.readonly:
            raise JournalError(f"the payload folder {self.folder} was opened read-only; open it writable to write")

    def _intact(self, path: str, digest: bytes, nbytes: int) -> bool:
        try:
            with open(path, "rb") as f:
                return _file_digest(f, digest, nbytes) == digest
        except (IntegrityError, OSError):
            return False

    def _new_tmp(self) -> str:
        """A new name under ``tmp/`` (the folder made if missing)."""
        tmp_folder = os.path.join(self.folder, TMP_FOLDER)
        _make_folder(tmp_folder, self.folder)
        return os.path.join(tmp_folder, uuid.uuid4().hex)

    def _write_tmp(self, tmp: str, buffers: List[memoryview]) -> None:
        """`buffers` written to the new file `tmp` and fsynced; on an error the file is removed."""
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
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
        try:
            _make_folder(os.path.dirname(path), self.folder)
            os.rename(tmp, path)
        except OSError as exc:
            _remove_quietly(tmp)
            raise self._full(exc, nbytes) from None
        _fsync_folder(os.path.dirname(path))

    def _full(self, exc: OSError, nbytes: int) -> OSError:
        """`JournalFullError` for a full disk, else `exc` itself."""
        if exc.errno in _FULL:
            return JournalFullError(
                f"the disk holding {self.folder} is full: a payload of {nbytes} bytes "
                "was not written and nothing names it; nothing already recorded was harmed. Free space, or "
                "continue without recording (see docs/reliability.md)"
            )
        return exc

    def _write(self, path: str, buffers: List[memoryview]) -> None:
        tmp = self._new_tmp()
        self._write_tmp(tmp, buffers)
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
        try:
            f = open(self.path_of(digest), "rb")
        except FileNotFoundError:
            raise self._missing(digest) from None
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

    def total_bytes(self, *, besides: Optional[bytes] = None) -> int:
        """The bytes of every payload file, and of what ``tmp/`` holds (a walk of the folder), but the file
        this process staged for the digest `besides` (the payload whose room is being asked for)."""
        staged = self._staged.get(besides) if besides is not None else None
        own = staged._tmp if staged is not None and staged.pid == os.getpid() else None
        total = 0
        for folder, _, names in os.walk(self.folder):
            for name in names:
                path = os.path.join(folder, name)
                if path == own:
                    continue
                try:
                    total += os.stat(path).st_size
                except FileNotFoundError:
                    continue  # deleted meanwhile
        return total

    def stored(self, digest: bytes) -> Optional[Any]:
        """The file's bytes as they are stored, unchecked, as a read-only mapping of the file (a push of a
        GB payload holds page cache, not a copy of it); None when there is no such file."""
        try:
            with open(self.path_of(digest), "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return b""
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            return None

    def has(self, digest: bytes) -> bool:
        return os.path.isfile(self.path_of(digest))

    def __contains__(self, digest: object) -> bool:
        return isinstance(digest, bytes) and len(digest) == DIGEST_SIZE and self.has(digest)

    def digests(self) -> Iterator[bytes]:
        try:
            fans = sorted(os.listdir(self.folder))
        except FileNotFoundError:
            return
        for fan in fans:
            if len(fan) != 2 or fan == TMP_FOLDER:
                continue
            try:
                names = sorted(os.listdir(os.path.join(self.folder, fan)))
            except NotADirectoryError:
                continue
            for name in names:
                try:
                    digest = bytes.fromhex(fan + name)
                except ValueError:
                    continue  # not one of ours
                if len(digest) == DIGEST_SIZE and digest.hex() == fan + name:
                    yield digest


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
        self._tmp = store._new_tmp()
        self._nbytes = sum(b.nbytes for b in buffers)
        self._error: Optional[BaseException] = None
        self._digest: Optional[bytes] = None
        self._thread = threading.Thread(target=self._run, args=(buffers,), name="stepjournal-stage", daemon=True)
        self._thread.start()

    def _run(self, buffers: List[memoryview]) -> None:
        try:
            self._store._write_tmp(self._tmp, buffers)
        except BaseException as exc:  # raised where the record waits for it (`finish`)
            self._error = exc

    def named(self, digest: bytes, owner: Any) -> None:
        """The bytes hash to `digest`: the `put` of that digest finishes this file; and when `owner`
        goes away first (never recorded), the file is removed."""
        self._digest = digest
        self._store._staged[digest] = self
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
        self._thread.join()
        if self._digest is not None and self._store._staged.get(self._digest) is self:
            del self._store._staged[self._digest]
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


def _make_folder(path: str, root: str) -> None:
    """Make `path` (and `root` above it) if missing, durably: the new entry's parent is synced."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if path != root and not os.path.isdir(parent):
        _make_folder(parent, root)
    try:
        os.mkdir(path)
    except FileExistsError:
        return
    except OSError as exc:
        if exc.errno in _FULL:
            raise JournalFullError(f"the disk holding {root} is full: the folder {path} could not be made") from None
        raise
    _fsync_folder(parent)


def _fsync_folder(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
