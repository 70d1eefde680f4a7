"""The payload-store conformance suite (offered as `stepjournal.testing`), shipped so that a third party's store
runs it too.

The suite is a plain class (as eventsourcing's recorder tests and ``zarr.testing`` are): it imports without
pytest. Each ``test_*`` method takes a fresh folder, ``tmp_path``, so pytest collects a subclass named
``Test...`` and hands it its own ``tmp_path`` fixture; `_suites.run_conformance` runs the same methods without
pytest.
A failure is an `AssertionError` (or what the store raised).
"""

from __future__ import annotations

import contextlib
import re
import threading
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, List, Optional, Tuple, Type

import numpy as np
import torch
import zstandard
import lmdb

from ..base._digest import digest_bytes as digest_of
from ..base._errors import IntegrityError, PayloadMissingError, UnsafePathError
from ..payloads._codec import decode_payload, encode_payload
from ._store_protocol import PayloadStore, undeclared

__all__ = ["PayloadStoreConformance", "payload_of", "raises"]

# A payload this large goes to the journal's payload files (from `FILE_FROM`, 8 MiB): staging is tried with it.
_LARGE = 16 << 20


def payload_of(value: Any) -> Tuple[bytes, bytes]:
    """(digest, encoded bytes) of `value`, as the journal's pipeline stores it uncompressed."""
    raw = bytes(encode_payload(value))
    return digest_of(raw), raw


@contextlib.contextmanager
def raises(kind: Type[BaseException], match: Optional[str] = None) -> Iterator[List[BaseException]]:
    """Fail unless the block raises `kind` (its message searched for `match`); the list holds what it raised."""
    caught: List[BaseException] = []
    try:
        yield caught
    except kind as exc:
        if match is not None and not re.search(match, str(exc)):
            raise AssertionError(f"{type(exc).__name__} {str(exc)!r} does not match {match!r}") from exc
        caught.append(exc)
    else:
        raise AssertionError(f"{kind.__name__} was not raised")


class PayloadStoreConformance:
    """Behaviour every payload store promises, and each capability it declares. Subclass it and define
    `make_store` and `damage`; a store that writes into the journal's LMDB environment defines `event_writer`.
    """

    def make_store(self, tmp_path: Path) -> Iterator[PayloadStore]:
        """Yield a fresh, empty store kept under `tmp_path` (a generator, so that it may clean up after)."""
        raise NotImplementedError("define make_store(tmp_path) in the subclass: it yields a fresh, empty store")

    def damage(self, store: PayloadStore, digest: bytes) -> None:
        """Flip a byte of what is stored under `digest`, below the store's API."""
        raise NotImplementedError("define damage(store, digest) in the subclass: it flips a stored byte")

    def event_writer(self, store: PayloadStore, fail: bool) -> Callable[[Any], Any]:
        """The journal's event commit for `store` (a `WriteEvents`): returns ``[1]``, or raises `RuntimeError`
        before committing when `fail`. This one is a store's outside the journal's LMDB environment, which
        writes its payloads before the events and hands no ``in_txn``; a store inside it runs ``in_txn(txn)``
        in the write transaction."""

        def write_events(in_txn: lmdb.Transaction[Any]) -> List[int]:
            assert in_txn is None, "a store outside the journal's LMDB environment writes nothing in its transaction"
            if fail:
                raise RuntimeError("event commit failed")
            return [1]

        return write_events

    def opened(self, tmp_path: Path) -> ContextManager[PayloadStore]:
        """`make_store` as a context manager."""
        return contextlib.contextmanager(self.make_store)(tmp_path)

    # -- the protocol and its declarations -------------------------------------------------------
    def test_the_store_declares_every_member_of_the_protocol(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            assert undeclared(store) == [], f"the store does not declare {undeclared(store)}"
            assert isinstance(store, PayloadStore)
            assert isinstance(store.takes_pieces, bool) and isinstance(store.stages_writes, bool)
            assert store.files is None or isinstance(store.files, PayloadStore)

    # -- storing and reading ---------------------------------------------------------------------
    def test_a_put_payload_is_read_back_byte_for_byte(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            ids = torch.arange(10)
            digest, raw = payload_of({"ids": ids, "text": "hello"})
            store.put(digest, raw)
            got = store.get(digest)
            assert got == raw
            assert torch.equal(decode_payload(got)["ids"], ids)

    def test_putting_the_same_payload_twice_stores_it_once(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            digest, raw = payload_of([1, 2, 3])
            store.put(digest, raw)
            store.put(digest, raw)
            assert list(store.digests()) == [digest]
            assert store.get(digest) == raw

    def test_payloads_are_addressed_by_the_digest_of_their_content(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            one, two = payload_of("one"), payload_of("two")
            for digest, raw in (one, two):
                store.put(digest, raw)
            for digest, _ in (one, two):
                assert digest_of(store.get(digest)) == digest
            assert one[0] != two[0]

    def test_a_compressed_payload_is_read_back_as_its_encoding(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            digest, raw = payload_of({"zeros": np.zeros(100_000)})
            store.put(digest, zstandard.ZstdCompressor().compress(raw))
            assert store.get(digest) == raw
            with store.view(digest) as (view, _release):
                assert bytes(view) == raw

    def test_a_missing_digest_raises_a_typed_error_naming_it(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            digest, _ = payload_of("never stored")
            with raises(PayloadMissingError, match=digest.hex()[:16]):
                store.get(digest)
            with raises(PayloadMissingError):
                with store.view(digest):
                    pass
            with raises(PayloadMissingError):
                store.check(digest)

    def test_a_malformed_digest_is_refused(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            with raises(IntegrityError, match="malformed"):
                store.put(b"short", b"x")

    def test_damaged_bytes_are_detected_on_read_and_on_check(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            digest, raw = payload_of({"ids": torch.arange(1000)})
            store.put(digest, raw)
            store.check(digest)
            self.damage(store, digest)
            with raises(IntegrityError) as caught:
                store.get(digest)
            assert not isinstance(caught[0], PayloadMissingError)
            with raises(IntegrityError) as caught:
                store.check(digest)
            assert not isinstance(caught[0], PayloadMissingError)

    def test_a_damaged_copy_is_replaced_by_a_new_put(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            digest, raw = payload_of({"ids": torch.arange(1000)})
            store.put(digest, raw)
            self.damage(store, digest)
            store.put(digest, raw)
            assert store.get(digest) == raw

    def test_has_and_contains_tell_stored_from_missing(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            digest, raw = payload_of("here")
            absent, _ = payload_of("absent")
            store.put(digest, raw)
            assert store.has(digest) and digest in store
            assert not store.has(absent) and absent not in store
            assert "not a digest" not in store

    def test_digests_lists_every_stored_payload_in_byte_order(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            items = [payload_of(i) for i in range(50)]
            for digest, raw in items:
                store.put(digest, raw)
            assert list(store.digests()) == sorted(d for d, _ in items)

    def test_a_deleted_payload_is_gone_and_deleting_it_again_reports_nothing(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            keep, gone = payload_of("keep"), payload_of("gone")
            for digest, raw in (keep, gone):
                store.put(digest, raw)
            assert store.delete(gone[0]) is True
            assert store.delete(gone[0]) is False
            assert gone[0] not in store and list(store.digests()) == [keep[0]]
            with raises(PayloadMissingError):
                store.get(gone[0])

    def test_a_large_payload_round_trips(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            digest, raw = payload_of({"x": torch.arange(8 << 20, dtype=torch.int64)})  # 64 MiB
            store.put(digest, raw)
            assert store.get(digest) == raw
            with store.view(digest) as (view, _release):
                assert digest_of(view) == digest

    def test_commit_stores_the_payloads_and_commits_the_events_once(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            items = [payload_of("a"), payload_of("b")]
            assert store.commit(items, self.event_writer(store, fail=False)) == [1]
            assert all(store.get(d) == raw for d, raw in items)

    def test_commit_with_nothing_to_store_still_commits_the_events(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            assert store.commit([], self.event_writer(store, fail=False)) == [1]
            assert list(store.digests()) == []

    def test_a_failed_event_commit_propagates_and_leaves_the_store_usable(self, tmp_path: Path) -> None:
        # A store may keep an unreferenced payload (remote: written first) or none (one transaction);
        # either way the failure reaches the journal, and storing again works.
        with self.opened(tmp_path) as store:
            items = [payload_of("orphan")]
            with raises(RuntimeError, match="event commit failed"):
                store.commit(items, self.event_writer(store, fail=True))
            store.put(*items[0])
            assert store.get(items[0][0]) == items[0][1]

    def test_many_threads_read_at_once(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            items = [payload_of({"i": torch.full((1000,), i)}) for i in range(8)]
            for digest, raw in items:
                store.put(digest, raw)
            errors: List[BaseException] = []

            def read() -> None:
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

    # -- the declared capabilities ---------------------------------------------------------------
    def test_a_store_that_takes_pieces_stores_them_joined(self, tmp_path: Path) -> None:
        """Declared `takes_pieces`: `put` and `commit` take a list of pieces (the journal joins them otherwise)."""
        with self.opened(tmp_path) as store:
            assert isinstance(store.takes_pieces, bool)
            if not store.takes_pieces:
                return
            (one, raw_one), (two, raw_two) = payload_of("put in pieces"), payload_of({"ids": torch.arange(100)})
            store.put(one, _pieces(raw_one))
            assert store.commit([(two, _pieces(raw_two))], self.event_writer(store, fail=False)) == [1]
            assert (store.get(one), store.get(two)) == (raw_one, raw_two)

    def test_a_store_that_stages_writes_stores_a_staged_payload_once_put_and_none_discarded(
            self, tmp_path: Path) -> None:
        """Declared `stages_writes`: a large payload's `stage` starts its write, its `put` finishes it, and a
        staged payload discarded before its `put` leaves nothing stored."""
        with self.opened(tmp_path) as store:
            assert isinstance(store.stages_writes, bool)
            if not store.stages_writes:
                return
            (kept, raw_kept), (dropped, raw_dropped) = (payload_of(torch.arange(_LARGE // 8) + i) for i in (0, 1))
            owner = _Owner()
            staged = store.stage(_pieces(raw_kept))
            assert staged is not None, "a store that declares stages_writes stages a payload of 16 MiB"
            staged.named(kept, owner)
            store.put(kept, _pieces(raw_kept) if store.takes_pieces else raw_kept)
            assert store.get(kept) == raw_kept
            gone = store.stage(_pieces(raw_dropped))
            assert gone is not None
            gone.named(dropped, _Owner())
            gone.discard()
            assert dropped not in store and list(store.digests()) == [kept]

    def test_lmdb_bytes_counts_no_more_than_the_payloads_stored(self, tmp_path: Path) -> None:
        """`lmdb_bytes`: what `commit` puts in the journal's LMDB pages, between 0 and the items' bytes."""
        with self.opened(tmp_path) as store:
            items = [payload_of("small"), payload_of(torch.arange(1000))]
            counted = store.lmdb_bytes(items)
            assert isinstance(counted, int) and 0 <= counted <= sum(len(raw) for _, raw in items)
            assert store.lmdb_bytes([]) == 0

    def test_check_many_agrees_with_check_on_whole_damaged_and_missing_payloads(self, tmp_path: Path) -> None:
        with self.opened(tmp_path) as store:
            (whole, raw), (damaged, raw_damaged) = payload_of("whole"), payload_of({"ids": torch.arange(1000)})
            missing, _ = payload_of("missing")
            store.put(whole, raw)
            store.put(damaged, raw_damaged)
            self.damage(store, damaged)
            found = store.check_many([(whole, len(raw)), (damaged, len(raw_damaged)), (missing, None)])
            assert len(found) == 3 and found[0] is None
            assert isinstance(found[1], (IntegrityError, UnsafePathError))
            assert not isinstance(found[1], PayloadMissingError)
            assert isinstance(found[2], PayloadMissingError)

    def test_the_payload_files_a_store_keeps_are_among_its_payloads(self, tmp_path: Path) -> None:
        """Declared `files`: a payload store of its own, whose every payload the store lists too."""
        with self.opened(tmp_path) as store:
            digest, raw = payload_of(torch.arange(_LARGE // 8))
            store.put(digest, raw)
            if store.files is None:
                return
            assert isinstance(store.files, PayloadStore)
            kept = list(store.files.digests())
            assert set(kept) <= set(store.digests())
            assert all(store.files.get(d) == store.get(d) for d in kept)


class _Owner:
    """What a staged payload is tied to (`Staged.named`): the journal's prepared payload."""


def _pieces(raw: bytes) -> List[bytes]:
    """`raw` as three pieces, as the journal hands a payload to a store that takes pieces."""
    third = max(1, len(raw) // 3)
    return [raw[:third], raw[third:2 * third], raw[2 * third:]]

