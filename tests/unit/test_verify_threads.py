"""`verify` checks large payloads side by side on threads, and finds exactly what it finds one at a time.

Decompressing and hashing release the GIL, so `LmdbPayloadStore.check_many` checks a batch of values
of a MiB or more on up to four threads. What it reports must not depend on that: the damaged
payloads, in digest order, with their steps, and nothing for the whole ones.
"""

from __future__ import annotations

import threading

import pytest
import torch

import stepjournal.payloads._payload_store as payload_store  # private: the store's internals
from stepjournal import Journal

import stepjournal.payloads._file_store as file_store  # private: the file store's layout
from stepjournal.payloads._payload_store import FILE_FROM  # private: the store's internals
from lmdb_raw import flip_payload_byte


def _batch(step: int, floats: int) -> dict:
    generator = torch.Generator().manual_seed(step)
    return {"logits": torch.randn(floats, generator=generator), "ids": torch.arange(step, step + 1000)}


@pytest.mark.parametrize("where", ["files", "lmdb"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_damaged_large_payloads_are_found_in_digest_order_when_checked_on_threads(tmp_path, monkeypatch, request,
                                                                                  compression, where):
    """As payload files, and in LMDB (a journal made before payload files)."""
    if where == "lmdb":
        request.getfixturevalue("lmdb_payloads")
    path = str(tmp_path / "journal")
    floats = 600_000 if where == "lmdb" else FILE_FROM // 3  # 2.4 MB, or over FILE_FROM even as a zstd frame
    with Journal(path, compression=compression) as journal:
        for step in range(1, 9):
            journal.record(step, _batch(step, floats))
        digests = {journal.lookup(step).event.output.digest: step for step in range(1, 9)}
    damaged = sorted(digests)[1::3]  # three of the eight, spread over the digest order
    for digest in damaged:
        flip_payload_byte(path, bytes.fromhex(digest), offset=4096)

    threads, calls = set(), []
    real = payload_store.stored_digest if where == "lmdb" else file_store.stored_digest_read
    # The first two checks meet here before either goes on: they run side by side on two threads, however
    # the scheduler of a loaded machine orders them (a pool that checked one at a time would time out).
    side_by_side = threading.Barrier(2, timeout=120)
    lock = threading.Lock()

    def spied(*args, **kwargs):
        threads.add(threading.current_thread().name)
        with lock:
            calls.append(None)
            first_two = len(calls) <= 2
        if first_two:
            side_by_side.wait()
        return real(*args, **kwargs)

    if where == "lmdb":
        monkeypatch.setattr(payload_store, "stored_digest", spied)
    else:
        monkeypatch.setattr(file_store, "stored_digest_read", spied)
    with Journal(path, readonly=True) as journal:
        problems = journal.verify()
    assert [(p.kind, p.where, p.steps) for p in problems] == [("payload", d, (digests[d],)) for d in damaged]
    assert all(name.startswith("stepjournal-check") for name in threads) and len(threads) >= 2
