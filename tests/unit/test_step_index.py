"""The step and rank indexes answer like a sorted list of the recorded steps, without holding one."""

from __future__ import annotations

import bisect

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepjournal import Journal
from stepjournal.policies import JournalView, StepRanges

# Calls to record: (step, gen_index, mode), in any order, repeats included.
calls = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 2), st.sampled_from(["train", "validate"])), max_size=40
)
probe = st.integers(-2, 44)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def record_all(path, recorded, **kw) -> Journal:
    j = Journal(path, sync=False, **kw)
    for step, gen_index, mode in recorded:
        j.record(step, b"x", gen_index=gen_index, mode=mode)
    return j


def model(recorded, mode="train"):
    return sorted({s for s, _, m in recorded if m == mode})


def check_against_model(j: Journal, recorded, probes, start, stop) -> None:
    for mode in ("train", "validate"):
        steps = model(recorded, mode)
        assert j.recorded_steps(mode=mode) == steps
        assert j.step_count(mode=mode) == len(steps)
        for n in range(-len(steps), len(steps)):
            assert j.nth_step(n, mode=mode) == steps[n]
        with pytest.raises(IndexError):
            j.nth_step(len(steps), mode=mode)
        for p in probes:
            i = bisect.bisect_left(steps, p)
            assert j.nearest_below(p, mode=mode) == (steps[i - 1] if i > 0 else None)
            k = bisect.bisect_right(steps, p)
            assert j.nearest_above(p, mode=mode) == (steps[k] if k < len(steps) else None)
            indices = sorted({g for s, g, m in recorded if m == mode and s == p})
            assert j.recorded_indices(p, mode=mode) == indices
        inside = [s for s in steps if s >= start and (stop is None or s <= stop)]
        assert j.recorded_steps(mode=mode, start=start, stop=stop) == inside
        assert j.step_count(mode=mode, start=start, stop=stop) == len(inside)
        for n in range(-len(inside), len(inside)):
            assert j.nth_step(n, mode=mode, start=start, stop=stop) == inside[n]
        with pytest.raises(IndexError):
            j.nth_step(-len(inside) - 1, mode=mode, start=start, stop=stop)


@SETTINGS
@given(recorded=calls, probes=st.lists(probe, max_size=8), start=st.integers(0, 42), span=st.none() | st.integers(-2, 20))
def test_journal_step_queries_equal_a_sorted_list_of_the_recorded_steps(tmp_path_factory, recorded, probes, start, span):
    stop = None if span is None else start + span
    with record_all(str(tmp_path_factory.mktemp("j")), recorded) as j:
        check_against_model(j, recorded, probes, start, stop)


@SETTINGS
@given(recorded=calls)
def test_a_rebuilt_rank_index_equals_the_incremental_one_whatever_the_recording_order(tmp_path_factory, recorded):
    with record_all(str(tmp_path_factory.mktemp("j")), recorded) as j:
        incremental = (j.index_items(), j.rank_items())
        j.reindex()
        assert (j.index_items(), j.rank_items()) == incremental
        # Keys sort by (run, mode) first: "train" before "validate".
        assert [step for _, step in j.rank_items()] == model(recorded, "train") + model(recorded, "validate")


def scopes():
    one = st.builds(lambda a, n, k: (a, None if n is None else a + n, k), st.integers(0, 30), st.none() | st.integers(0, 15), st.integers(1, 3))
    return st.lists(one, min_size=1, max_size=3)


def scope_text(parts) -> str:
    out = []
    for a, b, k in parts:
        text = f"{a}-{'' if b is None else b}"
        out.append(text if k == 1 else f"{text}:{k}")
    return ",".join(out)


@SETTINGS
@given(recorded=calls, parts=scopes(), probes=st.lists(probe, max_size=8))
def test_a_restricted_view_answers_as_if_only_the_steps_in_scope_were_recorded(tmp_path_factory, recorded, parts, probes):
    with record_all(str(tmp_path_factory.mktemp("j")), recorded) as j:
        scope = StepRanges.parse(scope_text(parts))
        view = JournalView(j).restricted(scope)
        visible = [s for s in model(recorded) if s in scope]
        assert view.recorded_steps() == visible
        assert view.step_count() == len(visible)
        for n in range(-len(visible), len(visible)):
            assert view.nth_step(n) == visible[n]
        for p in probes:
            i = bisect.bisect_left(visible, p)
            assert view.nearest_below(p) == (visible[i - 1] if i > 0 else None)
            k = bisect.bisect_right(visible, p)
            assert view.nearest_above(p) == (visible[k] if k < len(visible) else None)


def drop_rank_index(path: str) -> None:
    """Make the journal look as one written before the rank index existed."""
    env = lmdb.open(path, max_dbs=16, subdir=True)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"steps", txn=txn), delete=True)
        txn.delete(b"steps_index", db=env.open_db(b"meta", txn=txn))
    env.close()


def test_a_journal_without_the_rank_index_answers_read_only_and_builds_it_when_opened_for_writing(tmp_path):
    path = str(tmp_path / "j")
    recorded = [(5, 0, "train"), (2, 1, "train"), (9, 0, "train"), (2, 0, "train"), (7, 0, "validate")]
    record_all(path, recorded).close()
    drop_rank_index(path)
    with Journal(path, readonly=True) as j:
        assert j.rank_items() == []
        check_against_model(j, recorded, [0, 2, 3, 9, 10], 3, 8)
    with Journal(path) as j:
        assert [step for _, step in j.rank_items()] == [2, 5, 9, 7]
        check_against_model(j, recorded, [0, 2, 3, 9, 10], 3, 8)


def test_steps_recorded_by_another_handle_are_seen_at_once(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path, sync=False) as reader, Journal(path, sync=False) as writer:
        writer.record(4, b"x")
        assert reader.step_count() == 1 and reader.nth_step(-1) == 4
        writer.record(2, b"x")
        assert reader.recorded_steps() == [2, 4] and reader.nearest_below(4) == 2
