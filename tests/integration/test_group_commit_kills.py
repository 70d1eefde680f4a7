"""SIGKILL of a process whose threads record at once, at observed points of a shared commit: every
acknowledged record is in the journal exactly once, and the journal verifies.

The child's 16 threads record 1 KiB tool responses; each writes a record's id to an acknowledgement
file once `record` returned (the kernel keeps what it wrote when the process is killed). The child's
appender tells the parent each group it takes (before its commit) and each group it committed (durable,
before its callers are acknowledged), and waits there for the parent (tests/kill_points.py), which kills
it at the point chosen, or right after letting it go on (inside the commit and its fsync). The first
leader waits until the other 15 threads are queued, and queues its next record only once the second group
is taken, so the second group holds those 15 records. Each test runs twice: with 16 threads calling
`record`, and with 16 coroutines of one event loop awaiting `arecord` (the leader then commits in a worker
thread, where the parent stops and kills it).
"""

from __future__ import annotations

import collections
from typing import List, Set, Tuple

import pytest

from kill_points import HANG_S, start_script
from stepjournal import Journal
from stepjournal.events import GenerationRecorded

THREADS = 16
PER_THREAD = 6

_SETUP = f"""
import os, sys, threading
from kill_points import Lockstep
from stepjournal import Journal
from stepjournal.storage._appender import appender_of

lockstep = Lockstep.inherited()
path, acks = sys.argv[1], sys.argv[2]
ack_fd = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
journal = Journal(path)
queued = threading.Condition()
state = {{"queued": 0, "first": True}}
first_taken = threading.Event()  # the first leader took its group (of one)
second_taken = threading.Event()  # the second group is taken: its records are the 15 queued, none later

def observe(point, count):
    if point == "queued":
        with queued:
            state["queued"] = count
            queued.notify_all()
        return
    if point == "taken" and state["first"]:
        state["first"] = False
        first_taken.set()
        with queued:  # the others queue behind the first leader: the next group holds them all
            assert queued.wait_for(lambda: state["queued"] >= {THREADS - 1}, {HANG_S})
    elif point == "taken":
        second_taken.set()
    lockstep.point(f"{{point}} {{count}}")

appender_of(journal).observe = observe
"""

_THREADS = _SETUP + f"""def work(t):
    for i in range({PER_THREAD}):
        journal.record(1, {{"text": "x" * 1024}}, gen_index=t * 1000 + i, stage="tool:calc")
        os.write(ack_fd, f"{{t * 1000 + i}}\\n".encode())
        # The first leader, acknowledged, queues again only once the second group is taken, so that group
        # holds the 15 others whichever thread the scheduler runs first.
        assert second_taken.wait({HANG_S})

threads = [threading.Thread(target=work, args=(t,)) for t in range({THREADS})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
journal.close()
"""


_COROUTINES = _SETUP + f"""
import asyncio

async def work(t):
    for i in range({PER_THREAD}):
        await journal.arecord(1, {{"text": "x" * 1024}}, gen_index=t * 1000 + i, stage="tool:calc")
        os.write(ack_fd, f"{{t * 1000 + i}}\\n".encode())
        assert await asyncio.to_thread(second_taken.wait, {HANG_S})  # as the threads do, without blocking the loop

async def main():
    # The others start once the first leader took its group: coroutines started together would all queue
    # before it takes (the loop runs each to its first wait), and the first group would hold all 16.
    first = asyncio.ensure_future(work(0))
    assert await asyncio.to_thread(first_taken.wait, {HANG_S})
    await asyncio.gather(first, *(work(t) for t in range(1, {THREADS})))

asyncio.run(main())
journal.close()
"""
_CHILDREN = {"threads": _THREADS, "coroutines": _COROUTINES}


@pytest.fixture(params=sorted(_CHILDREN))
def child(request) -> str:
    """The child's script: its callers are threads or coroutines."""
    return _CHILDREN[request.param]


def _run_and_kill(tmp_path, script: str, stop, *, release: bool = False) -> Tuple[str, Set[int], List[str]]:
    path, acks = str(tmp_path / "journal"), str(tmp_path / "acks")
    seen = start_script(script, path, acks).run_to(stop, release=release)
    with open(acks) as f:
        acked = {int(line) for line in f.read().split()}
    return path, acked, seen


def _committed(seen: List[str]) -> int:
    """The records of the groups the child said were committed."""
    return sum(int(label.split()[1]) for label in seen if label.startswith("committed "))


def _check(path: str, acked: Set[int]) -> collections.Counter:
    with Journal(path) as journal:  # opened for writing, as the restarted job would
        counts = collections.Counter(e.gen_index for _s, e in journal.events(types=[GenerationRecorded]))
        assert journal.verify() == []
        assert len(journal.sessions()) == 1
    assert acked <= set(counts), f"acknowledged but lost: {sorted(acked - set(counts))}"
    assert set(counts.values()) == {1}, f"written twice: {[k for k, n in counts.items() if n > 1]}"
    return counts


def _group_point(kind: str):
    return lambda label: label.startswith(kind + " ") and int(label.split()[1]) > 1


def test_a_kill_after_a_shared_commit_before_its_acknowledgements_keeps_the_group_once(tmp_path, child):
    path, acked, seen = _run_and_kill(tmp_path, child, _group_point("committed"))
    assert seen[-1] == f"committed {THREADS - 1}"
    counts = _check(path, acked)
    assert sum(counts.values()) == _committed(seen)  # the group is in, though nobody was acknowledged for it


def test_a_kill_before_a_shared_commit_writes_nothing_of_the_group(tmp_path, child):
    path, acked, seen = _run_and_kill(tmp_path, child, _group_point("taken"))
    assert seen[-1] == f"taken {THREADS - 1}"
    counts = _check(path, acked)
    assert sum(counts.values()) == _committed(seen)


@pytest.mark.parametrize("nth_group", [2, 4, 7])
def test_a_kill_inside_a_shared_commit_loses_no_acknowledged_record(tmp_path, child, nth_group):
    """Released at the n-th group taken (the 2nd holds 15 records; 96 records make 7 groups at least, 16 at
    most in each after the first): the kill lands inside its commit, its fsync, or after."""
    taken = [0]

    def stop(label: str) -> bool:
        taken[0] += label.startswith("taken ")
        return taken[0] == nth_group and label.startswith("taken ")

    path, acked, seen = _run_and_kill(tmp_path, child, stop, release=True)
    counts = _check(path, acked)
    last = max(i for i, label in enumerate(seen) if label.startswith("taken "))
    group, before = int(seen[last].split()[1]), _committed(seen[:last])
    assert sum(counts.values()) in (before, before + group)  # the group whole or not at all


def test_the_child_records_everything_when_not_killed(tmp_path, child):
    """The same child run to its end: every record acknowledged, once (so the kills above cut real work)."""
    path, acks = str(tmp_path / "journal"), str(tmp_path / "acks")
    start_script(child, path, acks).finish()
    with open(acks) as f:
        acked = {int(line) for line in f.read().split()}
    assert acked == {t * 1000 + i for t in range(THREADS) for i in range(PER_THREAD)}
    assert sum(_check(path, acked).values()) == THREADS * PER_THREAD
