"""`Remote`: a prefix of an object store through obstore, with bounded reads, typed errors, no credentials shown.

``s3://bucket/prefix`` (and ``gs://``, ``az://``, ``file:///path``, ``memory://``) through obstore, the
client chosen by measurement (docs/sharing.md). Both the payload store (`_object_store`) and push /
pull (`_remote`) talk to object storage only through it.

- **Reads are bounded by the size announced**: an HTTP body may be longer than the size its headers
  announce (a chunked body beside a ``Content-Length``: the client follows the chunks and reports the
  header), and the client's one-call read collects all of it. So an object over HTTP is read as a
  stream, in pieces copied into a new buffer of the announced size (`owned_buffer`, the caller's to
  keep), and a longer body is refused at the first piece past the end. A local folder or memory
  store has no framing to disagree with and keeps the one-call read (`Remote._read`).
- **Listings are bounded in count** where the caller says how many names it will read (`keys`).
- **Credentials** come from the client's usual environment and config (``AWS_ACCESS_KEY_ID`` ...),
  never from stepjournal's files; every message this module raises passes `redact` (no user info of a
  URL, no credential variable's value), and the client's own exception is not chained.
"""

from __future__ import annotations

import os
import pathlib
import re
import urllib.parse
from contextlib import contextmanager
from typing import Any, Iterator, List, Literal, Mapping, Optional, Set, Tuple

from ..base._errors import (IntegrityError, RemoteConflictError, RemoteCredentialsError, RemoteError,
                            RemoteMissingError, RemotePlainHttpError, RemoteRegionError, RemoteUnreachableError)
from ..base._pages import owned_buffer
from ..base._secrets import public_url, redact

__all__ = ["Remote", "remote_url", "is_url"]


# Pieces an object is read in over HTTP, each copied into the object's buffer while it is still in the
# CPU's cache: 256 KiB and 1 MiB read alike; 4 MiB, 16 MiB and one object-sized piece were slower.
_READ_PIECE = 1 << 20

# The settings obstore takes as `client_options` (timeouts, plain HTTP ...), not as the store's `config`.
_CLIENT_KEYS = frozenset("""allow_http allow_invalid_certificates connect_timeout default_content_type
    default_headers http1_only http2_keep_alive_interval http2_keep_alive_timeout http2_keep_alive_while_idle
    http2_only pool_idle_timeout pool_max_idle_per_host proxy_url proxy_ca_certificate proxy_excludes
    root_certificate randomize_addresses read_timeout timeout user_agent""".split())


def _store_kwargs(url: str, options: Mapping[str, Any], *, create: bool = True) -> dict:
    """`from_url`'s keyword arguments for `options`: client settings apart from the store's config;
    with `create`, a ``file://`` folder that is missing is made."""
    config = {k: v for k, v in options.items() if k not in _CLIENT_KEYS}
    client = {k: v for k, v in options.items() if k in _CLIENT_KEYS}
    kwargs: dict = {"config": config} if config else {}
    if client:
        # Client settings given replace those the client reads from the environment: keep plain HTTP.
        if url.startswith("s3://") and "allow_http" not in client and os.environ.get("AWS_ALLOW_HTTP"):
            client["allow_http"] = os.environ["AWS_ALLOW_HTTP"].strip().lower() == "true"
        kwargs["client_options"] = client
    if url.startswith("file://") and create:
        kwargs["mkdir"] = True
    return kwargs


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_MAX_URL = 8192  # characters: a bucket, a prefix of S3's longest key (1024 bytes) and room to spare


def is_url(text: str) -> bool:
    """Whether `text` is a URL (``scheme://...``) rather than a plain path."""
    return bool(_SCHEME.match(text))


def remote_url(text: str) -> str:
    """`text` as a URL the client takes: a URL as it is; a plain path (``../team-remote``, ``/data/r``,
    ``~/r``) as the ``file://`` URL of that folder, made absolute against the working directory now.

    Raises:
        RemoteError: `text` is empty, a URL that does not parse (``http://[::1``) or is longer than 8192
            characters, or ``file://`` without a path: none names a place, and none becomes the working folder
            or ``/`` by accident.
    """
    if not text.strip():
        raise RemoteError("an empty remote URL names no place: give a URL (s3://bucket/prefix, file:///folder) "
                          "or a folder's path")
    if not is_url(text):
        return pathlib.Path(os.path.expanduser(text)).resolve().as_uri()
    shown = repr(redact(text[:200]) + ("..." if len(text) > 200 else ""))
    if len(text) > _MAX_URL:  # the HTTP client panics on a request URI past 64 KiB, which no server takes
        raise RemoteError(f"the remote URL {shown} is {len(text)} characters long, past the {_MAX_URL} a remote URL "
                          "may have: check it")
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 (read to check it: a port past 65535 or no number raises here)
    except ValueError as exc:  # an unclosed IPv6 bracket, a port that is no number ...
        raise RemoteError(f"malformed remote URL {shown} ({exc}): check it") from None
    if parts.scheme.lower() == "file" and not parts.path:
        raise RemoteError(f"the remote URL {shown} names no folder: write file:///absolute/folder, or the folder's "
                          "path")
    return text


def _local_folder(url: str) -> str:
    """The folder a ``file://`` URL names."""
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path)


def _announced_body(result: Any, size: int) -> Tuple[Any, int]:
    """(the body in a new buffer of its own, how many bytes the server sent), streamed and counted.

    The buffer (`owned_buffer`: writable, the caller's to keep) has the announced size and is filled
    piece by piece as the pieces arrive; a piece that would pass the end stops the read there, so a
    longer body costs at most one more piece (memory: the size plus a piece). The stream (and its
    connection) is let go of when this returns.
    """
    body = owned_buffer(size)
    into = memoryview(body)
    sent = 0
    for piece in result.stream(min_chunk_size=_READ_PIECE):
        ends = sent + len(piece)
        if ends > size:
            return body, ends
        into[sent:ends] = piece
        sent = ends
    return body, sent


def _client_message(exc: BaseException) -> str:
    # obstore appends a multi-line debug dump of its error; the first line says what happened.
    return redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)[:300]


_NO_BUCKET = "<Code>NoSuchBucket</Code>"  # in a 404's body: the bucket, not the object, is missing
# The S3 error codes that mean the credentials were refused (401 / 403 replies).
_REFUSED = re.compile(r"<Code>(InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|ExpiredToken|InvalidToken|"
                      r"InvalidClientTokenId|AuthorizationHeaderMalformed)</Code>")
# A request signed for another region than the bucket's: AWS's 400 names the bucket's region.
_WRONG_REGION = re.compile(r"<Code>AuthorizationHeaderMalformed</Code>.*?<Region>([A-Za-z0-9-]{1,64})</Region>", re.S)
_ENDPOINT = re.compile(r"\b(https?://[^/\s]+)")
# What a failed connection says, most telling first.
_CONNECT_REASONS = ("Connection refused", "Name or service not known", "dns error", "No route to host",
                    "Network is unreachable", "timed out", "tcp connect error")


def _classified(message: str, exc: BaseException) -> RemoteError:
    """The typed `RemoteError` a client's failure is, with what to do about it: the one place where
    obstore's errors are read for their cause (docs/sharing.md, "When the object store refuses").

    `message` says what failed (redacted); the client's whole text (its debug dump, holding the
    server's reply) is read here for the cause and never shown.
    """
    text = str(exc)
    first = _client_message(exc)
    found = _ENDPOINT.search(first)
    endpoint = redact(found.group(1)) if found else "the endpoint"
    if "BadScheme" in text or ("builder error" in first and endpoint.startswith("http://")):
        return RemotePlainHttpError(f"{message}: {endpoint} is plain HTTP, which the client refuses by default; "
                                    "set AWS_ALLOW_HTTP=true to use an http:// endpoint, or give its https:// address")
    if _NO_BUCKET in text:
        return RemoteMissingError(f"{message}: the bucket does not exist at {endpoint}; check the bucket in the URL "
                                  "and the endpoint (AWS_ENDPOINT_URL), or create the bucket")
    region = _WRONG_REGION.search(text)
    if region:
        signed = re.search(r"the region '([^'<>\s]{1,64})' is wrong", text)
        asked = f", not {signed.group(1)}, which the request was signed for" if signed else ""
        return RemoteRegionError(f"{message}: the bucket is in region {region.group(1)}{asked}; set "
                                 f"AWS_REGION={region.group(1)} in the environment of the commands that use "
                                 "this remote")
    refused = _REFUSED.search(text)
    if refused or type(exc).__name__ in ("PermissionDeniedError", "UnauthenticatedError"):
        why = refused.group(1) if refused else type(exc).__name__
        return RemoteCredentialsError(
            f"{message}: {endpoint} refused the credentials ({why}); check AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, ~/.aws/credentials) for this endpoint: stepjournal takes "
            "credentials from the client's environment and config files only")
    reason = next((r for r in _CONNECT_REASONS if r in text), None)
    if reason and ("kind: Connect" in text or "error sending request" in first):
        return RemoteUnreachableError(f"{message}: cannot connect to {endpoint} ({reason}); check the "
                                      "endpoint (AWS_ENDPOINT_URL, the URL's host) and that the server is up and "
                                      "reachable from here")
    return RemoteError(f"{message}: {first}")


class _TooManyKeys(RemoteError):
    """A listing named more keys than its caller reads (`Remote.keys`)."""


class Remote:
    """A prefix of an object store, through obstore: bounded reads, typed errors, no credentials shown.

    Args:
        url: ``s3://bucket/prefix``, ``gs://``, ``az://``, ``file:///path`` or ``memory://``.
        options: client settings passed to obstore, beside what the environment gives: the store's
            ``config`` (endpoint, region ...) and its HTTP client's (``timeout``, ``read_timeout``,
            ``connect_timeout``, ``allow_http`` ...: `_CLIENT_KEYS`); keep credentials in the environment.
        create: whether a ``file://`` folder that is missing is made (a writer's remote). A reader
            passes False: it never creates anything on the remote, and a missing folder is a `RemoteError`.
    """

    def __init__(self, url: str, *, options: Optional[Mapping[str, Any]] = None, create: bool = True) -> None:
        try:
            import obstore
            from obstore.store import from_url
        except ImportError:
            raise RemoteError('object storage needs obstore: pip install "obstore>=0.12,<0.13"') from None
        self._obstore = obstore
        url = remote_url(url)
        self.url = public_url(url)
        # No HTTP framing can disagree with the size a local file or a memory store announces.
        self._one_call = url.startswith(("file://", "memory://"))
        kwargs = _store_kwargs(url, options or {}, create=create)
        if not create and url.startswith("file://") and not os.path.isdir(_local_folder(url)):
            raise RemoteMissingError(f"no stepjournal remote at {self.url}: that folder does not exist; check the "
                                     "URL (a pull or clone creates nothing there), or push to it first")
        try:
            self._store = from_url(url, retry_config={"max_retries": 2}, **kwargs)
        except BaseException as exc:  # obstore raises several unrelated types on a bad URL or config
            if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                raise  # KeyboardInterrupt, SystemExit; a Rust panic (an unknown setting) is a bad config
            raise RemoteError(f"cannot open the object store {self.url!r}: {_client_message(exc)}") from None

    def _fail(self, what: str, key: str, exc: BaseException) -> RemoteError:
        return _classified(f"{what} {self.url}/{key} failed", exc)

    def put(self, key: str, data: Any, *, create: bool = False) -> bool:
        """Write one object in one PUT; with `create`, only when absent (returns False when it was there)."""
        mode: Literal["create", "overwrite"] = "create" if create else "overwrite"
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

        path = os.path.join(_local_folder(self.url), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RemoteConflictError(
                    f"another push holds {self.url}/{name}; run this push again when it ends") from None
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
        """`get`, as the buffer the object was read into (no copy of a payload's bytes): over HTTP a
        writable one of its own (`owned_buffer`), the caller's to keep; from a local folder or memory
        the client's read-only one."""
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
        except Exception as exc:
            # A missing bucket is a not-found too (on S3, the reply's code tells it from a missing object).
            if isinstance(exc, (FileNotFoundError, self._obstore.exceptions.NotFoundError)) and (
                    _NO_BUCKET not in str(exc)):
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

    def keys(self, prefix: str, *, most: Optional[int] = None) -> List[str]:
        """Every key under `prefix` (relative to the remote's own prefix), sorted.

        Raises:
            RemoteError: the listing failed, or names more than `most` keys (the pages past that are
                not read: a remote someone filled with keys costs no more memory than `most` of them).
        """
        found: List[str] = []
        try:
            for batch in self._obstore.list(self._store, prefix):
                found.extend(meta["path"] for meta in batch)
                if most is not None and len(found) > most:
                    raise _TooManyKeys(f"{self.url}/{prefix} lists more than {most} objects, more than stepjournal "
                                       "reads there: not a remote it wrote, or one to split into several URLs")
        except RemoteError:
            raise
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._fail("listing", prefix, exc) from None
        return sorted(found)

    def few_keys(self, prefix: str, most: int) -> Optional[Set[str]]:
        """Every key under `prefix` when there are at most `most` (the listing's pages past that are not read),
        else None.

        Raises:
            RemoteError: the listing failed.
        """
        try:
            return set(self.keys(prefix, most=most))
        except _TooManyKeys:
            return None
