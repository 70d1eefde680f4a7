"""SIGKILL during prune and during compact, at seeded points of their work: the journal verifies, no
kept record is lost, no event is half-written, and a second run finishes the job. A few kills here;
`make soak` runs 50 of each.

The child stops before each write into LMDB and around its commit (prune: one transaction), or
before each filesystem step in the journal's folder (compact), and waits for the parent
(tests/kill_points.py), which kills it at one of those points or right after letting it go on from
there (inside the commit, the copy, an fsync): never after a delay.
"""

from __future__ import annotations

import random
import shutil

import pytest
import torch

from kill_points import kill_plan, start_script
from stepjournal import Journal
from stepjournal.events import PayloadsReleased
from stepjournal.upkeep import Retention, compact, prune

STEPS = 300
RULES = dict(keep_last=20, pin={1, 2})
KEPT = [1, 2, *range(STEPS - 19, STEPS + 1)]

_PRUNE = f"""
import sys
from kill_points import Lockstep
from stepjournal import Journal
from stepjournal.upkeep import Retention, prune
lockstep = Lockstep.inherited()
journal = Journal(sys.argv[1], session=False)
with lockstep.lmdb_writes():
    prune(journal, Retention(**{RULES!r}))
"""
_COMPACT = """
import sys
from kill_points import Lockstep
from stepjournal.upkeep import compact
watch = Lockstep.inherited().filesystem(sys.argv[1])
watch(True)
compact(sys.argv[1])
"""


def _value(step: int) -> dict:
    return {"x": torch.full((2048,), float(step)), "prompt": torch.ones(16)}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A journal of STEPS steps (unpruned) and a copy of it already pruned, built once."""
    root = tmp_path_factory.mktemp("kills")
    whole = str(root / "whole")
    with Journal(whole) as journal:
        for step in range(1, STEPS + 1):
            journal.record(step, _value(step), input={"prompt": torch.ones(16)})
    pruned = str(root / "pruned")
    shutil.copytree(whole, pruned)
    with Journal(pruned, session=False) as journal:
        prune(journal, Retention(**RULES))
    return whole, pruned


def _check_whole(path: str, *, pruned: bool, committed: bool | None = None) -> None:
    """`pruned`: the copy was pruned already; `committed`: whether the killed prune committed (None: either)."""
    with Journal(path, session=False) as journal:
        assert journal.verify() == []
        for step in KEPT:
            assert torch.equal(journal.load_output(journal.lookup(step))["x"], _value(step)["x"])
        releases = [e for _, e in journal.events(types=[PayloadsReleased])]
        everything = STEPS - len(KEPT)  # all or none are released
        assert len(releases) in {True: (everything,), False: (0,), None: (0, everything)}[pruned or committed]
        # A second run finishes the job.
        prune(journal, Retention(**RULES))
        assert journal.recorded_steps() == KEPT and journal.verify() == []
    compact(path)
    with Journal(path, readonly=True) as journal:
        assert journal.recorded_steps() == KEPT and journal.verify() == []


def _trials(template, tmp_path, trials: int, seed: int) -> None:
    whole, pruned = template
    rng = random.Random(seed)
    for kind, script, source in (("prune", _PRUNE, whole), ("compact", _COMPACT, pruned)):
        probe = str(tmp_path / f"probe-{kind}")
        shutil.copytree(source, probe)
        points = start_script(script, probe).finish()  # the points the work has, all answered
        assert len(points) > 3, points
        # One kill in each of `trials` stretches of the points (early, middle and late); with more
        # trials than points, every point, again and again.
        plan: list = []
        while len(plan) < trials:
            plan += kill_plan(rng, len(points), min(len(points), trials - len(plan)))
        if kind == "prune":  # and where all or none is decided: inside the commit (released), after it
            assert points[-2:] == ["lmdb commit", "lmdb committed"], points[-3:]
            plan += [(len(points) - 1, True), (len(points), False)]
        for trial, (at, release) in enumerate(plan):
            path = str(tmp_path / f"{kind}-{trial}")
            shutil.copytree(source, path)
            said = start_script(script, path).kill_at(at, release=release)
            assert said[:at] == points[:at]  # the same work, killed at its `at`-th point
            committed = "lmdb committed" in said or (None if release else False)
            _check_whole(path, pruned=kind == "compact", committed=committed if kind == "prune" else None)
            shutil.rmtree(path)


def test_a_few_kills_during_prune_and_compact_leave_a_whole_journal_that_a_second_run_finishes(template, tmp_path):
    _trials(template, tmp_path, trials=3, seed=18)


@pytest.mark.soak
def test_fifty_kills_during_prune_and_fifty_during_compact_leave_whole_journals(template, tmp_path):
    _trials(template, tmp_path, trials=50, seed=1818)
