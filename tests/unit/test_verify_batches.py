"""`verify` checks payloads in batches, several at once: the same problems, in the same order, and
progress in bytes."""

from __future__ import annotations

import lmdb
import numpy as np
import torch

from stepjournal import Journal
from stepjournal.errors import IntegrityError


def _damage(path: str, digests: list) -> None:
    """Flip the last byte of each payload stored under `digests` (the journal closed)."""
    env = lmdb.open(path, max_dbs=16, subdir=True, map_size=1 << 30)
    try:
        with env.begin(write=True, db=env.open_db(b"payloads")) as txn:
            for digest in digests:
                value = bytearray(txn.get(digest))
                value[-1] ^= 0xFF
                txn.put(digest, bytes(value))
    finally:
        env.close()


def test_damaged_payloads_among_several_batches_are_reported_as_one_by_one_checks_report_them(tmp_path):
    path = str(tmp_path / "journal")
    rng = np.random.default_rng(1)
    with Journal(path, run="v", sync=False) as journal:
        for step in range(1, 301):  # more than one batch of small payloads
            journal.record(step, {"x": torch.from_numpy(rng.integers(0, 255, 3000, dtype=np.uint8))})
        journal.record(301, {"big": torch.from_numpy(rng.integers(0, 255, 5 << 20, dtype=np.uint8))})
        digests = list(journal._payloads.digests())
    _damage(path, [digests[3], digests[150], digests[299]])
    with Journal(path, readonly=True) as journal:
        problems = journal.verify()
        expected = []
        for digest in journal._payloads.digests():  # what the one-by-one check says, in digest order
            try:
                journal._payloads.check(digest)
            except IntegrityError as exc:
                expected.append((digest.hex(), exc.detail))
    assert len(expected) == 3
    assert [(p.kind, p.where) for p in problems] == [("payload", hexd) for hexd, _ in expected]
    assert all(p.detail == "bytes do not match the digest" and len(p.steps) == 1 for p in problems)


def test_progress_counts_the_bytes_checked_up_to_every_stored_byte(tmp_path):
    path = str(tmp_path / "journal")
    with Journal(path, run="v") as journal:
        stored = [journal.record(step, {"x": torch.full((size,), step, dtype=torch.uint8)}).event.output.stored_nbytes
                  for step, size in ((1, 100), (2, 5 << 20), (3, 70_000))]
    seen = []
    with Journal(path, readonly=True) as journal:
        assert journal.verify(progress=lambda done, total: seen.append((done, total))) == []
    done = [d for d, _ in seen]
    assert done == sorted(done) and seen[-1][0] == seen[-1][1] >= sum(stored)
    assert seen[-1][1] - sum(stored) < 10_000  # the rest is the events' own bytes
