"""Where payloads live: `LmdbPayloadStore`, the first implementation of the `PayloadStore` protocol.

A payload store maps a 32-byte digest to the payload's stored bytes (an encoding, or a zstd frame of
it; see `_payloads`). It knows nothing of events. The journal only ever talks to it through this
protocol, so another store (object storage, say) can be added without touching the journal.

The one rule that ties payloads to events: an event must never reference a payload that is not
durable. `commit(items, write_events)` is how the journal asks for it:

- a store in the journal's own LMDB environment writes the payloads inside the event's write
  transaction (one commit: after a crash both exist or neither does);
- a remote store writes the objects first, then lets the journal commit the event that references
  them (a crash in between leaves an unreferenced object, never a dangling reference).

The protocol, the capabilities a store declares and their defaults are `_store_protocol`'s (offered here
too, where the journal's modules import them). Every store passes the conformance suite shipped as
`stepjournal.testing`.
"""

from __future__ import annotations

import heapq
import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Protocol, Sequence, Tuple, TypeVar

import lmdb

from ..base._digest import DIGEST_SIZE, digest_bytes
from ..base._errors import IntegrityError, JournalFullError, PayloadMissingError
from ..base._pages import MappedFile, releaser
from ._payloads import blob_intact, joined, own_nbytes, stored_digest, stored_size, unwrap
from ._store_protocol import PayloadStore, PayloadStoreBase, Release, WriteEvents, check_digest, problem
from ..storage._store import Store

# The protocol's names are offered here too, where the journal's modules import them.
__all__ = ["PayloadStore", "LmdbPayloadStore", "Release", "WriteEvents", "check_digest", "FILE_FROM"]

T = TypeVar("T")
# Digests per read transaction of `digests()`.
_DIGEST_BATCH = 4096
# Payloads stored from this size up go to the journal's payload files when it has them (`FilePayloadStore`);
# smaller ones ride in the event's LMDB transaction. Measured (`make bench-files`, docs/performance.md
# "Payload files"): below 4 MiB a file's two extra fsyncs cost 1.2-2.5x LMDB's put; from 16 MiB files win.
FILE_FROM = 8 << 20
# `check_many` checks values of this size on average, or more, on up to `_CHECKERS` threads.
_PARALLEL_FROM = 1 << 20
_CHECKERS = 4


class _PayloadFiles(PayloadStore, Protocol):
    """What `LmdbPayloadStore` asks of the store of its large payloads beyond a `PayloadStore`'s members:
    `_file_store.FilePayloadStore`'s (which imports this module, so it is named here by its shape)."""

    readonly: bool

    def total_bytes(self, *, besides: Optional[bytes] = None) -> int:
        """The bytes of every payload file, but the one of `besides`."""

    def discard_staged(self, digest: bytes) -> None:
        """Remove what a `stage` of `digest` wrote (it will not be recorded)."""

    def stored(self, digest: bytes) -> Optional[Any]:
        """The stored bytes of `digest`, unchecked; None when there is no such file."""

    def check(self, digest: bytes, *, nbytes: Optional[int] = None, one_thread: bool = False) -> None:
        """`PayloadStore.check`; `one_thread`: hashed on this thread only."""


class LmdbPayloadStore(PayloadStoreBase):
    """Payloads in the ``payloads`` database of the journal's own LMDB environment.

    Payloads commit in the same write transaction as the events that reference them. An
    uncompressed payload is read straight from LMDB's memory map, and its pages are unmapped from
    this process as soon as the reader is done with them (`_pages`), so a replay holds the decoded
    tensors and not also a mapped copy of the payload.

    Payloads of `file_from` bytes and more, when `files` is given, are files in that store instead
    (`_file_store.FilePayloadStore`, the journal's ``payloads/`` folder): written and made durable
    before the event's transaction commits, found by every read here, deleted once the transaction that
    releases them commits (`delete_in` returns them).

    Args:
        store: the journal's LMDB environment (`Journal`'s own).
        files: where large payloads live (`_file_store.local_payload_store` gives the journal's), or None.
        file_from: the stored size from which a payload goes to `files` (None: `FILE_FROM` as it is now).
    """

    @property
    def readonly(self) -> bool:
        """Whether the environment was opened read-only (a reader's cache is never written)."""
        return self._store.readonly

    def __init__(
        self, store: Store, *, files: Optional[_PayloadFiles] = None, file_from: Optional[int] = None
    ) -> None:
        self._store = store
        self._data_file = os.path.realpath(os.path.join(store.path, "data.mdb"))
        self._mapped = MappedFile(self._data_file)
        self.files = files
        self._file_from = FILE_FROM if file_from is None else file_from

    # The capability `PayloadStore.files`, narrowed to the file store's own methods, which this one writes with.
    files: Optional[_PayloadFiles]

    # `commit`, `put` and `put_in` take a payload's pieces too (a list, `_payloads.prepare_payload`'s
    # ``copy=False``): a file is written from them as they are, a value in LMDB joined first.
    takes_pieces = True
    # `stage` writes a large payload's file while the journal hashes it.
    stages_writes = True

    def _files_for(self, blob: Any) -> Optional[_PayloadFiles]:
        """The payload files that take `blob`, or None when it goes to LMDB."""
        return self.files if self.files is not None and stored_size(blob) >= self._file_from else None

    def stage(self, blob: Any) -> Optional[Any]:
        """Start writing a payload that `commit` will put in a file (`FilePayloadStore.stage`), so its
        bytes are written while the caller hashes them; None for one that goes to LMDB."""
        files = self._files_for(blob)
        if files is None or files.readonly:
            return None
        return files.stage(blob)

    def lmdb_bytes(self, items: Sequence[Tuple[bytes, Any]]) -> int:
        """The bytes of `items` that `commit` puts in LMDB's pages (a payload file takes none)."""
        return sum(stored_size(blob) for _, blob in items if self._files_for(blob) is None)

    def _db(self):
        return self._store.db("payloads")

    # -- writing ---------------------------------------------------------------------------------
    def _to_file(self, files: _PayloadFiles, digest: bytes, blob: Any) -> None:
        """Write one large payload as a file of `files`, within the journal's size cap (`Journal(max_size=...)`):
        the cap counts LMDB's pages in use and every payload file."""
        cap = self._store.max_size
        if cap is not None and not files.has(digest):
            used = self._store.used_bytes() + files.total_bytes(besides=digest)
            if used + stored_size(blob) > cap:
                files.discard_staged(digest)
                raise JournalFullError(
                    f"journal {self._store.path!r} reached its size cap of {cap} bytes ({used} used, a payload of "
                    f"{stored_size(blob)} bytes to write); nothing already recorded was harmed. Raise max_size, or "
                    "continue without recording (see docs/reliability.md)")
        files.put(digest, blob)

    def put_in(self, txn: lmdb.Transaction[Any], items: Sequence[Tuple[bytes, Any]]) -> None:
        """Write `items` inside an open write transaction `txn` (opened with ``buffers=True``); a large
        one is made a durable file first, before `txn` can commit."""
        db = self._db()
        for key, blob in items:
            check_digest(key)
            files = self._files_for(blob)
            if files is not None:
                self._to_file(files, key, blob)
                continue
            blob = joined(blob)
            # Content-addressed: identical payloads are stored once. A stored copy that no longer
            # matches its digest (damaged on disk) is replaced: the new bytes are what the key names.
            # The check is bounded by the size of the value being recorded, never by what is stored:
            # a bomb planted under this digest is replaced, not decompressed.
            existing = txn.get(key, db=db)
            if existing is None or not blob_intact(existing, key, own_nbytes(blob)):
                txn.put(key, blob, db=db)

    def put(self, digest: bytes, blob: Any) -> None:
        files = self._files_for(blob)
        if files is not None:
            check_digest(digest)
            self._to_file(files, digest, blob)
            return
        # buffers: checking a stored duplicate hashes it in place instead of copying it out first.
        self._store.write(lambda txn: self.put_in(txn, [(digest, blob)]), needed=stored_size(blob), buffers=True)

    def commit(self, items: Sequence[Tuple[bytes, Any]], write_events: WriteEvents[T]) -> T:
        # Files first, outside the transaction (which may run again when the map grows): each is durable
        # before the events that name it commit.
        small: List[Tuple[bytes, Any]] = []
        placed: List[Tuple[_PayloadFiles, bytes, Any]] = []
        for key, blob in items:
            check_digest(key)
            files = self._files_for(blob)
            if files is not None:
                self._to_file(files, key, blob)
                placed.append((files, key, blob))
            else:
                small.append((key, joined(blob)))
        if not small and not placed:
            return write_events(None)

        def in_txn(txn: lmdb.Transaction[Any]) -> None:
            # A release in another process may have deleted a file of the same bytes since it was placed
            # (content-addressed); releases delete only inside a write transaction, so one checked here
            # stays until the events naming it commit (`_release.delete_released`).
            for files, key, blob in placed:
                if not files.has(key):
                    files.put(key, blob)
            if small:
                self.put_in(txn, small)

        return write_events(in_txn)

    def delete(self, digest: bytes) -> bool:
        check_digest(digest)
        found = self.files is not None and self.files.delete(digest)
        if self._lmdb_has(digest):
            found = bool(self._store.write(lambda txn: txn.delete(digest, db=self._db()))) or found
        return found

    def delete_in(self, txn: lmdb.Transaction[Any], digests: Sequence[bytes]) -> List[bytes]:
        """Delete `digests` inside an open write transaction `txn` (retention's releases); return those
        that are files, for the caller to `delete` once `txn` has committed (a file deleted before
        would be missing if it did not)."""
        for digest in digests:
            check_digest(digest)
            txn.delete(digest, db=self._db())
        return [d for d in digests if self.files is not None and self.files.has(d)]

    def has_in(self, txn: lmdb.Transaction[Any], digest: bytes) -> bool:
        """`has`, seen from inside the open transaction `txn`."""
        return txn.get(digest, db=self._db()) is not None or (self.files is not None and self.files.has(digest))

    def stored(self, digest: bytes) -> Optional[Any]:
        """The bytes stored under `digest` as they are stored (a zstd frame stays one), unchecked: bytes,
        or a payload file's read-only mapping; None when nothing is (what push and a bundle send)."""
        check_digest(digest)
        with self._store.read() as txn:
            blob = txn.get(digest, db=self._db())
            if blob is not None:
                return bytes(blob)
        return self.files.stored(digest) if self.files is not None else None

    # -- reading ---------------------------------------------------------------------------------
    @contextmanager
    def view(self, digest: bytes, *, nbytes: Optional[int] = None) -> Iterator[Tuple[Any, Optional[Release]]]:
        check_digest(digest)
        with self._store.read(buffers=True) as txn:
            blob = txn.get(digest, db=self._db())
            if blob is not None:
                raw = unwrap(blob, digest.hex(), None, nbytes)
                yield raw, (releaser(raw, self._data_file) if raw is blob else None)
                return
        if self.files is None or not self.files.has(digest):
            raise PayloadMissingError(f"payload {digest.hex()[:16]}… is missing from the journal")
        with self.files.view(digest, nbytes=nbytes) as found:
            yield found

    def get(self, digest: bytes, *, nbytes: Optional[int] = None) -> bytes:
        with self.view(digest, nbytes=nbytes) as (raw, _):
            if digest_bytes(raw) != digest:
                raise IntegrityError(
                    f"payload {digest.hex()[:16]}… does not match its digest: the journal is damaged",
                    detail="digest mismatch",
                )
            return bytes(raw)

    def check(self, digest: bytes, *, nbytes: Optional[int] = None) -> None:
        check_digest(digest)
        files = self.files
        with self._store.read(buffers=True) as txn:
            blob = txn.get(digest, db=self._db())
            if blob is not None or files is None or not files.has(digest):
                self._check_blob(digest, blob, nbytes)
                return
        files.check(digest, nbytes=nbytes)

    def _check_blob(self, digest: bytes, blob: Any, nbytes: Optional[int], one_thread: bool = False) -> None:
        """`check` of a value read in a ``buffers=True`` transaction still open (None: missing);
        `one_thread`: hashed on this thread only (`check_many` runs one check per core)."""
        if blob is None:
            raise PayloadMissingError(f"payload {digest.hex()[:16]}… is missing from the journal")
        # Pages are let go of as they are hashed, as `load` does: verifying a journal does not
        # leave all of it mapped into this process.
        try:
            found = stored_digest(blob, digest.hex(), None, nbytes, releaser(blob, self._data_file),
                                  one_thread=one_thread)
        finally:
            self._mapped.release(blob)
        if found != digest:
            raise IntegrityError(
                f"payload {digest.hex()[:16]}… does not match its digest: the journal is damaged",
                detail="digest mismatch",
            )

    def check_many(self, items: Sequence[Tuple[bytes, Optional[int]]]) -> List[Optional[Exception]]:
        """`check` of several ``(digest, nbytes)`` in one read transaction: per item, None when it is
        whole, else the `PayloadMissingError` or `IntegrityError` `check` would raise (for `verify`).
        The values are views of the map, each let go of as it is hashed, so memory stays bounded.
        """
        for digest, _ in items:
            check_digest(digest)
        with self._store.read(buffers=True) as txn:
            blobs = [txn.get(digest, db=self._db()) for digest, _ in items]  # views, valid while txn is open

            # Decompressing and hashing release the GIL: large values are checked side by side, one
            # per core (up to `_CHECKERS`), each hashed on its own thread (BLAKE3's threads on top of
            # them slowed it down); small ones cost Python time, which threads would not share.
            workers = min(_CHECKERS, os.cpu_count() or 1, len(items))
            # A payload file's size is its event's (a stored frame is smaller: that errs towards one thread).
            sizes = [len(b) if b is not None else (items[at][1] or 0) for at, b in enumerate(blobs)]
            side_by_side = workers > 1 and sum(sizes) >= _PARALLEL_FROM * len(items)

            files = self.files

            def check(at: int) -> Optional[Exception]:
                digest, nbytes = items[at]
                if blobs[at] is None and files is not None and files.has(digest):
                    return problem(lambda: files.check(digest, nbytes=nbytes, one_thread=side_by_side))
                return problem(lambda: self._check_blob(digest, blobs[at], nbytes, one_thread=side_by_side))

            if side_by_side:
                with ThreadPoolExecutor(workers, thread_name_prefix="stepjournal-check") as pool:
                    return list(pool.map(check, range(len(items))))  # in order; any other error raised here
            return [check(at) for at in range(len(items))]

    def has(self, digest: bytes) -> bool:
        return self._lmdb_has(digest) or (self.files is not None and self.files.has(digest))

    def _lmdb_has(self, digest: bytes) -> bool:
        with self._store.read(buffers=True) as txn:
            return txn.get(digest, db=self._db()) is not None

    def __contains__(self, digest: object) -> bool:
        return isinstance(digest, bytes) and len(digest) == DIGEST_SIZE and self.has(digest)

    def digests(self) -> Iterator[bytes]:
        if self.files is None:
            return self._lmdb_digests()
        merged = heapq.merge(self._lmdb_digests(), self.files.digests())
        return (d for d, _ in itertools.groupby(merged))  # one digest stored in both is listed once

    def _lmdb_digests(self) -> Iterator[bytes]:
        # Short read transactions, as `Journal.raw_events` does: none stays open in the caller's loop.
        after = b""
        while True:
            batch: List[bytes] = []
            with self._store.read() as txn:
                cur = txn.cursor(db=self._db())
                if cur.set_range(after) if after else cur.first():
                    for key in cur.iternext(values=False):
                        if key == after:
                            continue
                        batch.append(bytes(key))
                        if len(batch) == _DIGEST_BATCH:
                            break
            yield from batch
            if len(batch) < _DIGEST_BATCH:
                return
            after = batch[-1]


