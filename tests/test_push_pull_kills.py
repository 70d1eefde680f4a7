"""push and pull killed with SIGKILL at random moments against a real S3 server (moto on 127.0.0.1):
each resumes with nothing lost and nothing duplicated. A few kills each in the suite; `make soak` runs
fifty of each."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from s3_server import s3_env, s3_server, subprocess_env  # noqa: F401  (fixtures)
from stepjournal import Journal, clone, pull, push
from stepjournal._events import EventsImported
from stepjournal._object_client import Remote
from stepjournal._remote import journal_id

STEPS = 150  # + the session: 151 events

CHILD = textwrap.dedent("""
    import sys
    from stepjournal import pull, push
    import stepjournal._remote  # loaded before the parent is told we started
    print("started", flush=True)
    if sys.argv[1] == "push":
        push(sys.argv[2], sys.argv[3], segment_events=2)
    else:
        pull(sys.argv[3], sys.argv[2])
""")


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


def kill_children(verb, journal, url, server, kills, seed, observe):
    """Start `verb` in a child `kills` times, SIGKILL it at a random moment; `observe()` after each kill."""
    rng = random.Random(seed)
    env = subprocess_env(server)
    seen = []
    for _ in range(kills):
        child = subprocess.Popen([sys.executable, "-c", CHILD, verb, str(journal), url], env=env, stdout=subprocess.PIPE)
        assert child.stdout.readline() == b"started\n"
        time.sleep(rng.uniform(0.05, 0.6))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        seen.append(observe())
    return seen


def push_kill_loop(tmp_path, url, server, kills, seed):
    a, b = tmp_path / "a", tmp_path / "b"
    source, events = recorded(a)
    head_key = f"heads/{source}.json"

    def pushed_through():
        head = Remote(url).get(head_key, limit=1 << 20)
        return json.loads(head)["last_seq"] if head else 0

    seen = kill_children("push", a, url, server, kills, seed, pushed_through)
    assert any(0 < seq < len(events) for seq in seen), seen  # kills landed mid-push
    final = push(str(a), url, segment_events=2)
    assert final.last_seq == len(events) and push(str(a), url).events_sent == 0
    clone(url, str(b))
    assert imported(b) == [((source, seq), raw) for seq, raw in events]  # each once, in order, bit-identical


def pull_kill_loop(tmp_path, url, server, kills, seed):
    a, b = tmp_path / "a", tmp_path / "b"
    source, events = recorded(a)
    push(str(a), url, segment_events=2)
    Journal(str(b), session=False).close()

    def pulled_so_far():
        return len(imported(b))

    seen = kill_children("pull", b, url, server, kills, seed, pulled_so_far)
    assert any(0 < n < len(events) for n in seen), seen  # kills landed mid-pull
    pull(url, str(b))
    assert pull(url, str(b)).events_pulled == 0
    assert imported(b) == [((source, seq), raw) for seq, raw in events]  # each once, in order, bit-identical
    with Journal(str(b), readonly=True, run="exp") as journal:
        assert journal.recorded_steps() == list(range(1, STEPS + 1)) and journal.verify() == []


def test_a_push_killed_at_random_moments_resumes_with_nothing_lost_or_duplicated(tmp_path, s3_env, s3_server):
    push_kill_loop(tmp_path, s3_env, s3_server, kills=4, seed=19)


def test_a_pull_killed_at_random_moments_resumes_with_nothing_lost_or_duplicated(tmp_path, s3_env, s3_server):
    pull_kill_loop(tmp_path, s3_env, s3_server, kills=4, seed=23)


@pytest.mark.soak
def test_fifty_random_sigkills_of_push_lose_nothing_and_duplicate_nothing(tmp_path, s3_env, s3_server):
    push_kill_loop(tmp_path, s3_env, s3_server, kills=50, seed=1919)


@pytest.mark.soak
def test_fifty_random_sigkills_of_pull_lose_nothing_and_duplicate_nothing(tmp_path, s3_env, s3_server):
    pull_kill_loop(tmp_path, s3_env, s3_server, kills=50, seed=2323)
