"""The object-storage payload store: the conformance suite against a real S3 server (moto, 127.0.0.1)
and a local folder, objects before events, the LMDB table as a verified cache, a hostile remote,
credentials never shown."""

from __future__ import annotations

import logging

import pytest
import torch

from log_capture import captured_events
from stepjournal.testing import PayloadStoreConformance
from stepjournal.testing import payload_of as payload
from s3_server import SECRET, s3_env, s3_server  # noqa: F401  (fixtures)
from stepjournal import Journal
from stepjournal.errors import IntegrityError, PayloadMissingError, RemoteError
from stepjournal.payloads import ObjectPayloadStore, PayloadStoreBase
from stepjournal.payloads._object_client import Remote  # private: the object client under test
from stepjournal.payloads._payloads import stored_bound  # private: the payload pipeline's limits
from stepjournal.base._secrets import public_url, redact  # private: URL redaction under test
from test_payload_store_lmdb import TestLmdbPayloadStore


def flip_remote(store: ObjectPayloadStore, digest: bytes) -> None:
    key = "payloads/" + digest.hex()
    data = bytearray(store.remote.get(key, limit=1 << 30))
    data[-1] ^= 0xFF
    store.remote.put(key, bytes(data))


class _ObjectStoreSuite(PayloadStoreConformance):
    cached = False

    def url(self, tmp_path) -> str:  # pragma: no cover - defined by subclasses
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    def _where(self, tmp_path, request):
        self.url_base = self.url(tmp_path, request)

    def make_store(self, tmp_path):
        with Journal(str(tmp_path / "journal"), session=False) as journal:
            cache = journal.payload_store if self.cached else None
            store = ObjectPayloadStore(self.url_base + "/prefix", cache=cache)
            store._journal_store = journal.payload_store  # what the event writer commits into
            yield store

    def damage(self, store, digest):
        flip_remote(store, digest)
        if store.cache is not None:
            TestLmdbPayloadStore().damage(store.cache, digest)

    def event_writer(self, store, fail):
        return TestLmdbPayloadStore().event_writer(store._journal_store, fail)


class TestObjectPayloadStoreOnS3(_ObjectStoreSuite):
    def url(self, tmp_path, request):
        return request.getfixturevalue("s3_env")


class TestCachedObjectPayloadStoreOnS3(_ObjectStoreSuite):
    cached = True

    def url(self, tmp_path, request):
        return request.getfixturevalue("s3_env")


class TestObjectPayloadStoreOnAFolder(_ObjectStoreSuite):
    def url(self, tmp_path, request):
        return (tmp_path / "bucket").as_uri()


def test_the_object_is_written_before_the_event_that_references_it_commits(tmp_path, s3_env):
    with Journal(str(tmp_path / "j"), session=False) as journal:
        store = ObjectPayloadStore(s3_env, cache=journal.payload_store)
        digest, raw = payload({"ids": torch.arange(7)})
        seen = []

        def write_events(in_txn):
            seen.append(store.remote.exists("payloads/" + digest.hex()))
            return TestLmdbPayloadStore().event_writer(journal.payload_store, False)(in_txn)

        assert store.commit([(digest, raw)], write_events) == [1]
        assert seen == [True]
        assert journal.payload_store.has(digest)  # cached in the event's own transaction


def test_a_journal_opened_with_a_url_records_to_the_remote_and_keeps_a_local_copy(tmp_path, s3_env):
    with Journal(str(tmp_path / "j"), payload_store=s3_env + "/run1") as journal:
        assert isinstance(journal.payload_store, ObjectPayloadStore)
        rec = journal.record(1, {"ids": torch.arange(5)})
        key = bytes.fromhex(rec.event.output.digest)
        assert journal.payload_store.remote.exists("payloads/" + rec.event.output.digest)
        assert journal.payload_store.cache.has(key)
        assert torch.equal(journal.load_output(journal.lookup(1))["ids"], torch.arange(5))
    with Journal(str(tmp_path / "j"), readonly=True) as local_only:  # the local copy alone replays too
        assert torch.equal(local_only.load_output(local_only.lookup(1))["ids"], torch.arange(5))


def test_a_payload_missing_from_the_cache_is_read_from_the_remote_checked_and_cached(tmp_path, s3_env):
    with Journal(str(tmp_path / "j"), payload_store=s3_env) as journal:
        rec = journal.record(1, {"ids": torch.arange(1000)})
        key = bytes.fromhex(rec.event.output.digest)
        journal.payload_store.cache.delete(key)
        assert torch.equal(journal.load_output(rec)["ids"], torch.arange(1000))
        assert journal.payload_store.cache.has(key)


def test_a_damaged_remote_object_is_refused_and_never_cached(tmp_path, s3_env):
    with Journal(str(tmp_path / "j"), payload_store=s3_env) as journal:
        rec = journal.record(3, {"ids": torch.arange(1000)})
        key = bytes.fromhex(rec.event.output.digest)
        journal.payload_store.cache.delete(key)
        flip_remote(journal.payload_store, key)
        with pytest.raises(IntegrityError, match="step 3"):
            journal.load_output(rec)
        assert not journal.payload_store.cache.has(key)


def test_a_replay_served_from_the_remote_without_a_cache_checks_the_digest_once_and_names_the_remote_copy(
        tmp_path, s3_env):
    with Journal(str(tmp_path / "j"), payload_store=s3_env) as journal:
        rec = journal.record(4, {"ids": torch.arange(1000)})
    remote_only = ObjectPayloadStore(s3_env)  # no cache: the view is unchecked, the journal's load checks it
    with Journal(str(tmp_path / "j"), readonly=True, payload_store=remote_only) as journal:
        assert torch.equal(journal.load_output(journal.lookup(4))["ids"], torch.arange(1000))
        flip_remote(remote_only, bytes.fromhex(rec.event.output.digest))
        with pytest.raises(IntegrityError, match=r"remote copy is damaged \(step 4\)"):
            journal.load_output(journal.lookup(4))


def test_verify_of_a_journal_whose_payloads_live_only_remotely_names_the_damaged_one_and_passes_the_rest(
        tmp_path, s3_env):
    """A store that declares no ``check_many`` of its own is checked payload by payload (`PayloadStoreBase.check_many`)."""
    with Journal(str(tmp_path / "j"), payload_store=s3_env) as journal:
        recs = [journal.record(step, {"ids": torch.arange(1000) + step}) for step in (1, 2, 3)]
    remote_only = ObjectPayloadStore(s3_env)
    assert type(remote_only).check_many is PayloadStoreBase.check_many
    with Journal(str(tmp_path / "j"), readonly=True, payload_store=remote_only) as journal:
        assert journal.verify() == []
        flip_remote(remote_only, bytes.fromhex(recs[1].event.output.digest))
        problems = journal.verify()
    assert [(p.kind, p.where, p.steps) for p in problems] == [("payload", recs[1].event.output.digest, (2,))]


@pytest.mark.parametrize("n", [1000, 200_000], ids=["16 KB", "3.2 MB"])  # a bytearray, an anonymous mapping
@pytest.mark.parametrize("cached", [False, True], ids=["no cache", "cached"])
def test_a_payload_fetched_from_the_remote_is_decoded_in_place_and_each_load_has_its_own(tmp_path, s3_env, cached, n):
    with Journal(str(tmp_path / "j"), payload_store=s3_env) as journal:
        journal.record(4, {"a": torch.arange(n), "b": torch.arange(n) * 2})
    with Journal(str(tmp_path / "j")) as journal:
        journal.payload_store.delete(bytes.fromhex(journal.lookup(4).event.output.digest))  # not cached
    with Journal(str(tmp_path / "j"), payload_store=s3_env if cached else ObjectPayloadStore(s3_env)) as journal:
        first = journal.load_output(journal.lookup(4))
        # Views of the one buffer the object was read into, n * 8 bytes apart as in the payload: no copy.
        assert first["b"].data_ptr() - first["a"].data_ptr() == n * 8
        first["a"][0] = -1
        again = journal.load_output(journal.lookup(4))
        assert again["a"][0] == 0 and torch.equal(again["b"], torch.arange(n) * 2)
        digest = bytes.fromhex(journal.lookup(4).event.output.digest)
    with Journal(str(tmp_path / "j"), readonly=True) as journal:
        assert journal.payload_store.has(digest) == cached
        if cached:  # the copy the first load cached is the object's, not written to through its tensors
            assert torch.equal(journal.load(journal.lookup(4).event.output)["a"], torch.arange(n))


def test_a_truncated_remote_object_is_refused(tmp_path, s3_env):
    store = ObjectPayloadStore(s3_env)
    digest, raw = payload({"ids": torch.arange(1000)})
    store.remote.put("payloads/" + digest.hex(), raw[: len(raw) // 2])
    with pytest.raises(IntegrityError) as caught:
        store.get(digest, nbytes=len(raw))
    assert not isinstance(caught.value, PayloadMissingError)


def test_a_remote_object_larger_than_its_payload_may_be_is_not_read(tmp_path, s3_env):
    store = ObjectPayloadStore(s3_env)
    digest, raw = payload("small")
    store.remote.put("payloads/" + digest.hex(), raw + bytes(4 << 20))  # 4 MiB where ~30 bytes are due
    with pytest.raises(IntegrityError, match="more than the"):
        store.get(digest, nbytes=len(raw))
    assert stored_bound(len(raw)) < 4 << 20


def test_a_missing_remote_object_is_a_typed_error_naming_the_payload(tmp_path, s3_env):
    digest, _ = payload("never written")
    with pytest.raises(PayloadMissingError, match=digest.hex()[:16]):
        ObjectPayloadStore(s3_env).get(digest)


def test_a_secret_key_in_the_environment_appears_in_no_error_and_no_log_line(tmp_path, s3_env, monkeypatch):
    with captured_events(logging.DEBUG) as events:
        with Journal(str(tmp_path / "j"), payload_store=s3_env) as journal:
            journal.record(1, "logged")
        missing_bucket = ObjectPayloadStore("s3://no-such-bucket-here/x")
        with pytest.raises(RemoteError) as no_bucket:
            missing_bucket.put(*payload("x"))
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
        unreachable = ObjectPayloadStore("s3://whatever/x")
        with pytest.raises(RemoteError) as no_server:
            unreachable.get(payload("y")[0])
    messages = [str(no_bucket.value), str(no_server.value), repr(no_bucket.value), repr(no_server.value)]
    assert all(SECRET not in m for m in messages) and all(m for m in messages)
    assert no_bucket.value.__cause__ is None and no_bucket.value.__suppress_context__
    assert events and not any(SECRET in repr(event) for event in events)


def test_a_message_that_would_carry_a_credential_shows_stars_instead(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    assert redact(f"signature for {SECRET} refused") == "signature for *** refused"


def test_a_url_with_user_info_is_shown_without_it(tmp_path):
    url = f"file://user:{SECRET}@localhost{tmp_path}/r"
    assert public_url(url) == f"file://localhost{tmp_path}/r"
    with pytest.raises(RemoteError) as caught:  # obstore takes no user info in a file URL
        Remote(url)
    assert SECRET not in str(caught.value) and "user:" not in str(caught.value)
