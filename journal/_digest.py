"""Content digests of payloads: BLAKE3, 256 bits, in one place."""

from __future__ import annotations

from typing import Callable, Optional

import blake3

__all__ = ["DIGEST_NAME", "DIGEST_SIZE", "digest_bytes", "digest_hex"]

DIGEST_NAME = "blake3"
DIGEST_SIZE = 32
# Hashing a payload of tens of MB is on the record and replay paths; BLAKE3 spreads it over cores.
_THREADS_FROM = 1 << 22


# Piece size when the caller wants to hear about each hashed piece (big enough for BLAKE3's threads).
_CHUNK = 1 << 24


def digest_bytes(data, *, after_chunk: Optional[Callable[[int, int], None]] = None) -> bytes:
    """Return the 32-byte BLAKE3 digest of a bytes-like object (no copy is made).

    Args:
        data: the bytes.
        after_chunk: called as ``after_chunk(start, stop)`` once each 16 MiB piece has been hashed, in
            order; the journal uses it to unmap the pages of an LMDB value as soon as they are hashed.
    """
    view = memoryview(data)
    threads = blake3.blake3.AUTO if view.nbytes >= _THREADS_FROM else 1
    if after_chunk is None:
        return blake3.blake3(view, max_threads=threads).digest()
    view = view.cast("B")
    hasher = blake3.blake3(max_threads=threads)
    for start in range(0, view.nbytes, _CHUNK):
        stop = min(start + _CHUNK, view.nbytes)
        hasher.update(view[start:stop])
        after_chunk(start, stop)
    return hasher.digest()


def digest_hex(data) -> str:
    """Return the digest of `data` as lowercase hex."""
    return digest_bytes(data).hex()
