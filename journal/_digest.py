"""Content digests of payloads: BLAKE3, 256 bits, in one place."""

from __future__ import annotations

import blake3

__all__ = ["DIGEST_NAME", "DIGEST_SIZE", "digest_bytes", "digest_hex"]

DIGEST_NAME = "blake3"
DIGEST_SIZE = 32
# Hashing a payload of tens of MB is on the record and replay paths; BLAKE3 spreads it over cores.
_THREADS_FROM = 1 << 22


def digest_bytes(data) -> bytes:
    """Return the 32-byte BLAKE3 digest of a bytes-like object (no copy is made)."""
    view = memoryview(data)
    threads = blake3.blake3.AUTO if view.nbytes >= _THREADS_FROM else 1
    return blake3.blake3(view, max_threads=threads).digest()


def digest_hex(data) -> str:
    """Return the digest of `data` as lowercase hex."""
    return digest_bytes(data).hex()
