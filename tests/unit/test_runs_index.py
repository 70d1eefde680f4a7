"""The runs index answers `runs` exactly as a scan of the log does, whatever wrote the log and however.

The scan (`summarize_runs` over ``journal.events()``) is the reference; the index is checked against it
after random recording, reindex, prune and compact, pull, a writer that does not keep the index, a
process killed while it appends, and on the 0.1.0 release journal.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepjournal import Journal
from stepjournal.events import SessionOpened
from stepjournal.index import summarize_runs
from stepjournal.sharing import pull, push
from stepjournal.upkeep import Retention, compact, prune
from stepjournal.storage._eventlog import EventLog  # private: the event log below the journal
from stepjournal.events._convert import encode_event  # private: raw event bytes, as stored
from stepjournal.events._events import CallBypassed  # private: event classes and maps, below the face
from stepjournal.index._projections import Projections  # private: the projections' internals

from kill_points import nth_after, start_script

DATA = Path(__file__).parent.parent / "data"
STAGES = (None, "generate", "reward", "score")
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# One call: (kind, step, gen_index, mode, stage).
call = st.tuples(
    st.sampled_from(["record", "record_no_output", "replay", "bypass", "refuse"]),
    st.integers(0, 30), st.integers(0, 1), st.sampled_from(["train", "validate"]), st.sampled_from(["generate", "reward"]),
)
# Sessions in order: (run key, its calls).
sessions = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.lists(call, max_size=12)), min_size=1, max_size=4)


def scan(journal: Journal, stage=None):
    pairs = journal.events()
    if stage is not None:
        pairs = ((seq, e) for seq, e in pairs if isinstance(e, SessionOpened) or getattr(e, "stage", None) == stage)
    return summarize_runs(pairs)


def index_dump(journal: Journal):
    """The raw ``runs`` database and its meta key (None: the journal has no runs index)."""
    store = journal._live()
    if store.db("runs") is None:
        return None
    with store.read() as txn:
        return [(bytes(k), bytes(v)) for k, v in txn.cursor(db=store.db("runs"))], txn.get(b"runs_index", db=store.db("meta"))


def assert_index_is_the_scan(path: str) -> None:
    with Journal(path, readonly=True) as journal:
        for stage in STAGES:
            assert journal.run_summaries(stage=stage) == scan(journal, stage)
        assert summarize_runs(journal) == scan(journal)
        assert [s.to_json() for s in journal.run_summaries()] == [s.to_json() for s in scan(journal)]


def assert_reindex_rebuilds_the_same_index(path: str) -> None:
    with Journal(path, session=False) as journal:
        kept = index_dump(journal)
        journal.reindex()
        assert index_dump(journal) == kept


def play(journal: Journal, calls) -> None:
    last = {}  # per stage, the latest call recorded with an output by this handle: what a replay serves
    for kind, step, gen_index, mode, stage in calls:
        where = dict(gen_index=gen_index, mode=mode, stage=stage)
        if kind == "record":
            journal.record(step, b"x" * (step + 1), **where)
            last[stage] = (step, where)
        elif kind == "record_no_output":
            journal.record(step, b"y", store_output=False, **where)
        elif kind == "replay":
            if stage in last:
                source = journal.lookup(last[stage][0], **last[stage][1])
                journal.record_replay(step, source, **where)
        elif kind == "bypass":
            journal.record_bypass(step, **where)
        else:
            journal.record_refusal(step, reason="no record", **where)


def record_sessions(path: str, plan) -> None:
    for run, calls in plan:
        with Journal(path, run=run, fingerprint={"run": run}, sync=False) as journal:
            play(journal, calls)


@SETTINGS
@given(plan=sessions)
def test_the_runs_index_equals_the_scan_after_random_recording_and_after_reindex(tmp_path_factory, plan):
    path = str(tmp_path_factory.mktemp("j") / "j")
    record_sessions(path, plan)
    assert_index_is_the_scan(path)
    assert_reindex_rebuilds_the_same_index(path)


def test_the_runs_index_equals_the_scan_after_prune_and_compact(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path, run="exp", sync=False) as journal:
        for step in range(1, 9):
            journal.record(step, b"x" * 100, stage="generate")
            journal.record(step, b"r" * 10, stage="reward")
        journal.record_bypass(9, reason="validation")
        plan = prune(journal, Retention(keep_last=2))
        assert plan.releases  # the prune wrote PayloadsReleased events
    assert_index_is_the_scan(path)
    compact(path)
    assert_index_is_the_scan(path)
    assert_reindex_rebuilds_the_same_index(path)


def test_the_runs_index_equals_the_scan_after_pull(tmp_path):
    remote = (tmp_path / "remote").resolve().as_uri()
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with Journal(a, run="exp1", sync=False) as journal:
        play(journal, [("record", 1, 0, "train", "generate"), ("replay", 2, 0, "train", "generate"),
                       ("refuse", 7, 0, "train", "reward")])
    with Journal(b, run="exp2", sync=False) as journal:
        play(journal, [("record", 5, 0, "train", "generate"), ("bypass", 5, 0, "validate", "generate")])
    push(a, remote)
    pull(remote, b)  # appends an EventsImported and the pulled events
    assert_index_is_the_scan(b)
    with Journal(b, readonly=True) as journal:
        assert [s.run for s in journal.run_summaries()] == ["exp2", "exp1"]


def append_without_the_index(journal: Journal, events) -> None:
    """Append as a writer that does not know the runs index (an older stepjournal) would."""
    store = journal._live()

    def fn(txn):
        for seq, event in zip(EventLog.append_in(txn, store, [encode_event(e) for e in events]), events):
            Projections.apply_in(txn, store, seq, event, runs=False)

    store.write(fn)


def test_events_a_writer_without_the_index_appended_are_folded_in_by_readers_and_by_the_next_append(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path, run="exp", sync=False) as journal:
        journal.record(1, b"x")
        unindexed = [CallBypassed(session=journal.session, run="other", step=s, gen_index=0, mode="validate",
                                  stage="reward", policy="manual", reason="r", ts=time.time(), duration_s=0.0)
                     for s in (3, 4)]
        append_without_the_index(journal, unindexed)
        assert_index_is_the_scan(path)  # a reader folds the tail the index lacks
        journal.record(2, b"x")  # this append first folds in what it lacks
        with_tail = index_dump(journal)
        journal.reindex()
        assert index_dump(journal) == with_tail
    with Journal(path, run="exp", session=False) as journal:
        append_without_the_index(journal, unindexed[:1])
    assert_reindex_rebuilds_the_same_index(path)  # the writable open caught up first
    assert_index_is_the_scan(path)


_WRITER = r"""
import sys
from kill_points import Lockstep
from stepjournal import Journal
points = Lockstep.inherited()
with points.lmdb_writes(), Journal(sys.argv[1], run="killed", sync=False) as journal:
    step = 0
    while True:
        step += 1
        journal.record(step, b"x" * 64, stage="generate" if step % 3 else "reward")
        if step % 5 == 0:
            journal.record_bypass(step, reason="validation")
        points.point(f"step {step}")
"""


def test_a_process_killed_while_it_appends_leaves_the_index_equal_to_the_log(tmp_path):
    """Killed at a seeded point of its appends past step 30 (a write, a commit, between records)."""
    path = str(tmp_path / "j")
    with Journal(path, run="before", sync=False) as journal:
        journal.record(1, b"x")
    rng = random.Random(30)
    said = start_script(_WRITER, path).run_to(nth_after("step 30", rng.randint(1, 40)), release=rng.random() < 0.5)
    assert "step 30" in said
    assert_index_is_the_scan(path)
    with Journal(path, run="after", sync=False) as journal:
        journal.record(99, b"x")
    assert_index_is_the_scan(path)


def test_the_release_journal_answers_runs_by_a_scan_read_only_and_gets_the_index_when_opened_for_writing(tmp_path):
    target = tmp_path / "journal-0.1.0"
    target.mkdir(mode=0o700)
    shutil.copy2(DATA / "journal-0.1.0" / "data.mdb", target / "data.mdb")
    before = (target / "data.mdb").read_bytes()
    with Journal(str(target), readonly=True) as journal:
        assert index_dump(journal) is None  # 0.1.0 had no runs index
        summaries = journal.run_summaries()
        assert summaries == scan(journal) and summaries and summaries[0].calls > 0
    assert (target / "data.mdb").read_bytes() == before
    assert_index_is_the_scan(str(target))
    with Journal(str(target), session=False) as journal:
        assert index_dump(journal) is not None
        assert journal.run_summaries() == summaries
    assert_index_is_the_scan(str(target))
    assert os.path.isfile(target / "data.mdb")
