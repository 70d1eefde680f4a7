"""The conformance suite every `PayloadStore` must pass (as eventsourcing's recorder test cases).

A store's test module subclasses `PayloadStoreConformance` and gives it two hooks:

- ``make_store(tmp_path)``: a fresh, empty store (yielded by a fixture, so it may clean up);
- ``damage(store, digest)``: flip a byte of what is stored under `digest`, below the store's API;
- ``event_writer(store, fail)``: the journal's event commit for that store (a `WriteEvents`):
  it runs the store's ``in_txn`` (when handed one) where the journal would, then returns ``[1]``,
  or raises `RuntimeError` before committing when `fail`.

Every test here then runs against that store. See tests/integration/test_payload_store_lmdb.py.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

import numpy as np
import pytest
import torch
import zstandard

from stepjournal.errors import IntegrityError, PayloadMissingError
from stepjournal.payloads import PayloadStore, decode_payload, encode_payload
from stepjournal.base._digest import digest_bytes


def payload(value: Any) -> tuple:
    """(digest, encoded bytes) of a value, as the journal's pipeline would store it uncompressed."""
    raw = bytes(encode_payload(value))
    return digest_bytes(raw), raw


class PayloadStoreConformance:
    """Behaviour every payload store promises. Subclass it and define `make_store` and `damage`."""

    def make_store(self, tmp_path) -> Iterator[PayloadStore]:  # pragma: no cover - defined by subclasses
        raise NotImplementedError

    def damage(self, store: PayloadStore, digest: bytes) -> None:  # pragma: no cover - defined by subclasses
        raise NotImplementedError

    def event_writer(self, store: PayloadStore, fail: bool) -> Any:  # pragma: no cover - defined by subclasses
        raise NotImplementedError

    @pytest.fixture
    def store(self, tmp_path):
        yield from self.make_store(tmp_path)

    def test_the_store_is_a_payload_store(self, store):
        assert isinstance(store, PayloadStore)

    def test_a_put_payload_is_read_back_byte_for_byte(self, store):
        value = {"ids": torch.arange(10), "text": "hello"}
        digest, raw = payload(value)
        store.put(digest, raw)
        got = store.get(digest)
        assert got == raw
        assert torch.equal(decode_payload(got)["ids"], value["ids"])

    def test_putting_the_same_payload_twice_stores_it_once(self, store):
        digest, raw = payload([1, 2, 3])
        store.put(digest, raw)
        store.put(digest, raw)
        assert list(store.digests()) == [digest]
        assert store.get(digest) == raw

    def test_payloads_are_addressed_by_the_digest_of_their_content(self, store):
        one, two = payload("one"), payload("two")
        for digest, raw in (one, two):
            store.put(digest, raw)
        for digest, raw in (one, two):
            assert digest_bytes(store.get(digest)) == digest
        assert one[0] != two[0]

    def test_a_compressed_payload_is_read_back_as_its_encoding(self, store):
        digest, raw = payload({"zeros": np.zeros(100_000)})
        store.put(digest, zstandard.ZstdCompressor().compress(raw))
        assert store.get(digest) == raw

    def test_a_missing_digest_raises_a_typed_error_naming_it(self, store):
        digest, _ = payload("never stored")
        with pytest.raises(PayloadMissingError, match=digest.hex()[:16]):
            store.get(digest)
        with pytest.raises(PayloadMissingError):
            with store.view(digest):
                pass

    def test_a_malformed_digest_is_refused(self, store):
        with pytest.raises(IntegrityError, match="malformed"):
            store.put(b"short", b"x")

    def test_damaged_bytes_are_detected_on_read(self, store):
        digest, raw = payload({"ids": torch.arange(1000)})
        store.put(digest, raw)
        self.damage(store, digest)
        with pytest.raises(IntegrityError) as caught:
            store.get(digest)
        assert not isinstance(caught.value, PayloadMissingError)

    def test_a_damaged_copy_is_replaced_by_a_new_put(self, store):
        digest, raw = payload({"ids": torch.arange(1000)})
        store.put(digest, raw)
        self.damage(store, digest)
        store.put(digest, raw)
        assert store.get(digest) == raw

    def test_has_and_contains_tell_stored_from_missing(self, store):
        digest, raw = payload("here")
        absent, _ = payload("absent")
        store.put(digest, raw)
        assert store.has(digest) and digest in store
        assert not store.has(absent) and absent not in store
        assert "not a digest" not in store

    def test_digests_lists_every_stored_payload_in_byte_order(self, store):
        items = [payload(i) for i in range(50)]
        for digest, raw in items:
            store.put(digest, raw)
        assert list(store.digests()) == sorted(d for d, _ in items)

    def test_a_deleted_payload_is_gone_and_deleting_it_again_reports_nothing(self, store):
        keep, gone = payload("keep"), payload("gone")
        for digest, raw in (keep, gone):
            store.put(digest, raw)
        assert store.delete(gone[0]) is True
        assert store.delete(gone[0]) is False
        assert gone[0] not in store and list(store.digests()) == [keep[0]]
        with pytest.raises(PayloadMissingError):
            store.get(gone[0])

    def test_a_large_payload_round_trips(self, store):
        digest, raw = payload({"x": torch.arange(8 << 20, dtype=torch.int64)})  # 64 MiB
        store.put(digest, raw)
        assert store.get(digest) == raw
        with store.view(digest) as (view, _release):
            assert digest_bytes(view) == digest

    def test_commit_stores_the_payloads_and_commits_the_events_once(self, store):
        items = [payload("a"), payload("b")]
        assert store.commit(items, self.event_writer(store, fail=False)) == [1]
        assert all(store.get(d) == raw for d, raw in items)

    def test_commit_with_nothing_to_store_still_commits_the_events(self, store):
        assert store.commit([], self.event_writer(store, fail=False)) == [1]
        assert list(store.digests()) == []

    def test_a_failed_event_commit_propagates_and_leaves_the_store_usable(self, store):
        # A store may keep an unreferenced payload (remote: written first) or none (one transaction);
        # either way the failure reaches the journal, and storing again works.
        items = [payload("orphan")]
        with pytest.raises(RuntimeError, match="event commit failed"):
            store.commit(items, self.event_writer(store, fail=True))
        store.put(*items[0])
        assert store.get(items[0][0]) == items[0][1]

    def test_many_threads_read_at_once(self, store):
        items = [payload({"i": torch.full((1000,), i)}) for i in range(8)]
        for digest, raw in items:
            store.put(digest, raw)
        errors = []

        def read():
            try:
                for _ in range(20):
                    for digest, raw in items:
                        assert store.get(digest) == raw
            except BaseException as exc:  # reported to the main thread
                errors.append(exc)

        threads = [threading.Thread(target=read) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
