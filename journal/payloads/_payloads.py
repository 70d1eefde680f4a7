"""The payload pipeline: encode -> digest -> compress (only when the payload is stored) -> unwrap.

A payload is named by the BLAKE3 digest of its *encoded* bytes (see `_codec`), so compressing it or
not never changes its name. Compression runs lazily, the first time the stored form (`blob`) or the
`PayloadRef` an event will carry is asked for: the input of a call that is replayed only needs its
digest, and is never compressed.

Nothing here reads or writes a store; `_payload_store` holds the stores, `_journal` the sequence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional

import attrs
import blake3
import zstandard

from ..base._digest import DIGEST_SIZE, DigestInBackground, digest_bytes, digest_pieces
from ..base._errors import IntegrityError, JournalError, PayloadDecodeError
from ..events._events import PayloadRef
from ..base._pages import HandedOver, ReleaseBehind
from ._payload_magic import PAYLOAD_MAGIC

if TYPE_CHECKING:  # the codec imports torch: a verb that reads no payload never loads it
    from ._codec import CodecRegistry

__all__ = [
    "COMPRESSIONS",
    "PreparedPayload",
    "prepare_payload",
    "digest_key",
    "unwrap",
    "blob_intact",
    "stored_digest",
    "own_nbytes",
    "MAX_PAYLOAD_NBYTES",
    "MAX_ORPHAN_NBYTES",
    "stored_bound",
    "stored_size",
    "joined",
    "stored_digest_read",
    "decode_verified",
]

COMPRESSIONS = (None, "zstd")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# The largest payload an event may declare (64 GiB): a stored frame never unwraps to more.
MAX_PAYLOAD_NBYTES = 1 << 36
# What a payload no readable event names may unwrap to (1 GiB): `verify` checks orphans this far.
MAX_ORPHAN_NBYTES = 1 << 30
# Frames claiming more than this are decompressed in pieces of `_STREAM_CHUNK`.
_STREAM_FROM = 1 << 26
_STREAM_CHUNK = 1 << 22
# The longest zstd frame header: what `zstandard.frame_content_size` needs to read the size a frame claims.
_ZSTD_HEADER_MAX = 18
# A payload's pieces under this size are joined into one bytes as it is prepared (a copy of a few KiB costs
# less than carrying a list of pieces through the store); from it up, they are stored as they are.
_JOIN_BELOW = 1 << 16
# Payloads from this size up are hashed on a worker thread while they are decoded.
_HASH_BESIDE_DECODE_FROM = 1 << 22


@attrs.frozen(eq=False)
class PreparedPayload:
    """A value already encoded and hashed for storage: `Journal.prepare`'s result.

    Pass it to `Journal.record` as `output` or `input` to skip encoding twice. `digest` (hex) names
    the value's content and costs nothing more; `ref` (the `PayloadRef` an event carries) and `blob`
    (the bytes as stored) compress the value on first use when the journal compresses.

    Attributes:
        digest: the BLAKE3 digest of the encoded value, as hex.
        key: the same digest as 32 bytes (the payload store's key).
        nbytes: the size of the encoded value.
        compression: ``"zstd"`` or None: how `blob` is stored.
    """

    digest: str
    key: bytes = attrs.field(repr=False)
    nbytes: int
    compression: Optional[str]
    _raw: Any = attrs.field(repr=False, alias="raw")
    _packed: List[Any] = attrs.field(factory=list, repr=False, alias="packed")

    @property
    def storable(self) -> bool:
        """False when prepared with ``store=False``: only the digest is known."""
        return self._raw is not None or bool(self._packed)

    @property
    def blob(self) -> Any:
        """The bytes as stored: the encoding, or a zstd frame of it (compressed once, on first use). A
        payload prepared with ``copy=False`` gives the encoding's pieces (a list, see `joined`)."""
        if not self._packed:
            if self._raw is None:
                raise JournalError(
                    f"payload {self.digest[:16]}… was prepared with store=False (digest only); "
                    "prepare it with store=True to record it"
                )
            blob = self._raw
            if self.compression == "zstd":
                blob = zstandard.ZstdCompressor(level=3, threads=-1).compress(joined(self._raw))
            self._packed.append(blob)
        return self._packed[0]

    @property
    def ref(self) -> PayloadRef:
        """The `PayloadRef` an event stores for this payload (compresses it first, when compressing)."""
        return PayloadRef(
            digest=self.digest, nbytes=self.nbytes, stored_nbytes=stored_size(self.blob), compression=self.compression
        )


def prepare_payload(
    value: Any, *, registry: Optional[CodecRegistry], compression: Optional[str], store: bool = True,
    copy: bool = True, stage: Optional[Callable[[Any], Any]] = None,
) -> PreparedPayload:
    """Encode and hash `value`; keep the encoding for storage unless `store` is False.

    `copy` False (and no compression): the encoding is kept as its pieces, the tensors' and arrays' own
    memory where they are laid out in C order (`encode_payload_parts`), so storing it copies nothing
    more; the value must not change until it is stored. `stage` (with `copy` False): the payload
    store's `stage`, which starts writing the pieces while they are hashed (a large payload's file;
    None from it: nothing staged); the staged file is tied to the returned payload.

    Raises:
        UnsupportedValueError: the value (or a part of it, named by its path) cannot be stored.
    """
    if not copy and store and compression is None:
        from ._codec import encode_payload_parts

        pieces = encode_payload_parts(value, registry=registry)
        staged = stage(pieces) if stage is not None else None
        if staged is None and len(pieces) > 1 and stored_size(pieces) < _JOIN_BELOW:
            pieces = [b"".join([memoryview(piece).cast("B") for piece in pieces])]
        if staged is None and len(pieces) == 1:  # one piece: kept as bytes, not a list (each later step is cheaper)
            raw = pieces[0]
            key = digest_bytes(raw)
            return PreparedPayload(key.hex(), key, memoryview(raw).nbytes, None, raw=raw)
        try:
            key = digest_pieces(pieces)  # while the staged file is written, on its own thread
        except BaseException:
            if staged is not None:
                staged.discard()
            raise
        prepared = PreparedPayload(key.hex(), key, stored_size(pieces), None, raw=pieces)
        if staged is not None:
            staged.named(key, prepared)
        return prepared
    # A numpy buffer, not a bytearray: no zero-fill of fresh 4 KiB pages before the copy (see _codec).
    from ._codec import encode_payload_array

    raw = encode_payload_array(value, registry=registry)
    key = digest_bytes(raw)
    return PreparedPayload(key.hex(), key, len(raw), compression, raw=raw if store else None)


def digest_key(digest: str, step: Optional[int] = None) -> bytes:
    """The 32-byte store key of a hex digest; a malformed digest raises `IntegrityError`."""
    try:
        key = bytes.fromhex(digest)
    except (ValueError, TypeError):
        key = b""
    if len(key) != DIGEST_SIZE:
        raise IntegrityError(f"payload digest {digest!r} is malformed", step=step)
    return key


def _limit(nbytes: Optional[int]) -> int:
    """The most bytes a stored blob may unwrap to: never more than what no attacker chooses."""
    if nbytes is None:
        return MAX_ORPHAN_NBYTES
    return min(max(nbytes, 0), MAX_PAYLOAD_NBYTES)


def _zstd_claim(blob: Any, digest: str, step: Optional[int], limit: int) -> int:
    """The size a zstd frame claims, refused when unknown or over `limit` (before any allocation)."""
    try:
        claimed = zstandard.frame_content_size(blob)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"payload {digest[:16]}… does not decompress: {exc}", step=step) from None
    if claimed < 0 or claimed > limit:
        raise IntegrityError(
            f"payload {digest[:16]}… claims {claimed} bytes, expected at most {limit}", step=step
        )
    return claimed


def _zstd_chunks(blob: Any, digest: str, step: Optional[int], claimed: int) -> Iterator[bytes]:
    """The decompressed pieces of a zstd frame, stopping as soon as they pass `claimed` bytes."""
    produced = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(blob, read_size=_STREAM_CHUNK)
        while True:
            chunk = reader.read(_STREAM_CHUNK)
            if not chunk:
                break
            produced += len(chunk)
            if produced > claimed:
                raise IntegrityError(
                    f"payload {digest[:16]}… decompresses past the {claimed} bytes it claims", step=step
                )
            yield chunk
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"payload {digest[:16]}… does not decompress: {exc}", step=step) from None
    if produced != claimed:
        raise IntegrityError(
            f"payload {digest[:16]}… decompresses to {produced} bytes, not the {claimed} it claims", step=step
        )


def unwrap(blob: Any, digest: str, step: Optional[int], nbytes: Optional[int]) -> Any:
    """The encoded payload bytes of a stored blob: decompressed when zstd, else the blob itself (no copy).

    `nbytes` is the size the event promised, capped at `MAX_PAYLOAD_NBYTES` (`MAX_ORPHAN_NBYTES` when
    no event names the payload). A frame claiming more is refused before any allocation, and a large
    frame is decompressed in pieces, so memory follows what it really holds, never what it claims.
    """
    head = bytes(blob[:4])
    if head == ZSTD_MAGIC:
        claimed = _zstd_claim(blob, digest, step, _limit(nbytes))
        try:
            if claimed <= _STREAM_FROM:
                return zstandard.ZstdDecompressor().decompress(blob, max_output_size=claimed)
            out = bytearray()
            for chunk in _zstd_chunks(blob, digest, step, claimed):
                out += chunk
            return out
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"payload {digest[:16]}… does not decompress: {exc}", step=step) from None
        except MemoryError:
            raise PayloadDecodeError(
                f"payload {digest[:16]}… needs {claimed} bytes of memory to decompress, which are not there",
                step=step,
            ) from None
    if head != PAYLOAD_MAGIC[:4]:
        raise IntegrityError(f"payload {digest[:16]}… is neither a payload nor a zstd frame", step=step)
    return blob


def stored_digest(
    blob: Any, digest: str, step: Optional[int], nbytes: Optional[int],
    release: Optional[Callable[[int, int], None]] = None,
    *, one_thread: bool = False,
) -> bytes:
    """The digest of what a stored blob unwraps to, in bounded memory (a zstd frame is streamed);
    `one_thread`: BLAKE3 on the calling thread only (see `digest_bytes`).

    Raises:
        IntegrityError: the blob is neither form, or its frame claims more than `unwrap` allows.
    """
    head = bytes(blob[:4])
    if head != ZSTD_MAGIC:
        if head != PAYLOAD_MAGIC[:4]:
            raise IntegrityError(f"payload {digest[:16]}… is neither a payload nor a zstd frame", step=step)
        return digest_bytes(blob, after_chunk=release, one_thread=one_thread)
    claimed = _zstd_claim(blob, digest, step, _limit(nbytes))
    hasher = blake3.blake3(max_threads=1 if one_thread else blake3.blake3.AUTO)
    for chunk in _zstd_chunks(blob, digest, step, claimed):
        hasher.update(chunk)
    return hasher.digest()


def stored_digest_read(read: Callable[[int], bytes], digest: str, nbytes: Optional[int], *,
                       one_thread: bool = False) -> bytes:
    """`stored_digest` of a stored blob read in pieces through ``read(size)`` (a file's ``read``), in bounded
    memory: a zstd frame is streamed through the decompressor, the encoding hashed as it comes.

    `one_thread`: BLAKE3 on the calling thread only.

    Raises:
        IntegrityError: the blob is neither form, or its frame claims more than `unwrap` allows.
    """
    head = read(_ZSTD_HEADER_MAX)
    if head[:4] == ZSTD_MAGIC:
        claimed = _zstd_claim(head, digest, None, _limit(nbytes))
        hasher = blake3.blake3(max_threads=1 if one_thread else blake3.blake3.AUTO)
        for chunk in _zstd_chunks(_Prefixed(head, read), digest, None, claimed):
            hasher.update(chunk)
        return hasher.digest()
    if head[:4] != PAYLOAD_MAGIC[:4]:
        raise IntegrityError(f"payload {digest[:16]}… is neither a payload nor a zstd frame")
    hasher = blake3.blake3(max_threads=1 if one_thread else blake3.blake3.AUTO)
    chunk = head
    while chunk:
        hasher.update(chunk)
        chunk = read(_STREAM_CHUNK)
    return hasher.digest()


class _Prefixed:
    """A reader that gives `head` (already read) first, then what ``read`` gives."""

    def __init__(self, head: bytes, read: Callable[[int], bytes]) -> None:
        self._head, self._read = head, read

    def read(self, size: int = -1) -> bytes:
        if self._head:
            head, self._head = self._head[:size] if size >= 0 else self._head, self._head[size:] if size >= 0 else b""
            return head
        return self._read(size)


def stored_size(blob: Any) -> int:
    """The size of a stored form: a bytes-like value, or a list of pieces (`prepare_payload`'s ``copy=False``)."""
    if isinstance(blob, list):
        return sum(memoryview(piece).nbytes for piece in blob)
    return memoryview(blob).nbytes


def joined(blob: Any) -> Any:
    """A stored form as one bytes-like value (pieces are joined into one new buffer; anything else as it is)."""
    if not isinstance(blob, list):
        return blob
    import numpy as np  # here: a verb that stores nothing does not load it

    out = np.empty(stored_size(blob), dtype=np.uint8)
    at = 0
    for piece in blob:
        view = memoryview(piece).cast("B")
        out[at:at + view.nbytes] = np.frombuffer(view, dtype=np.uint8)
        at += view.nbytes
    return out


def stored_bound(nbytes: Optional[int]) -> int:
    """The most bytes a stored blob may hold for a payload of `nbytes` encoded bytes.

    A zstd frame of incompressible data is a little larger than the data; nothing honest is larger.
    """
    limit = _limit(nbytes)
    return limit + (limit >> 7) + 4096


def blob_intact(blob: Any, key: bytes, nbytes: Optional[int] = None) -> bool:
    """True when a stored blob unwraps to bytes whose digest is `key` (checked in bounded memory)."""
    try:
        return stored_digest(blob, key.hex(), None, nbytes) == key
    except IntegrityError:
        return False


def own_nbytes(blob: Any) -> int:
    """The encoded size of a blob this process just prepared (its own zstd frame says it)."""
    if bytes(blob[:4]) == ZSTD_MAGIC:
        return zstandard.frame_content_size(blob)
    return len(blob)


def decode_verified(
    raw: Any,
    key: bytes,
    *,
    registry: Optional[CodecRegistry],
    release: Optional[Callable[[int, int], None]],
    where: str,
    step: Optional[int],
) -> Any:
    """Decode encoded payload bytes, returning nothing unless their digest is `key`.

    `release(start, stop)` (from the store) is told which bytes both the digest and the decoder are
    done with, so a memory-mapped store can let go of those pages during the read. A `HandedOver`
    release means `raw` is the reader's to keep: tensors are views of it, not copies.
    """
    from ._codec import decode_payload_releasing

    adopt = isinstance(release, HandedOver)
    if adopt:
        release = None
    digest = key.hex()
    mismatch = IntegrityError(
        f"payload {digest[:16]}…{where} does not match its digest: the journal is damaged",
        step=step,
        detail="digest mismatch",
    )
    try:
        # A handed-over buffer is decoded into views, not copied: there is no copy to hash beside.
        if adopt or len(raw) < _HASH_BESIDE_DECODE_FROM:
            if digest_bytes(raw, after_chunk=release) != key:
                raise mismatch
            # Decoding copies every tensor out of the store's buffer before it goes away (unless handed over).
            return decode_payload_releasing(raw, registry=registry, release=release, adopt=adopt)
        # A large payload is hashed on a worker thread while this one decodes (copies) it: the two
        # took about as long as each other, one after the other. Nothing decoded is returned unless
        # the digest matches, and a damaged payload reports the mismatch first.
        behind = ReleaseBehind(release, 2) if release is not None else None
        hashing = DigestInBackground(raw, after_chunk=behind.reader(0) if behind else None)
        try:
            value = decode_payload_releasing(raw, registry=registry, release=behind.reader(1) if behind else None)
        except BaseException:
            if hashing.result() != key:
                raise mismatch from None
            raise
        if hashing.result() != key:
            raise mismatch
        return value
    except PayloadDecodeError as exc:
        raise type(exc)(f"{exc}{where}", step=step) from None
