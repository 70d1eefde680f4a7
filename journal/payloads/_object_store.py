"""Payloads on object storage: `ObjectPayloadStore`, a `PayloadStore` addressed by URL.

``s3://bucket/prefix`` (and ``gs://``, ``az://``, ``file:///path``, ``memory://``) through obstore, the
client chosen by measurement (docs/sharing.md). A payload is the object ``<prefix>/payloads/<hex
digest>`` holding its stored bytes (the encoding or a zstd frame of it), the same layout `push`
writes, so a journal recording to a remote and a journal pushed there share their payloads.

The rules:

- **Object first, then the event**: `commit` writes every object that is not already in the local
  cache, then lets the journal commit the events (and the cached copies) in one LMDB transaction. A
  crash between leaves an unreferenced object, never an event naming a payload that is not there.
- **The local LMDB payload table is a verified cache**: an object read from the remote is bounded in
  size and checked against its digest before it is served or cached; a cached copy is served as the
  LMDB store serves it (the journal's load path checks its digest while decoding). A `view` without
  a cache is unchecked, as every view is: the journal's load makes that check while it decodes, so
  a cold replay passes over the fetched bytes once, and a mismatch names the remote copy.
- **Reads are bounded by the size announced** (`Remote`, in `_object_client`): an object over HTTP is
  read in pieces into a new buffer of its announced size, and that buffer is the payload's only copy:
  the view hands it over (`HANDED_OVER`) and the journal's load makes tensors that are views of it.
- **Credentials** come from the client's usual environment and config (``AWS_ACCESS_KEY_ID`` ...),
  never from stepjournal's files; messages are scrubbed by `Remote`, logs show URLs without user info.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple, TypeVar

import lmdb

from ..base._digest import DIGEST_SIZE
from ..base._errors import IntegrityError, PayloadMissingError
from ..base._log import get_logger
from ._object_client import Remote
from ..base._pages import HANDED_OVER
from ._payload_store import LmdbPayloadStore
from ._store_protocol import PayloadStore, PayloadStoreBase, Release, WriteEvents, check_digest, checked_store
from ._payloads import joined, stored_bound, stored_digest, unwrap

__all__ = ["ObjectPayloadStore", "open_payload_store", "PAYLOADS_PREFIX"]

log = get_logger(__name__)

T = TypeVar("T")
PAYLOADS_PREFIX = "payloads/"


def _payload_key(digest: bytes) -> str:
    return PAYLOADS_PREFIX + digest.hex()


def _handed_over(blob: Any, raw: Any) -> Optional[Release]:
    """`HANDED_OVER` when `raw` is the writable buffer a read made for this payload alone (an object
    over HTTP, not compressed), so the load keeps it instead of copying tensors out; else None."""
    return HANDED_OVER if raw is blob and not memoryview(blob).readonly else None


class ObjectPayloadStore(PayloadStoreBase):
    """Payloads as content-addressed objects under ``URL/payloads/``, with an optional local cache.

    Args:
        url: where the objects live (``s3://bucket/prefix`` ...; see `Remote`).
        cache: the journal's LMDB payload store, which keeps a copy of every payload committed or read
            (`open_payload_store` passes the journal's own); None reads the remote every time.
        options: client settings (see `Remote`).
    """

    def __init__(self, url: str, *, cache: Optional[LmdbPayloadStore] = None,
                 options: Optional[Mapping[str, Any]] = None) -> None:
        self.remote = Remote(url, options=options)
        self.url = self.remote.url
        self.cache = cache

    @classmethod
    def over(cls, remote: Any) -> "ObjectPayloadStore":
        """A store (no cache) on an already open `Remote` or remote-shaped source (a bundle's reader): what
        a pull or an import reads payloads through."""
        found = cls.__new__(cls)
        found.remote, found.url, found.cache = remote, remote.url, None
        return found

    def __repr__(self) -> str:
        return f"ObjectPayloadStore({self.url!r}, cached={self.cache is not None})"

    def _writable_cache(self) -> Optional[LmdbPayloadStore]:
        """The local cache when it takes writes; None when there is none or it is read-only."""
        return self.cache if self.cache is not None and not self.cache.readonly else None

    # -- writing ---------------------------------------------------------------------------------
    takes_pieces = True  # a payload's pieces (a list) are joined once here, for the remote

    def put(self, digest: bytes, blob: Any) -> None:
        check_digest(digest)
        blob = joined(blob)
        self.remote.put(_payload_key(digest), blob)  # overwrite: a damaged remote copy is replaced
        cache = self._writable_cache()
        if cache is not None:
            cache.put(digest, blob)

    def commit(self, items: Sequence[Tuple[bytes, Any]], write_events: WriteEvents[T]) -> T:
        items = [(digest, joined(blob)) for digest, blob in items]
        for digest, blob in items:
            check_digest(digest)
            # A payload in the cache was written to the remote before its first event committed.
            if self.cache is None or not self.cache.has(digest):
                self.remote.put(_payload_key(digest), blob)
        if not items:
            return write_events(None)

        def in_txn(txn: lmdb.Transaction[Any]) -> None:
            # A release in another process may have deleted an object of the same bytes since it was
            # written (or found in the cache); releases delete inside a write transaction
            # (`delete_in`), so one found here stays until the events naming it commit.
            for digest, blob in items:
                if not self.remote.exists(_payload_key(digest)):
                    self.remote.put(_payload_key(digest), blob)
            cache = self._writable_cache()
            if cache is not None:
                cache.put_in(txn, items)

        return write_events(in_txn)

    def lmdb_bytes(self, items: Sequence[Tuple[bytes, Any]]) -> int:
        """The bytes of `items` that `commit` puts in the local cache's LMDB pages."""
        cache = self._writable_cache()
        return cache.lmdb_bytes(items) if cache is not None else 0

    def delete(self, digest: bytes) -> bool:
        check_digest(digest)
        key = _payload_key(digest)
        found = self.remote.exists(key)
        if found:
            self.remote.delete(key)
        cache = self._writable_cache()
        if cache is not None:
            found = cache.delete(digest) or found
        return found

    def delete_in(self, txn: lmdb.Transaction[Any], digests: Sequence[bytes]) -> None:
        """`delete` of each of `digests` inside the open write transaction `txn` of the cache's journal
        (a release's deletion, `_release.delete_released`): a record's `commit` checks its objects in a
        write transaction too, so the two never overlap."""
        for digest in digests:
            check_digest(digest)
            key = _payload_key(digest)
            if self.remote.exists(key):
                self.remote.delete(key)
        cache = self._writable_cache()
        if cache is not None:
            in_files = cache.delete_in(txn, digests)  # never any when the cache keeps no payload files
            if in_files and cache.files is not None:
                for digest in in_files:
                    cache.files.delete(digest)

    # -- reading ---------------------------------------------------------------------------------
    def _blob(self, digest: bytes, nbytes: Optional[int]) -> Any:
        read = getattr(self.remote, "get_buffer", None) or self.remote.get  # a bundle's reader has `get` only
        blob = read(_payload_key(digest), limit=stored_bound(nbytes))
        if blob is None:
            raise PayloadMissingError(f"payload {digest.hex()[:16]}… is missing from {self.url}")
        return blob

    def _damaged(self, digest: bytes) -> IntegrityError:
        return IntegrityError(
            f"payload {digest.hex()[:16]}… in {self.url} does not match its digest: the remote copy is damaged",
            detail="digest mismatch",
        )

    def fetch(self, digest: bytes, *, nbytes: Optional[int] = None) -> Tuple[Any, Any]:
        """(stored bytes, encoded bytes) of the remote object, size-bounded and checked against `digest`.

        Both are read-only bytes-like buffers (the client's own, not copied).

        Raises:
            PayloadMissingError: there is no such object.
            IntegrityError: the object is larger than a payload of `nbytes` may be, or does not
                match its digest (truncated, damaged); its bytes are not returned.
        """
        check_digest(digest)
        blob = self._blob(digest, nbytes)
        raw = unwrap(blob, digest.hex(), None, nbytes)
        if stored_digest(raw, digest.hex(), None, nbytes) != digest:
            raise self._damaged(digest)
        return blob, raw

    @contextmanager
    def view(self, digest: bytes, *, nbytes: Optional[int] = None) -> Iterator[Tuple[Any, Optional[Release]]]:
        check_digest(digest)
        if self.cache is not None and self.cache.has(digest):
            with self.cache.view(digest, nbytes=nbytes) as found:
                yield found
            return
        cache = self._writable_cache()
        if cache is not None:  # what is cached is checked first
            blob, raw = self.fetch(digest, nbytes=nbytes)
            cache.put(digest, blob)
            yield raw, _handed_over(blob, raw)
            return
        # Unchecked, as a view is: the journal's load checks the digest while it decodes (one pass
        # over the bytes instead of two). Its mismatch is reported as the remote copy's.
        try:
            blob = self._blob(digest, nbytes)
            raw = unwrap(blob, digest.hex(), None, nbytes)
            yield raw, _handed_over(blob, raw)
        except IntegrityError as exc:
            if exc.detail != "digest mismatch":
                raise
            raise self._damaged(digest) from None

    def get(self, digest: bytes, *, nbytes: Optional[int] = None) -> bytes:
        if self.cache is not None and self.cache.has(digest):
            return self.cache.get(digest, nbytes=nbytes)
        blob, raw = self.fetch(digest, nbytes=nbytes)
        cache = self._writable_cache()
        if cache is not None:
            cache.put(digest, blob)
        return bytes(raw)

    def check(self, digest: bytes, *, nbytes: Optional[int] = None) -> None:
        """Check the remote object (the truth), and the cached copy when there is one."""
        self.fetch(digest, nbytes=nbytes)
        if self.cache is not None and self.cache.has(digest):
            self.cache.check(digest, nbytes=nbytes)

    def has(self, digest: bytes) -> bool:
        check_digest(digest)
        return self.remote.exists(_payload_key(digest))

    def __contains__(self, digest: object) -> bool:
        return isinstance(digest, bytes) and len(digest) == DIGEST_SIZE and self.has(digest)

    def digests(self) -> Iterator[bytes]:
        found = []
        for key in self.remote.keys(PAYLOADS_PREFIX):
            name = key[len(PAYLOADS_PREFIX):]
            try:
                digest = bytes.fromhex(name)
            except ValueError:
                continue  # not one of ours
            if len(digest) == DIGEST_SIZE and digest.hex() == name:
                found.append(digest)
        return iter(sorted(found))


def open_payload_store(payload_store: Any, local: LmdbPayloadStore) -> PayloadStore:
    """The `PayloadStore` a `Journal` uses for its ``payload_store=`` argument, given its own (`local`).

    None: the journal's own store; a URL string: an `ObjectPayloadStore` there, with the journal's
    own store as its verified cache; anything else: that store, as it is, once it declares every member of
    `PayloadStore` (`PayloadStoreError` names those it lacks).
    """
    if payload_store is None:
        return local
    if isinstance(payload_store, (str, os.PathLike)):
        url = os.fspath(payload_store)
        found = ObjectPayloadStore(url, cache=local)
        log.info("payload_store_opened", url=found.url)
        return found
    return checked_store(payload_store)
