"""Attacks on `Journal.arecord`'s share of the group commit: no caller waits forever, whatever the event loop
of a coroutine that leads (or is handed the lead) does meanwhile.

Each scenario runs in a child process, because a caller that waits forever keeps its thread (and the process)
alive: the parent bounds the child's run, and a correct appender finishes it in milliseconds. The order of
events in each child is made by asyncio's FIFO scheduling, a one-worker executor and observed points of the
appender (`Appender.observe`), never by a sleep.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kill_points import HANG_S, child_env
from stepjournal import Journal

# A bound on a child's run, so that a caller waiting forever fails the test instead of hanging it: the house's
# bound (a fresh interpreter importing torch beside a loaded suite takes minutes), no measure of the work.
BOUND_S = HANG_S

_HEAD = """
import asyncio, concurrent.futures, os, sys, threading
from stepjournal import Journal
from stepjournal.storage._appender import appender_of
journal = Journal(sys.argv[1])

def rec(index):
    return journal.record(1, {"t": index}, gen_index=index, stage="tool:calc").seq

def arec(index):
    return journal.arecord(1, {"t": index}, gen_index=index, stage="tool:calc")
"""


# The first group is held at its "taken" point until `go` is set; `queued(count)` returns once `count` records
# wait in the queue.
_GATED = """
taken, changed, state = threading.Event(), threading.Condition(), {"queued": 0}
def observe(point, count):
    if point == "queued":
        with changed:
            state["queued"] = count
            changed.notify_all()
    elif point == "taken" and not taken.is_set():
        taken.set()
        assert go.wait(600)
appender_of(journal).observe = observe
def queued(count):
    with changed:
        assert changed.wait_for(lambda: state["queued"] >= count, 600)
"""

# Before anything imports `concurrent.futures`: `go` is set as the interpreter exits, once its executors took
# their last work (`threading._register_atexit` calls the hooks registered last first).
_AT_EXIT = """
import threading
go = threading.Event()
threading._register_atexit(go.set)
"""


def _run_child(body: str, path: str, head: str = _HEAD) -> str:
    try:
        done = subprocess.run([sys.executable, "-c", head + body, path], env=child_env(), capture_output=True,
                              text=True, timeout=BOUND_S)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"a caller waited forever (the child ran past {BOUND_S} s): {exc.stdout!r}") from None
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _indices(path: str) -> list:
    with Journal(path, readonly=True) as journal:
        assert journal.verify() == []
        return sorted(e.gen_index for _s, e in journal.events() if hasattr(e, "gen_index"))


def test_a_leading_coroutine_is_not_starved_by_record_calls_in_the_loops_executor(tmp_path):
    """`await asyncio.to_thread(journal.record, ...)` (the way before arecord) beside `arecord` in one loop: the
    executor's workers wait in `record` for the lead, which the coroutine holds; its group commits anyway."""
    path = str(tmp_path / "j")
    _run_child("""
async def main():
    asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(1))
    lead = asyncio.ensure_future(arec(0))  # first: it leads
    other = asyncio.ensure_future(asyncio.to_thread(rec, 1))  # takes the one worker before the lead's commit
    await asyncio.gather(lead, other)
asyncio.run(main())
journal.close()
""", path)
    assert _indices(path) == [0, 1]


def test_a_leading_coroutine_commits_while_its_loop_is_blocked_by_a_record_call(tmp_path):
    """A coroutine leads, then a blocking `record` runs in the same loop (a sync hook inside an agent loop)."""
    path = str(tmp_path / "j")
    _run_child("""
async def blocking_hook():
    return rec(1)
async def main():
    await asyncio.gather(arec(0), blocking_hook())
asyncio.run(main())
journal.close()
""", path)
    assert _indices(path) == [0, 1]


def test_the_lead_handed_to_a_coroutine_of_a_closed_loop_is_not_lost(tmp_path):
    """A coroutine queued behind a thread's group is abandoned (its loop closed, the task never cancelled): the
    lead handed to it goes on, and a thread queued behind it is committed."""
    path = str(tmp_path / "j")
    _run_child("""
go = threading.Event()
""" + _GATED + """
first = threading.Thread(target=rec, args=(0,))
first.start()
assert taken.wait(600)
loop = asyncio.new_event_loop()
abandoned = loop.create_task(arec(1))
loop.run_until_complete(asyncio.sleep(0))  # the task ran up to its wait in the queue
queued(1)
loop.close()
last = threading.Thread(target=rec, args=(2,))
last.start()
queued(2)
go.set()
first.join()
last.join()
journal.close()
os._exit(0)  # the abandoned task is garbage, not a caller
""", path)
    assert 2 in _indices(path)


def test_a_leader_cancelled_before_its_worker_took_a_group_leaves_no_thread_spinning(tmp_path):
    """The leading coroutine is cancelled while its commit waits for a worker thread: once the worker runs, it
    finds the record gone from the queue and stops, and the loop (which joins its executor) ends."""
    path = str(tmp_path / "j")
    out = _run_child("""
async def main():
    asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(1))
    release = threading.Event()
    blocker = asyncio.ensure_future(asyncio.to_thread(release.wait))  # holds the one worker
    await asyncio.sleep(0)
    lead = asyncio.ensure_future(arec(0))
    await asyncio.sleep(0)  # it joined the queue (it leads) and its commit waits for the worker
    await asyncio.sleep(0)
    lead.cancel()
    try:
        await lead
    except asyncio.CancelledError:
        pass
    release.set()
    await blocker
    print("after", await arec(1))
asyncio.run(main())
journal.close()
""", path)
    assert "after" in out
    assert _indices(path) == [1]


@pytest.mark.parametrize("group", [True, False])
def test_arecord_inside_a_write_of_its_thread_raises_as_record_does(tmp_path, group):
    """A coroutine run (`asyncio.run`) inside a write of its own thread, which holds the write lock: `arecord`
    raises what `record` raises there (LMDB has one write transaction per thread), instead of waiting forever
    for a lead thread (or a worker) that waits for that lock."""
    out = _run_child(f"""
appender = appender_of(journal)
appender.group = {group}
def fn(txn):
    for call in (lambda: rec(0), lambda: asyncio.run(arec(1))):
        try:
            call()
        except Exception as exc:
            print(type(exc).__name__)
appender.write(fn)
print("after", rec(2))
journal.close()
""", str(tmp_path / "j"))
    assert out.split() == ["JournalError", "JournalError", "after", "2"]
    assert _indices(str(tmp_path / "j")) == [2]


def test_a_coroutine_records_while_the_interpreter_exits(tmp_path):
    """The main thread has returned; a thread still records with `arecord` and leads (the executors of the
    process take no more work then): its record is committed."""
    path = str(tmp_path / "j")
    out = _run_child("""
def late():
    assert go.wait(600)
    print("late", asyncio.run(arec(0)).seq, flush=True)
threading.Thread(target=late).start()
""", path, head=_AT_EXIT + _HEAD)
    assert "late" in out
    assert _indices(path) == [0]


def test_a_thread_hands_the_lead_to_a_coroutine_while_the_interpreter_exits(tmp_path):
    """A thread's group is held at its "taken" point until the interpreter exits, a coroutine queued behind it:
    the thread is acknowledged (not told its committed record failed) and the coroutine, handed the lead, is
    committed instead of waiting forever (which kept the process from exiting)."""
    path = str(tmp_path / "j")
    out = _run_child(_GATED + """
def thread():
    print("thread", rec(0), flush=True)
def coroutine():
    print("coroutine", asyncio.run(arec(1)).seq, flush=True)
threading.Thread(target=thread).start()
assert taken.wait(600)
threading.Thread(target=coroutine).start()
queued(1)
""", path, head=_AT_EXIT + _HEAD)
    assert "thread" in out and "coroutine" in out
    assert _indices(path) == [0, 1]
