"""SIGKILL during prune and during compact, at random moments: the journal verifies, no kept record is
lost, no event is half-written, and a second run finishes the job. A few kills here; `make soak` runs 50
of each."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from stepjournal import Journal, PayloadsReleased, Retention, compact, prune

STEPS = 300
RULES = dict(keep_last=20, pin={1, 2})
KEPT = [1, 2, *range(STEPS - 19, STEPS + 1)]

_PRUNE = (
    "import sys\nfrom stepjournal import Journal, Retention, prune\n"
    "journal = Journal(sys.argv[1], session=False)\nprint('ready', flush=True)\n"
    f"prune(journal, Retention(**{RULES!r}))\nprint('done', flush=True)\n"
)
_COMPACT = (
    "import sys\nfrom stepjournal import compact\nprint('ready', flush=True)\n"
    "compact(sys.argv[1])\nprint('done', flush=True)\n"
)


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


def _kill_at_random(script: str, path: str, rng: random.Random, window: float) -> bool:
    """Run `script` on `path` in a new process and SIGKILL it at a random moment; True when it finished first."""
    child = subprocess.Popen([sys.executable, "-c", script, path], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0, window))
        child.send_signal(signal.SIGKILL)
        out = child.communicate(timeout=60)[0]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return "done" in out


def _check_whole(path: str, *, pruned: bool) -> None:
    with Journal(path, session=False) as journal:
        assert journal.verify() == []
        for step in KEPT:
            assert torch.equal(journal.load_output(journal.lookup(step))["x"], _value(step)["x"])
        releases = [e for _, e in journal.events(types=[PayloadsReleased])]
        assert len(releases) in ((STEPS - len(KEPT),) if pruned else (0, STEPS - len(KEPT)))  # all or none
        # A second run finishes the job.
        prune(journal, Retention(**RULES))
        assert journal.recorded_steps() == KEPT and journal.verify() == []
    compact(path)
    with Journal(path, readonly=True) as journal:
        assert journal.recorded_steps() == KEPT and journal.verify() == []


def _window(script: str, path: str) -> float:
    """How long the work takes once the child is ready (what the kills are spread over)."""
    child = subprocess.Popen([sys.executable, "-c", script, path], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    started = time.perf_counter()
    assert child.stdout.readline() == "done\n"
    took = time.perf_counter() - started
    child.wait()
    return took


def _trials(template, tmp_path, trials: int, seed: int) -> None:
    whole, pruned = template
    rng = random.Random(seed)
    windows = {}
    for kind, script, source in (("prune", _PRUNE, whole), ("compact", _COMPACT, pruned)):
        probe = str(tmp_path / f"probe-{kind}")
        shutil.copytree(source, probe)
        windows[kind] = _window(script, probe)
    finished = 0
    for trial in range(trials):
        for kind, script, source in (("prune", _PRUNE, whole), ("compact", _COMPACT, pruned)):
            path = str(tmp_path / f"{kind}-{trial}")
            shutil.copytree(source, path)
            finished += _kill_at_random(script, path, rng, 0.8 * windows[kind])
            _check_whole(path, pruned=kind == "compact")
            shutil.rmtree(path)
    assert finished < 2 * trials, windows  # some kills landed while the work ran


def test_a_few_kills_during_prune_and_compact_leave_a_whole_journal_that_a_second_run_finishes(template, tmp_path):
    _trials(template, tmp_path, trials=2, seed=18)


@pytest.mark.soak
def test_fifty_kills_during_prune_and_fifty_during_compact_leave_whole_journals(template, tmp_path):
    _trials(template, tmp_path, trials=50, seed=1818)
