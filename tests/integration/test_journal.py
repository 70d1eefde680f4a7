"""The journal: append-only events, payloads beside them, projections rebuilt from the log."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import stat
import sys

import msgpack
import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import (
    EventDecodeError,
    IntegrityError,
    InvalidKeyError,
    JournalClosedError,
    UnknownEventTypeError,
    UnsupportedSchemaVersionError,
)
from stepjournal.events import CallBypassed, GenerationRecorded, ReplayServed, SessionOpened
from stepjournal.payloads import ObjectPayloadStore
from stepjournal.events._convert import decode_event, encode_event  # private: raw event bytes, as stored

from kill_points import Lockstep, nth_after, start_process
from lmdb_raw import flip_byte, items, put_raw
from reliability_support import worker_context


def rollout(step: int, n: int = 4) -> dict:
    g = torch.Generator().manual_seed(step)
    return {
        "ids": torch.randint(0, 1000, (n, 8), generator=g),
        "logprobs": torch.randn(n, 8, generator=g),
        "uid": [f"s{step}-{i}" for i in range(n)],
        "meta": {"step": step, "temperature": 0.7},
    }


def assert_rollout_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert torch.equal(a["ids"], b["ids"]) and a["ids"].dtype == b["ids"].dtype
    assert torch.equal(a["logprobs"], b["logprobs"])
    assert a["uid"] == b["uid"] and a["meta"] == b["meta"]


# -- opening ---------------------------------------------------------------------------------------
def test_journal_opens_with_path_alone_and_records_its_session_with_its_first_call(jpath):
    with Journal(jpath) as j:
        assert j.sessions() == [] and j.session is not None  # nothing written before a call
        assert j.session_fingerprint(j.session) == {}
        j.record(1, "x")
        (seq, ev), = j.sessions()
        assert seq == 1 and isinstance(ev, SessionOpened) and j.last_seq() == 2
        assert ev.run == "default" and ev.fingerprint == {} and ev.pid == os.getpid()
        assert j.session == ev.session
        j.record(2, "y")
        assert len(j.sessions()) == 1


def test_a_session_that_journals_no_call_leaves_nothing_in_the_log(jpath):
    with Journal(jpath) as j:
        j.record(1, "x")
    with Journal(jpath, run="other", fingerprint={"model": "m"}):
        pass
    with Journal(jpath, readonly=True) as j:
        assert [type(e) for _, e in j.events()] == [SessionOpened, GenerationRecorded]
        assert j.verify() == []


class _FailsOnceAfterItsEventsCommit(ObjectPayloadStore):
    """A user's payload store whose commit raises after the events committed (a mirror it also feeds is down)."""

    failed = False

    def commit(self, items, write_events):
        seqs = super().commit(items, write_events)
        if not self.failed:
            self.failed = True
            raise OSError("the mirror is down")
        return seqs


def test_a_first_call_that_committed_before_its_store_failed_opens_its_session_once(jpath, tmp_path):
    store = _FailsOnceAfterItsEventsCommit((tmp_path / "objects").as_uri())
    with Journal(jpath, payload_store=store) as j:
        with pytest.raises(OSError, match="mirror"):
            j.record(1, "x")
        j.record(2, "y")
        assert [opened.session for _, opened in j.sessions()] == [j.session]


def test_journal_folder_is_created_owner_only(jpath):
    Journal(jpath).close()
    assert stat.S_IMODE(os.stat(jpath).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(jpath, "data.mdb")).st_mode) == 0o600


def test_using_a_closed_journal_raises_a_typed_error(jpath):
    j = Journal(jpath)
    j.close()
    j.close()  # closing twice is fine
    with pytest.raises(JournalClosedError, match="open a new Journal"):
        j.last_seq()


def test_read_only_journal_writes_nothing(jpath):
    with Journal(jpath) as j:
        j.record(1, rollout(1))
    before = {n: open(os.path.join(jpath, n), "rb").read() for n in ["data.mdb"]}
    mtime = os.stat(os.path.join(jpath, "data.mdb")).st_mtime_ns
    with Journal(jpath, readonly=True) as r:
        assert r.recorded_steps() == [1]
        assert_rollout_equal(r.load_output(r.lookup(1)), rollout(1))
        with pytest.raises(Exception, match="read-only"):
            r.record(2, rollout(2))
    assert open(os.path.join(jpath, "data.mdb"), "rb").read() == before["data.mdb"]
    assert os.stat(os.path.join(jpath, "data.mdb")).st_mtime_ns == mtime


# -- appending and reading ---------------------------------------------------------------------------
def test_record_then_lookup_and_load_round_trips_output_and_input(jpath):
    with Journal(jpath) as j:
        rec = j.record(3, rollout(3), input={"prompts": torch.arange(6)}, gen_index=1, duration_s=0.5)
        found = j.lookup(3, 1)
        assert found == rec
        assert_rollout_equal(j.load_output(found), rollout(3))
        assert torch.equal(j.load_input(found)["prompts"], torch.arange(6))
        assert found.event.input_digest == found.event.input.digest
        assert j.lookup(3, 0) is None and j.lookup(4, 1) is None


def test_event_sequence_is_gapless_and_monotonic_across_sessions(jpath):
    for session in range(3):
        with Journal(jpath) as j:
            for step in range(1, 4):
                j.record(step + 10 * session, rollout(step))
            j.record_bypass(99, reason="validation")
    with Journal(jpath, readonly=True) as j:
        seqs = [seq for seq, _ in j.events()]
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(seqs) == 3 * (1 + 3 + 1)


def test_identical_payloads_are_stored_once(jpath):
    with Journal(jpath) as j:
        a = j.record(1, rollout(7))
        b = j.record(2, rollout(7))
        assert a.event.output.digest == b.event.output.digest
    assert len(items(jpath, "payloads")) == 1


def test_events_filter_by_run_type_and_steps(jpath):
    with Journal(jpath, run="a") as j:
        j.record(1, rollout(1))
        j.record(2, rollout(2))
        src = j.lookup(1)
        j.record_replay(5, src, policy="repeat", reason="cycled")
        j.record_bypass(5, gen_index=1)
    with Journal(jpath, run="b") as j:
        j.record(1, rollout(1))
    with Journal(jpath, readonly=True) as j:
        assert [e.step for _, e in j.events(run="a", types=[GenerationRecorded])] == [1, 2]
        (_, replay), = j.events(types=[ReplayServed])
        assert (replay.step, replay.source_step, replay.policy, replay.reason) == (5, 1, "repeat", "cycled")
        assert [type(e) for _, e in j.events(steps={5})] == [ReplayServed, CallBypassed]
        assert len(j.sessions()) == 2 and len(j.sessions(run="b")) == 1


def test_recorded_steps_and_nearest_lookups(jpath):
    with Journal(jpath) as j:
        for step in [8, 2, 5]:
            j.record(step, rollout(step))
        j.record(5, rollout(50), gen_index=2)
        j.record(9, None, store_output=False)  # journaled without output: not a recorded step
        assert j.recorded_steps() == [2, 5, 8]
        assert j.recorded_indices(5) == [0, 2]
        assert j.step_count() == 3 and j.nth_step(0) == 2 and j.nth_step(-1) == 8
        assert j.nearest_below(5) == 2 and j.nearest_below(2) is None and j.nearest_below(100) == 8
        assert j.nearest_above(5) == 8 and j.nearest_above(8) is None and j.nearest_above(0) == 2
        assert j.recorded_steps(mode="validate") == []


def test_projection_sees_what_another_handle_appended(jpath):
    with Journal(jpath, run="r") as j:
        j.record(1, rollout(1))
        assert j.recorded_steps() == [1]
        j2 = Journal(jpath, run="r")  # same process: shares the environment
        j2.record(4, rollout(4))
        j2.close()
        assert j.recorded_steps() == [1, 4]


def test_rerecording_a_key_points_the_index_at_the_latest(jpath):
    with Journal(jpath) as j:
        j.record(1, rollout(1))
        newer = j.record(1, rollout(2))
        assert j.lookup(1) == newer


def test_invalid_keys_are_rejected_with_the_bad_value(jpath):
    with Journal(jpath) as j:
        with pytest.raises(InvalidKeyError, match="-1"):
            j.record(-1, rollout(1))
        with pytest.raises(InvalidKeyError, match="gen_index"):
            j.record(1, rollout(1), gen_index=-3)
        with pytest.raises(InvalidKeyError, match="mode"):
            j.record(1, rollout(1), mode="")
    with pytest.raises(InvalidKeyError, match="run key"):
        Journal(jpath, run="a\x00b")
    with pytest.raises(InvalidKeyError, match="fingerprint value"):
        Journal(jpath, fingerprint={"model": object()})


# -- projections -------------------------------------------------------------------------------------
def test_reindex_rebuilds_the_same_index_as_incremental_updates(jpath):
    with Journal(jpath, run="x") as j:
        for step in range(1, 30):
            j.record(step % 7, rollout(step), gen_index=step % 3)
            if step % 5 == 0:
                j.record(step, None, store_output=False)
                j.record_bypass(step)
        incremental = j.index_items()
        steps = j.recorded_steps()
        assert j.reindex() == j.last_seq()
        assert j.index_items() == incremental
        assert j.recorded_steps() == steps


def test_reindex_repairs_a_damaged_index(jpath):
    with Journal(jpath) as j:
        j.record(1, rollout(1))
        j.record(2, rollout(2))
        good = j.index_items()
    key = items(jpath, "gen")[0][0]
    put_raw(jpath, "gen", key, (3).to_bytes(8, "big"))  # seq 3 is step 2: the index now lies
    with Journal(jpath) as j:
        with pytest.raises(IntegrityError, match="reindex"):
            j.lookup(1)
        assert any(p.kind == "index" for p in j.verify())
        j.reindex()
        assert j.index_items() == good and j.verify() == []


# -- integrity ---------------------------------------------------------------------------------------
def test_flipped_payload_byte_is_detected_on_load_naming_the_step(jpath):
    with Journal(jpath) as j:
        j.record(6, rollout(6))
    flip_byte(jpath, "payloads")
    with Journal(jpath) as j:
        with pytest.raises(IntegrityError, match="step 6") as info:
            j.load_output(j.lookup(6))
        assert info.value.step == 6
        (problem,) = j.verify()
        assert problem.kind == "payload" and problem.steps == (6,)


def test_broken_event_body_is_reported_by_verify(jpath):
    with Journal(jpath) as j:
        j.record(2, rollout(2))
    put_raw(jpath, "events", (2).to_bytes(8, "big"), b"\x81\xa4type\xa3bad")
    with Journal(jpath) as j:
        problems = j.verify()
        assert [p.kind for p in problems] == ["event", "index"]
        assert problems[1].steps == (2,)


def test_compressed_payloads_round_trip_and_verify(jpath):
    with Journal(jpath, compression="zstd") as j:
        rec = j.record(1, {"zeros": torch.zeros(10_000, dtype=torch.int64)})
        assert rec.event.output.compression == "zstd"
        assert rec.event.output.stored_nbytes < rec.event.output.nbytes / 10
        assert torch.equal(j.load_output(rec)["zeros"], torch.zeros(10_000, dtype=torch.int64))
        assert j.verify() == []


# -- event codec -------------------------------------------------------------------------------------
def test_event_codec_round_trips_every_event_type(jpath):
    with Journal(jpath) as j:
        src = j.record(1, rollout(1), input={"x": 1})
        j.record_replay(2, src)
        j.record_bypass(3)
        j.record_refusal(4, reason="no record")
        for seq, raw in j.raw_events():
            assert encode_event(decode_event(raw, seq=seq)) == bytes(raw)


def test_unknown_event_tag_and_newer_version_raise_typed_errors():
    with pytest.raises(UnknownEventTypeError, match="'made_up'"):
        decode_event(msgpack.packb({"type": "made_up", "v": 1}))
    with pytest.raises(UnsupportedSchemaVersionError, match="upgrade stepjournal"):
        decode_event(msgpack.packb({"type": "call_bypassed", "v": 99}))
    with pytest.raises(EventDecodeError, match="broken body"):
        decode_event(msgpack.packb({"type": "call_bypassed", "v": 1, "step": "x"}))
    with pytest.raises(EventDecodeError, match="not valid msgpack"):
        decode_event(b"\xc1\xc1")


# -- growth ------------------------------------------------------------------------------------------
def test_map_grows_by_itself_from_a_tiny_start(jpath):
    with Journal(jpath, map_size=64 * 1024) as j:
        for step in range(1, 6):
            j.record(step, {"x": torch.full((300_000,), step, dtype=torch.int64)})  # 2.4 MB each
        assert j.recorded_steps() == [1, 2, 3, 4, 5]
        assert torch.equal(j.load_output(j.lookup(5))["x"], torch.full((300_000,), 5))


# -- processes -----------------------------------------------------------------------------------------
def _child_records(path: str, steps: list[int]) -> None:
    with Journal(path, run="child") as j:
        for step in steps:
            j.record(step, rollout(step))


def test_a_second_process_sees_what_the_first_committed(jpath):
    with Journal(jpath, run="child") as j:
        assert j.recorded_steps() == []
        proc = worker_context().Process(target=_child_records, args=(jpath, [1, 2, 3]))
        proc.start()
        proc.join(120)
        assert proc.exitcode == 0
        assert j.recorded_steps() == [1, 2, 3]
        assert_rollout_equal(j.load_output(j.lookup(2)), rollout(2))


def _child_records_forever(path: str, lockstep) -> None:
    """Record until killed, waiting at each write into LMDB, each commit and after each record."""
    points = Lockstep(lockstep)
    with points.lmdb_writes(), Journal(path, run="k") as j:
        step = 0
        while True:
            step += 1
            j.record(step, {"x": torch.full((200_000,), step, dtype=torch.int64), "s": str(step)})
            points.point(f"recorded {step}")


def test_sigkill_during_appends_leaves_a_whole_journal(jpath):
    """Killed at a seeded point of its appends after three records (inside a record's transaction, its
    commit, or between records), the journal holds each record that returned and at most one more."""
    rng = random.Random(11)
    child = start_process(worker_context(), _child_records_forever, jpath)
    said = child.run_to(nth_after("recorded 3", rng.randint(1, 27)), release=rng.random() < 0.5)
    returned = max(int(label.split()[1]) for label in said if label.startswith("recorded "))
    with Journal(jpath, run="k") as j:
        steps = j.recorded_steps()
        assert returned <= len(steps) <= returned + 1 and steps == list(range(1, len(steps) + 1))
        assert j.verify() == []
        for step in steps:
            out = j.load_output(j.lookup(step))
            assert out["s"] == str(step) and torch.equal(out["x"], torch.full((200_000,), step))


def _fork_child_records_under_its_own_session(j: Journal, parent: str) -> None:
    own = j.session  # read before the child touches the journal
    j.record(2, rollout(2))
    sys.exit(0 if own not in (None, parent) and j.session == own else 3)


def test_a_fork_child_has_its_own_session_from_the_fork_on(jpath):
    """Not from its first use of the journal: two threads of the child making their first calls at once would
    each start a session there, and the record of the one whose session was replaced would name a session that
    no SessionOpened opens."""
    j = Journal(jpath, run="f")  # no call yet: the parent's SessionOpened is still held
    proc = mp.get_context("fork").Process(target=_fork_child_records_under_its_own_session, args=(j, j.session))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    j.record(1, rollout(1))
    opened = {event.session: event.pid for _, event in j.sessions()}
    assert opened == {j.session: os.getpid(), j.lookup(2).event.session: proc.pid}
    j.close()


def test_fork_child_reopens_instead_of_reusing_the_parent_environment(jpath):
    j = Journal(jpath, run="f")
    j.record(1, rollout(1))
    ctx = mp.get_context("fork")
    proc = ctx.Process(target=lambda: (j.record(2, rollout(2)), sys.exit(0 if j.recorded_steps() == [1, 2] else 3)))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert j.recorded_steps() == [1, 2]
    sessions = j.sessions()
    assert len(sessions) == 2 and sessions[1][1].pid == proc.pid
    j.close()
