"""Content digests of payloads: BLAKE3, 256 bits, in one place."""

from __future__ import annotations

import os
import threading
from typing import Callable, Optional

import blake3

__all__ = ["DIGEST_SIZE", "DigestInBackground", "digest_bytes", "digest_hex", "digest_pieces"]

DIGEST_SIZE = 32
# Hashing a payload of tens of MB is on the record and replay paths; BLAKE3 spreads it over cores.
_THREADS_FROM = 1 << 22
# BLAKE3's threads are a pool made at the first large digest; a fork child has none of them, and a digest that
# hands them work waits forever (a DataLoader worker recording a payload file). A fork child hashes on its own
# thread.
_POOL = {"usable": True}
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _POOL.update(usable=False))


def _threads(nbytes: int) -> int:
    return blake3.blake3.AUTO if nbytes >= _THREADS_FROM and _POOL["usable"] else 1


# Piece size when the caller wants to hear about each hashed piece (big enough for BLAKE3's threads).
_CHUNK = 1 << 24


def digest_bytes(data, *, after_chunk: Optional[Callable[[int, int], None]] = None, one_thread: bool = False) -> bytes:
    """Return the 32-byte BLAKE3 digest of a bytes-like object (no copy is made).

    Args:
        data: the bytes.
        after_chunk: called as ``after_chunk(start, stop)`` once each 16 MiB piece has been hashed, in
            order; the journal uses it to unmap the pages of an LMDB value as soon as they are hashed.
        one_thread: hash on the calling thread only, for a caller that already hashes one value per core.
    """
    view = memoryview(data)
    threads = 1 if one_thread else _threads(view.nbytes)
    if after_chunk is None:
        return blake3.blake3(view, max_threads=threads).digest()
    view = view.cast("B")
    hasher = blake3.blake3(max_threads=threads)
    for start in range(0, view.nbytes, _CHUNK):
        stop = min(start + _CHUNK, view.nbytes)
        hasher.update(view[start:stop])
        after_chunk(start, stop)
    return hasher.digest()


def digest_pieces(pieces) -> bytes:
    """The digest of the bytes of `pieces` (bytes-like values) one after another, none copied or joined."""
    views = [memoryview(p).cast("B") for p in pieces]
    threads = _threads(sum(v.nbytes for v in views))
    hasher = blake3.blake3(max_threads=threads)
    for view in views:
        hasher.update(view)
    return hasher.digest()


def digest_hex(data) -> str:
    """Return the digest of `data` as lowercase hex."""
    return digest_bytes(data).hex()


class DigestInBackground:
    """The digest of `data`, computed on a worker thread while the caller reads the same bytes.

    BLAKE3 and numpy's copies both release the GIL, so a replay can hash and decode a large payload
    at the same time instead of one after the other. Call `result()` before `data` goes away (an LMDB
    view dies with its transaction): it waits for the worker.
    """

    def __init__(self, data, *, after_chunk: Optional[Callable[[int, int], None]] = None) -> None:
        self._digest: Optional[bytes] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(
            target=self._run, args=(data, after_chunk), name="stepjournal-digest", daemon=True
        )
        self._thread.start()

    def _run(self, data, after_chunk) -> None:
        try:
            self._digest = digest_bytes(data, after_chunk=after_chunk)
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def result(self) -> bytes:
        """Wait for the worker and return the 32-byte digest (or raise what it raised)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._digest is not None
        return self._digest
