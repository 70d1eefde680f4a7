"""The journal's rooms: the sessions index, reindex under concurrent writers, the lazy payload pipeline."""

from __future__ import annotations


import lmdb
import pytest
import torch

from journal_workers import record_steps
from stepjournal import Journal
from stepjournal.errors import IntegrityError, JournalError
from stepjournal.index._projections import SESSIONS_FLAG  # private: the projections' internals
from reliability_support import worker_context


def _drop_sessions_index(path: str) -> None:
    """Make a journal look as one written before the sessions index existed."""
    env = lmdb.open(path, max_dbs=8, subdir=True)
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(b"sessions", txn=txn), delete=True)
            txn.delete(SESSIONS_FLAG, db=env.open_db(b"meta", txn=txn))
    finally:
        env.close()


def _sessions_index(journal: Journal) -> dict:
    """The sessions database as stored, read below the journal's API."""
    store = journal._store
    with store.read() as txn:
        return {bytes(k).decode(): int.from_bytes(v, "big") for k, v in txn.cursor(db=store.db("sessions"))}


def test_each_session_is_indexed_with_the_seq_of_its_session_opened(jpath):
    with Journal(jpath, fingerprint={"model": "a"}) as first:
        first.record(1, "x")
    with Journal(jpath, fingerprint={"model": "b"}) as second:
        sessions = {s.session: seq for seq, s in second.sessions()}
        assert _sessions_index(second) == sessions
        assert second.session_fingerprint(first.session) == {"model": "a"}
        assert second.session_fingerprint(second.session) == {"model": "b"}


def test_a_journal_without_a_sessions_index_opens_read_only_and_still_finds_fingerprints(jpath):
    with Journal(jpath, fingerprint={"model": "a"}) as journal:
        session = journal.record(1, "x").event.session
    _drop_sessions_index(jpath)
    with Journal(jpath, readonly=True) as journal:
        assert journal.session_fingerprint(session) == {"model": "a"}
        with pytest.raises(IntegrityError, match="no SessionOpened"):
            journal.session_fingerprint("0" * 32)


def test_opening_an_old_journal_for_writing_builds_its_sessions_index(jpath):
    with Journal(jpath, fingerprint={"model": "a"}) as journal:
        old = journal.record(1, "x").event.session
    _drop_sessions_index(jpath)
    with Journal(jpath) as journal:
        journal.record(2, "y")
        assert set(_sessions_index(journal)) == {old, journal.session}
        assert journal.session_fingerprint(old) == {"model": "a"}


def test_reindex_rebuilds_the_sessions_index_from_the_log(jpath):
    with Journal(jpath) as journal:
        journal.record(1, "x")
        before = _sessions_index(journal)
        assert list(before) == [journal.session]
        assert journal.reindex() == journal.last_seq()
        assert _sessions_index(journal) == before


def _acked(ack: str) -> list:
    try:
        with open(ack) as fh:
            return [int(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def test_every_record_acknowledged_while_reindex_runs_in_a_loop_is_in_the_index(tmp_path):
    """Regression (issue 13): reindex read the log outside its write transaction and lost entries.

    Reindexing stops while the writers still record, so an entry a rebuild dropped is not put back
    by a later rebuild: it stays missing, and the test sees it.
    """
    path, writers, steps = str(tmp_path / "journal"), 3, 300
    with Journal(path, session=False):
        pass
    ctx = worker_context()
    acks = [str(tmp_path / f"ack{i}") for i in range(writers)]
    procs = [ctx.Process(target=record_steps, args=(path, f"w{i}", steps, acks[i])) for i in range(writers)]
    for p in procs:
        p.start()
    rebuilds = 0
    with Journal(path, session=False) as journal:
        while any(p.is_alive() for p in procs) and min(len(_acked(a)) for a in acks) < steps * 3 // 4:
            journal.reindex()
            rebuilds += 1
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        assert rebuilds > 3  # the rebuilds ran while records were being committed
        missing = []
        for i, ack in enumerate(acks):
            acked = _acked(ack)
            assert len(acked) == steps
            missing += [(f"w{i}", s) for s in acked if journal.lookup(s, run=f"w{i}") is None]
        assert missing == []
        assert journal.verify() == []


def test_an_input_needed_only_for_its_digest_is_never_compressed(jpath):
    with Journal(jpath, compression="zstd") as journal:
        prepared = journal.prepare({"ids": torch.zeros(10_000)})
        assert prepared._packed == []  # encoded and hashed, not compressed
        rec = journal.record(1, "out", input=prepared, store_input=False)
        assert rec.event.input is None and rec.event.input_digest == prepared.digest
        assert prepared._packed == []
        stored = journal.record(2, "out", input=prepared)
        assert stored.event.input.stored_nbytes < stored.event.input.nbytes  # compressed when stored


def test_a_digest_only_preparation_cannot_be_stored(jpath):
    with Journal(jpath) as journal:
        prepared = journal.prepare([1, 2, 3], store=False)
        assert prepared.digest == journal.prepare([1, 2, 3]).digest
        assert not prepared.storable
        with pytest.raises(JournalError, match="store=False"):
            journal.record(1, prepared)
        assert journal.lookup(1) is None


def test_journal_audit_reads_the_same_records_as_the_audit_of_its_events(jpath):
    from stepjournal.index._audit import audit  # private: the audit's internals

    with Journal(jpath) as journal:
        rec = journal.record(1, "a")
        journal.record_replay(2, rec)
        journal.record_bypass(3)
        assert journal.audit() == audit(journal.events()) == audit(journal)
        assert journal.audit(actions={"replayed"}) == audit(journal.events(), actions={"replayed"})
        assert [r.step for r in audit(list(journal.events()), steps={1, 3})] == [1, 3]


def test_an_indexed_session_fingerprint_is_read_without_scanning_the_log(jpath):
    with Journal(jpath, fingerprint={"model": "a"}) as first:
        session = first.record(1, "x").event.session
    with Journal(jpath, readonly=True) as journal:

        def no_scan(**_):
            raise AssertionError("session_fingerprint scanned the log")

        journal._log.raw_events = no_scan
        assert journal.session_fingerprint(session) == {"model": "a"}
