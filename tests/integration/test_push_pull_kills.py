"""push and pull killed with SIGKILL at seeded points of their work against a real S3 server (moto on
127.0.0.1): each resumes with nothing lost and nothing duplicated. A few kills each in the suite;
`make soak` runs fifty of each.

The child stops at each `progress` callback (after each segment pushed, each run pulled) and waits
for the parent (tests/kill_points.py), which kills it there or right after letting it go on (the kill
then lands inside the next segment's uploads or the next run's commit): never after a delay.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from kill_points import kill_plan, start_script
from s3_server import s3_env, s3_server, subprocess_env  # noqa: F401  (fixtures)
from stepjournal import Journal
from stepjournal.sharing import clone, pull, push
from stepjournal.events._events import EventsImported  # private: event classes and maps, below the face
from stepjournal.payloads._object_client import Remote  # private: the object client under test
from stepjournal.sharing._remote import journal_id  # private: the remote layout

STEPS = 150  # + the session: 151 events
SEGMENT = 2  # events a segment holds: a push's progress points, and a pull's (one run a segment)

CHILD = """
import sys
from kill_points import Lockstep
from stepjournal.sharing import pull, push
lockstep = Lockstep.inherited()
if sys.argv[1] == "push":
    push(sys.argv[2], sys.argv[3], segment_events=int(sys.argv[4]), progress=lockstep.progress)
else:
    pull(sys.argv[3], sys.argv[2], progress=lockstep.progress)
"""


def recorded(path):
    with Journal(str(path), run="exp") as journal:
        for step in range(1, STEPS + 1):
            journal.record(step, {"ids": torch.arange(64) * step})
    with Journal(str(path), readonly=True) as journal:
        return journal_id(journal), [(seq, bytes(raw)) for seq, raw in journal.raw_events()]


def imported(path):
    """[((source, source seq), stored bytes)] of every pulled event, in the journal's order (duplicates kept)."""
    out = []
    with Journal(str(path), readonly=True) as journal:
        raws = dict(journal.raw_events())
        for seq, event in journal.events(types=[EventsImported]):
            for offset in range(event.source_last - event.source_first + 1):
                out.append(((event.source, event.source_first + offset), bytes(raws[seq + 1 + offset])))
    return out


def done_of(label: str, total: int) -> int:
    """The events of all `total` a progress point says are done: push counts from the journal's start
    (``"push 24/151"``), pull from where this pull started (``"pull 1d48c715 4/131"``: 20 + 4)."""
    done, of = map(int, label.rsplit(" ", 1)[1].split("/"))
    return total - of + done


def kill_children(verb, journal, url, server, total, kills, seed, observe):
    """Start `verb` in a child `kills` times and SIGKILL it at the progress point `kill_plan` chose.

    Point p is the one after p segments (p * SEGMENT events); points 1 .. (total - 1) // SEGMENT are
    mid-operation (the last point, all `total` events, is not). After each kill `observe()` must say
    exactly how far the work got: to the point (killed there), or to the next (killed on the way).
    """
    points = (total - 1) // SEGMENT
    env = subprocess_env(server)
    seen = []
    for at, release in kill_plan(random.Random(seed), points, kills):
        child = start_script(CHILD, verb, str(journal), url, str(SEGMENT), env=env)
        said = child.run_to(lambda label: done_of(label, total) >= at * SEGMENT, release=release)
        got = observe()
        reached = done_of(said[-1], total)
        assert 0 < got < total, (at, release, said[-3:], got)  # the kill landed mid-operation
        if release and reached == at * SEGMENT:
            assert got in (at * SEGMENT, (at + 1) * SEGMENT), (at, said[-3:], got)
        else:  # killed while it waited at the point it said last
            assert got == reached == (at + release) * SEGMENT, (at, release, said[-3:], got)
        seen.append(got)
    return seen


def push_kill_loop(tmp_path, url, server, kills, seed):
    a, b = tmp_path / "a", tmp_path / "b"
    source, events = recorded(a)
    head_key = f"heads/{source}.json"

    def pushed_through():
        head = Remote(url).get(head_key, limit=1 << 20)
        return json.loads(head)["last_seq"] if head else 0

    seen = kill_children("push", a, url, server, len(events), kills, seed, pushed_through)
    assert len(seen) == kills and seen == sorted(seen), seen
    final = push(str(a), url, segment_events=SEGMENT)
    assert final.last_seq == len(events) and push(str(a), url).events_sent == 0
    clone(url, str(b))
    assert imported(b) == [((source, seq), raw) for seq, raw in events]  # each once, in order, bit-identical


def pull_kill_loop(tmp_path, url, server, kills, seed):
    a, b = tmp_path / "a", tmp_path / "b"
    source, events = recorded(a)
    push(str(a), url, segment_events=SEGMENT)
    Journal(str(b), session=False).close()

    def pulled_so_far():
        return len(imported(b))

    seen = kill_children("pull", b, url, server, len(events), kills, seed, pulled_so_far)
    assert len(seen) == kills and seen == sorted(seen), seen
    pull(url, str(b))
    assert pull(url, str(b)).events_pulled == 0
    assert imported(b) == [((source, seq), raw) for seq, raw in events]  # each once, in order, bit-identical
    with Journal(str(b), readonly=True, run="exp") as journal:
        assert journal.recorded_steps() == list(range(1, STEPS + 1)) and journal.verify() == []


def test_a_push_killed_at_random_points_resumes_with_nothing_lost_or_duplicated(tmp_path, s3_env, s3_server):
    push_kill_loop(tmp_path, s3_env, s3_server, kills=4, seed=19)


def test_a_pull_killed_at_random_points_resumes_with_nothing_lost_or_duplicated(tmp_path, s3_env, s3_server):
    pull_kill_loop(tmp_path, s3_env, s3_server, kills=4, seed=23)


@pytest.mark.soak
def test_fifty_random_sigkills_of_push_lose_nothing_and_duplicate_nothing(tmp_path, s3_env, s3_server):
    push_kill_loop(tmp_path, s3_env, s3_server, kills=50, seed=1919)


@pytest.mark.soak
def test_fifty_random_sigkills_of_pull_lose_nothing_and_duplicate_nothing(tmp_path, s3_env, s3_server):
    pull_kill_loop(tmp_path, s3_env, s3_server, kills=50, seed=2323)
