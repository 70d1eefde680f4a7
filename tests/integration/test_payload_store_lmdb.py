"""The LMDB payload store passes the payload-store conformance suite, and keeps payloads atomic with events."""

from __future__ import annotations

import lmdb
import pytest
import torch

from stepjournal.testing import PayloadStoreConformance
from stepjournal.testing import payload_of as payload
from stepjournal import Journal
from stepjournal.payloads import LmdbPayloadStore


class TestLmdbPayloadStore(PayloadStoreConformance):
    def make_store(self, tmp_path):
        with Journal(str(tmp_path / "journal"), session=False) as journal:
            store = journal.payload_store
            assert isinstance(store, LmdbPayloadStore)
            yield store

    def damage(self, store, digest):
        lmdb_store = store._store

        def flip(txn):
            value = bytearray(txn.get(digest, db=lmdb_store.db("payloads")))
            value[-1] ^= 0xFF
            txn.put(digest, bytes(value), db=lmdb_store.db("payloads"))

        lmdb_store.write(flip)

    def event_writer(self, store, fail):
        lmdb_store = store._store

        def write_events(in_txn):
            def fn(txn):
                if in_txn is not None:
                    in_txn(txn)
                if fail:
                    raise RuntimeError("event commit failed")
                txn.put(b"conformance", b"event", db=lmdb_store.db("meta"))
                return [1]

            return lmdb_store.write(fn, buffers=True)

        return write_events


def test_a_failed_event_commit_leaves_no_payload_in_the_lmdb_store(tmp_path):
    """The LMDB store writes payloads in the event's transaction: an aborted event takes them along."""
    with Journal(str(tmp_path / "journal"), session=False) as journal:
        store = journal.payload_store
        digest, raw = payload({"ids": torch.arange(5)})
        writer = TestLmdbPayloadStore().event_writer(store, fail=True)
        with pytest.raises(RuntimeError):
            store.commit([(digest, raw)], writer)
        assert digest not in store


def test_a_journal_record_commits_payload_and_event_in_one_lmdb_transaction(tmp_path):
    path = str(tmp_path / "journal")
    with Journal(path) as journal:
        rec = journal.record(1, {"ids": torch.arange(3)})
    env = lmdb.open(path, max_dbs=8, subdir=True, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            assert txn.get(bytes.fromhex(rec.event.output.digest), db=env.open_db(b"payloads", txn=txn)) is not None
    finally:
        env.close()
