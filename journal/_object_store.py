"""Payloads on object storage: `ObjectPayloadStore`, a `PayloadStore` addressed by URL, and the client calls.

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
- **Reads are bounded by the size announced**: an HTTP body may be longer than the size its headers
  announce (a chunked body beside a ``Content-Length``: the client follows the chunks and reports the
  header), and the client's one-call read collects all of it. So an object over HTTP is read as a
  stream in chunks of the announced size: an honest body is one chunk (one copy, as the one-call
  read makes), a longer one is refused after at most one more chunk. A local folder or memory store
  has no framing to disagree with and keeps the one-call read (`Remote._read`).
- **Credentials** come from the client's usual environment and config (``AWS_ACCESS_KEY_ID`` ...),
  never from stepjournal's files; every message this module raises or logs has the values of the
  usual credential variables scrubbed out, and the client's own exception is not chained.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from contextlib import contextmanager
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar

from ._digest import DIGEST_SIZE
from ._errors import IntegrityError, PayloadMissingError, RemoteConflictError, RemoteError
from ._log import get_logger
from ._payload_store import LmdbPayloadStore, PayloadStore, Release, WriteEvents, _check_digest
from ._payloads import MAX_ORPHAN_NBYTES, MAX_PAYLOAD_NBYTES, stored_digest, unwrap

__all__ = ["ObjectPayloadStore", "open_payload_store", "Remote", "PAYLOADS_PREFIX", "stored_bound", "scrub"]

log = get_logger(__name__)

T = TypeVar("T")
PAYLOADS_PREFIX = "payloads/"
# Values of these variables never appear in a message of ours (the clients' usual credential names).
_SECRET_VARIABLES = re.compile(r"(SECRET|TOKEN|PASSWORD|ACCOUNT_KEY|ACCESS_KEY|CREDENTIAL|SAS|SERVICE_ACCOUNT)", re.I)


def scrub(text: str) -> str:
    """`text` without the value of any credential variable of the environment (replaced by ``***``)."""
    for name, value in os.environ.items():
        if value and len(value) >= 4 and _SECRET_VARIABLES.search(name) and value in text:
            text = text.replace(value, "***")
    return text


def public_url(url: str) -> str:
    """The URL without user info, query or fragment (what messages and events may show)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def stored_bound(nbytes: Optional[int]) -> int:
    """The most bytes a stored object may hold for a payload of `nbytes` encoded bytes.

    A zstd frame of incompressible data is a little larger than the data; nothing honest is larger.
    """
    limit = MAX_ORPHAN_NBYTES if nbytes is None else min(max(nbytes, 0), MAX_PAYLOAD_NBYTES)
    return limit + (limit >> 7) + 4096


# The settings obstore takes as `client_options` (timeouts, plain HTTP ...), not as the store's `config`.
_CLIENT_KEYS = frozenset("""allow_http allow_invalid_certificates connect_timeout default_content_type
    default_headers http1_only http2_keep_alive_interval http2_keep_alive_timeout http2_keep_alive_while_idle
    http2_only pool_idle_timeout pool_max_idle_per_host proxy_url proxy_ca_certificate proxy_excludes
    root_certificate randomize_addresses read_timeout timeout user_agent""".split())


def _store_kwargs(url: str, options: Mapping[str, Any]) -> dict:
    """`from_url`'s keyword arguments for `options`: client settings apart from the store's config."""
    config = {k: v for k, v in options.items() if k not in _CLIENT_KEYS}
    client = {k: v for k, v in options.items() if k in _CLIENT_KEYS}
    kwargs: dict = {"config": config} if config else {}
    if client:
        # Client settings given replace those the client reads from the environment: keep plain HTTP.
        if url.startswith("s3://") and "allow_http" not in client and os.environ.get("AWS_ALLOW_HTTP"):
            client["allow_http"] = os.environ["AWS_ALLOW_HTTP"].strip().lower() == "true"
        kwargs["client_options"] = client
    if url.startswith("file://"):
        kwargs["mkdir"] = True
    return kwargs


def _announced_body(result: Any, size: int) -> Tuple[Any, int]:
    """(the body, how many bytes the server sent, counted up to one chunk past `size`), streamed.

    Chunks of the announced size: an honest body is the first chunk (one copy into Python bytes)
    and the end; a longer one is stopped one chunk later (twice the size, plus one network read).
    The stream (and its connection) is let go of when this returns.
    """
    stream = result.stream(min_chunk_size=max(size, 1))
    body = next(stream, b"")
    sent = len(body)
    if sent <= size:
        sent += len(next(stream, b""))
    return body, sent


def _client_message(exc: BaseException) -> str:
    # obstore appends a multi-line debug dump of its error; the first line says what happened.
    return scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)[:300]


class Remote:
    """A prefix of an object store, through obstore: bounded reads, typed errors, no credentials shown.

    Args:
        url: ``s3://bucket/prefix``, ``gs://``, ``az://``, ``file:///path`` or ``memory://``.
        options: client settings passed to obstore, beside what the environment gives: the store's
            ``config`` (endpoint, region ...) and its HTTP client's (``timeout``, ``read_timeout``,
            ``connect_timeout``, ``allow_http`` ...: `_CLIENT_KEYS`); keep credentials in the environment.
    """

    def __init__(self, url: str, *, options: Optional[Mapping[str, Any]] = None) -> None:
        try:
            import obstore
            from obstore.store import from_url
        except ImportError:
            raise RemoteError('object storage needs the s3 extra: pip install "stepjournal[s3]"') from None
        self._obstore = obstore
        self.url = public_url(url)
        # No HTTP framing can disagree with the size a local file or a memory store announces.
        self._one_call = url.startswith(("file://", "memory://"))
        kwargs = _store_kwargs(url, options or {})
        try:
            self._store = from_url(url, retry_config={"max_retries": 2}, **kwargs)
        except BaseException as exc:  # obstore raises several unrelated types on a bad URL or config
            if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                raise  # KeyboardInterrupt, SystemExit; a Rust panic (an unknown setting) is a bad config
            raise RemoteError(f"cannot open the object store {self.url!r}: {_client_message(exc)}") from None

    def _fail(self, what: str, key: str, exc: BaseException) -> RemoteError:
        return RemoteError(f"{what} {self.url}/{key} failed: {_client_message(exc)}")

    def put(self, key: str, data: Any, *, create: bool = False) -> bool:
        """Write one object in one PUT; with `create`, only when absent (returns False when it was there)."""
        mode = "create" if create else "overwrite"
        try:
            self._obstore.put(self._store, key, memoryview(data).cast("B") if not isinstance(data, bytes) else data,
                              mode=mode, use_multipart=False)
            return True
        except self._obstore.exceptions.AlreadyExistsError:
            return False
        except Exception as exc:
            if create and type(exc).__name__ in ("PreconditionError", "FileExistsError"):
                return False
            raise self._fail("writing", key, exc) from None

    @property
    def conditional(self) -> bool:
        """Whether the store refuses a write whose expected version is stale (object stores do; a local
        folder does not, so pushes to ``file://`` take a lock file instead: `push_lock`)."""
        return not self.url.startswith("file://")

    @contextmanager
    def push_lock(self, name: str) -> Iterator[None]:
        """An exclusive, non-blocking lock on ``<folder>/<name>`` for a ``file://`` remote (a no-op elsewhere).

        Raises:
            RemoteConflictError: another process (or handle) holds it.
        """
        if self.conditional:
            yield
            return
        import fcntl

        path = os.path.join(urllib.parse.unquote(urllib.parse.urlsplit(self.url).path), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RemoteConflictError(f"another push holds {self.url}/{name}; run this push again when it ends") from None
            yield
        finally:
            os.close(fd)

    def put_if(self, key: str, data: bytes, *, etag: Optional[str]) -> Optional[str]:
        """Write `key` only if it is still at version `etag` (None: only if absent); return its new version.

        On a store that is not `conditional` the write is plain (the caller holds `push_lock`).

        Raises:
            RemoteConflictError: the object changed (or appeared) since `etag` was read.
        """
        if not self.conditional:
            self.put(key, data)
            return None
        mode: Any = "create" if etag is None else {"e_tag": etag}
        try:
            result = self._obstore.put(self._store, key, data, mode=mode, use_multipart=False)
        except Exception as exc:
            if type(exc).__name__ in ("PreconditionError", "AlreadyExistsError", "FileExistsError"):
                raise RemoteConflictError(f"{self.url}/{key} changed since it was read: another push ran "
                                          "meanwhile; run this push again") from None
            raise self._fail("writing", key, exc) from None
        return result.get("e_tag")

    def get_tagged(self, key: str, *, limit: int) -> Tuple[Optional[bytes], Optional[str]]:
        """(bytes, version) of the object, or (None, None) when there is none (bounded as `get`)."""
        found, tag = self._read(key, limit)
        return (None if found is None else bytes(found)), tag

    def get(self, key: str, *, limit: int) -> Optional[bytes]:
        """The object's bytes, or None when there is none; more than `limit` bytes raise `IntegrityError`."""
        found = self._read(key, limit)[0]
        return None if found is None else bytes(found)

    def get_buffer(self, key: str, *, limit: int) -> Optional[Any]:
        """`get`, as the read-only buffer the client received into (no copy of a payload's bytes)."""
        return self._read(key, limit)[0]

    def _read(self, key: str, limit: int) -> Tuple[Optional[Any], Optional[str]]:
        try:
            result = self._obstore.get(self._store, key)
            size = int(result.meta["size"])
            if size > limit:
                raise IntegrityError(
                    f"object {self.url}/{key} is {size} bytes, more than the {limit} it may hold; not read",
                    detail="oversized object",
                )
            # A local file is read in one call inside the client, into one buffer, without the GIL.
            body, sent = _announced_body(result, size) if not self._one_call else (body := result.bytes(), len(body))
            if sent > size:
                raise IntegrityError(f"object {self.url}/{key} announced {size} bytes and sends more (refused after "
                                     f"{sent}; at most {limit} allowed): the server's reply is broken or hostile, "
                                     "nothing of it was kept; check the server or push the object again",
                                     detail="oversized object")
            if sent < size:
                raise IntegrityError(f"object {self.url}/{key} announced {size} bytes and sent {sent}: truncated "
                                     "on the way; read it again, or check the server", detail="truncated object")
            return body, result.meta.get("e_tag")
        except (IntegrityError, RemoteError):
            raise
        except FileNotFoundError:
            return None, None
        except Exception as exc:
            if isinstance(exc, self._obstore.exceptions.NotFoundError):
                return None, None
            raise self._fail("reading", key, exc) from None

    def exists(self, key: str) -> bool:
        try:
            self._obstore.head(self._store, key)
            return True
        except FileNotFoundError:
            return False
        except Exception as exc:
            if isinstance(exc, self._obstore.exceptions.NotFoundError):
                return False
            raise self._fail("looking up", key, exc) from None

    def delete(self, key: str) -> None:
        try:
            self._obstore.delete(self._store, key)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._fail("deleting", key, exc) from None

    def keys(self, prefix: str) -> List[str]:
        """Every key under `prefix` (relative to the remote's own prefix), sorted."""
        try:
            found = [meta["path"] for batch in self._obstore.list(self._store, prefix) for meta in batch]
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._fail("listing", prefix, exc) from None
        return sorted(found)


def _payload_key(digest: bytes) -> str:
    return PAYLOADS_PREFIX + digest.hex()


class ObjectPayloadStore:
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
    def _over(cls, remote: Any) -> "ObjectPayloadStore":
        """A store (no cache) on an already open remote-shaped source, such as a bundle's reader."""
        found = cls.__new__(cls)
        found.remote, found.url, found.cache = remote, remote.url, None
        return found

    def __repr__(self) -> str:
        return f"ObjectPayloadStore({self.url!r}, cached={self.cache is not None})"

    def _cache_writable(self) -> bool:
        return self.cache is not None and not self.cache._store.readonly

    # -- writing ---------------------------------------------------------------------------------
    def put(self, digest: bytes, blob: Any) -> None:
        _check_digest(digest)
        self.remote.put(_payload_key(digest), blob)  # overwrite: a damaged remote copy is replaced
        if self._cache_writable():
            self.cache.put(digest, blob)

    def commit(self, items: Sequence[Tuple[bytes, Any]], write_events: WriteEvents) -> T:
        for digest, blob in items:
            _check_digest(digest)
            # A payload in the cache was written to the remote before its first event committed.
            if self.cache is None or not self.cache.has(digest):
                self.remote.put(_payload_key(digest), blob)
        if not items or not self._cache_writable():
            return write_events(None)
        cache = self.cache
        return write_events(lambda txn: cache.put_in(txn, items))

    def delete(self, digest: bytes) -> bool:
        _check_digest(digest)
        key = _payload_key(digest)
        found = self.remote.exists(key)
        if found:
            self.remote.delete(key)
        if self._cache_writable():
            found = self.cache.delete(digest) or found
        return found

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
        _check_digest(digest)
        blob = self._blob(digest, nbytes)
        raw = unwrap(blob, digest.hex(), None, nbytes)
        if stored_digest(raw, digest.hex(), None, nbytes) != digest:
            raise self._damaged(digest)
        return blob, raw

    @contextmanager
    def view(self, digest: bytes, *, nbytes: Optional[int] = None) -> Iterator[Tuple[Any, Optional[Release]]]:
        _check_digest(digest)
        if self.cache is not None and self.cache.has(digest):
            with self.cache.view(digest, nbytes=nbytes) as found:
                yield found
            return
        if self._cache_writable():  # what is cached is checked first
            blob, raw = self.fetch(digest, nbytes=nbytes)
            self.cache.put(digest, blob)
            yield raw, None
            return
        # Unchecked, as a view is: the journal's load checks the digest while it decodes (one pass
        # over the bytes instead of two). Its mismatch is reported as the remote copy's.
        try:
            yield unwrap(self._blob(digest, nbytes), digest.hex(), None, nbytes), None
        except IntegrityError as exc:
            if exc.detail != "digest mismatch":
                raise
            raise self._damaged(digest) from None

    def get(self, digest: bytes, *, nbytes: Optional[int] = None) -> bytes:
        if self.cache is not None and self.cache.has(digest):
            return self.cache.get(digest, nbytes=nbytes)
        blob, raw = self.fetch(digest, nbytes=nbytes)
        if self._cache_writable():
            self.cache.put(digest, blob)
        return bytes(raw)

    def check(self, digest: bytes, *, nbytes: Optional[int] = None) -> None:
        """Check the remote object (the truth), and the cached copy when there is one."""
        self.fetch(digest, nbytes=nbytes)
        if self.cache is not None and self.cache.has(digest):
            self.cache.check(digest, nbytes=nbytes)

    def has(self, digest: bytes) -> bool:
        _check_digest(digest)
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


def open_payload_store(payload_store: Any, store: Any) -> PayloadStore:
    """The `PayloadStore` a `Journal` uses for its ``payload_store=`` argument.

    None: the journal's own LMDB store; a URL string: an `ObjectPayloadStore` there, with the
    journal's LMDB payload table as its verified cache; anything else: that store, as it is.
    """
    if payload_store is None:
        return LmdbPayloadStore(store)
    if isinstance(payload_store, (str, os.PathLike)):
        url = os.fspath(payload_store)
        found = ObjectPayloadStore(url, cache=LmdbPayloadStore(store))
        log.info("payload_store_opened", url=found.url)
        return found
    return payload_store
