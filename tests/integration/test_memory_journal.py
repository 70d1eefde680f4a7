"""`MemoryJournal`, folded from a real journal's own event log, answers every query of a `JournalView` as that
journal does: the in-memory view the pure policy tests use is the journal's, not a likeness of it."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepjournal import Journal
from stepjournal.policies import JournalView, StepRanges
from stepjournal.policies.testing import MemoryJournal, memory_view

CALL = st.tuples(st.integers(0, 12), st.integers(0, 2), st.sampled_from(["train", "validate"]),
                 st.sampled_from(["generate", "reward"]), st.booleans())
SCOPES = st.sampled_from([None, "1-5", "0-12:3", "2,7,9-", "4-4"])


def answers(view: JournalView) -> dict:
    """Everything a policy may ask `view`, for steps -1 to 14."""
    steps = view.recorded_steps()
    probes = range(-1, 15)
    return {
        "steps": steps,
        "count": view.step_count(),
        "nth": [view.nth_step(n) for n in range(-len(steps), len(steps))],
        "below": [view.nearest_below(p) for p in probes],
        "above": [view.nearest_above(p) for p in probes],
        "indices": [view.recorded_indices(p) for p in probes if p >= 0],
        "lookup": [view.lookup(p, i) for p in probes if p >= 0 for i in range(3)],
        "serve_from": [view.serve_from(p, i) for p in probes if p >= 0 for i in range(4)],
        "not_stored": [view.not_stored(p, i) for p in probes if p >= 0 for i in range(3)],
        "released": [view.released(p, i) for p in probes if p >= 0 for i in range(3)],
    }


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(CALL, max_size=25), scope=SCOPES)
def test_a_memory_journal_of_a_journals_events_answers_every_view_query_as_the_journal_does(tmp_path_factory, calls,
                                                                                            scope):
    path = str(tmp_path_factory.mktemp("j") / "j")
    with Journal(path, sync=False) as journal:
        for step, index, mode, stage, stored in calls:
            journal.record(step, {"step": step}, gen_index=index, mode=mode, stage=stage, store_output=stored,
                           reason="generated, not stored: a test" if not stored else "recorded")
        memory = MemoryJournal([event for _, event in journal.events()])
        for mode in ("train", "validate"):
            for stage in ("generate", "reward"):
                real, held = JournalView(journal, mode=mode, stage=stage), memory_view(memory, mode=mode, stage=stage)
                if scope is not None:
                    real, held = real.restricted(StepRanges(scope)), held.restricted(StepRanges(scope))
                assert answers(held) == answers(real)
