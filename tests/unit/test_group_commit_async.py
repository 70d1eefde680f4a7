"""Group commit for callers in an event loop (`Journal.arecord`, `Appender.append_async`): coroutines share
one durable commit with each other and with threads, each acknowledged with its own seqs; a cancelled
coroutine's record is written once or not at all, and no other caller waits on it.

Groups are made at observed points (`GroupGate`), as in test_group_commit.py: the first leader waits at its
``"taken"`` point until the records of the next group are queued.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Dict, List

from group_commit_support import WAIT_S, GroupGate, MirrorDownForAGroup, recorded
from stepjournal import Journal
from stepjournal.errors import JournalFullError
from stepjournal.storage._appender import appender_of  # private: the switch to one commit per call (internal seam)

RESPONSE = {"text": "x" * 1024}


async def _arecord(journal: Journal, index: int, out: Dict[int, Any], value: Any = RESPONSE) -> None:
    try:
        out[index] = (await journal.arecord(1, value, gen_index=index, stage="tool:calc")).seq
    except BaseException as exc:  # the test looks at it
        out[index] = exc
        raise


def _thread(journal: Journal, index: int, out: Dict[int, Any]) -> threading.Thread:
    def run() -> None:
        out[index] = journal.record(1, RESPONSE, gen_index=index, stage="tool:calc").seq

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _tasks(journal: Journal, indices: List[int], out: Dict[int, Any], value: Any = RESPONSE) -> List["asyncio.Task[None]"]:
    return [asyncio.ensure_future(_arecord(journal, i, out, value)) for i in indices]


async def _first_taken(gate: GroupGate) -> None:
    assert await asyncio.to_thread(gate.first_taken.wait, WAIT_S)


async def _queued(gate: GroupGate, count: int) -> None:
    await asyncio.to_thread(gate.wait_queued, count)


def _run(main: Any) -> None:
    """Run `main` in a fresh event loop, bounded: a caller never woken fails the test instead of hanging it."""
    async def bounded() -> None:
        await asyncio.wait_for(main, WAIT_S)

    asyncio.run(bounded())


def _play(path: str, main: Callable[..., Any], *, size: int = 0, then: Any = None, **options: Any) -> GroupGate:
    """Run ``main(journal, gate)`` on the journal at `path` (its groups made by a `GroupGate` of `size`, when
    given); the journal verifies after."""
    with Journal(path, **options) as journal:
        gate = GroupGate(journal, size=size, then=then) if size else None
        _run(main(journal, gate))
        assert journal.verify() == []
    return gate  # type: ignore[return-value]


def _each_its_own(path: str, out: Dict[int, Any]) -> None:
    """Each caller acknowledged with a seq was given its own record's."""
    with Journal(path, readonly=True) as journal:
        for index, seq in out.items():
            if isinstance(seq, int):
                assert journal.event(seq).gen_index == index


def test_coroutines_queued_together_commit_as_one_group_and_each_gets_its_own_seq(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}

    async def main(journal: Journal, gate: GroupGate) -> None:
        first = _tasks(journal, [0], out)
        await _first_taken(gate)
        await asyncio.gather(*first, *_tasks(journal, list(range(1, 9)), out))

    assert _play(path, main, size=8).groups() == [1, 8]
    _each_its_own(path, out)
    assert recorded(path) == {i: 1 for i in range(9)}


def test_threads_and_coroutines_share_one_group(tmp_path):
    """A thread leads; four coroutines and four threads queue behind it: the next group holds all eight."""
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}

    async def main(journal: Journal, gate: GroupGate) -> None:
        first = _thread(journal, 0, out)
        await _first_taken(gate)
        tasks = _tasks(journal, [1, 2, 3, 4], out)
        await _queued(gate, 4)
        threads = [_thread(journal, i, out) for i in (5, 6, 7, 8)]
        await asyncio.gather(*tasks)
        for thread in [first] + threads:
            await asyncio.to_thread(thread.join)

    assert _play(path, main, size=8).groups() == [1, 8]
    _each_its_own(path, out)
    assert recorded(path) == {i: 1 for i in range(9)}


def test_many_coroutines_recording_at_once_lose_nothing_and_write_nothing_twice(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}

    async def caller(journal: Journal, c: int) -> None:
        for i in range(20):
            await _arecord(journal, c * 100 + i, out)

    async def main(journal: Journal) -> None:
        await asyncio.gather(*(caller(journal, c) for c in range(64)))

    with Journal(path) as journal:
        sizes: List[int] = []
        appender_of(journal).observe = lambda point, count: sizes.append(count) if point == "taken" else None
        _run(main(journal))
        assert len(set(out.values())) == 64 * 20
        assert max(sizes) > 1  # they did share commits
        assert journal.verify() == []
    assert recorded(path) == {c * 100 + i: 1 for c in range(64) for i in range(20)}


def test_a_coroutine_cancelled_while_queued_writes_nothing_and_the_others_commit(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}

    async def main(journal: Journal, gate: GroupGate) -> None:
        first = _thread(journal, 0, out)
        await _first_taken(gate)
        tasks = _tasks(journal, [1, 2, 3], out)
        await _queued(gate, 3)
        tasks[1].cancel()  # record 2 leaves the queue
        assert (await asyncio.gather(tasks[1], return_exceptions=True))[0].__class__ is asyncio.CancelledError
        tasks += _tasks(journal, [4, 5], out)  # the queue holds 1, 3, 4, 5: the gate lets the first group go
        await asyncio.gather(tasks[0], *tasks[2:])
        await asyncio.to_thread(first.join)

    assert _play(path, main, size=4).groups() == [1, 4]
    assert isinstance(out[2], asyncio.CancelledError)
    assert recorded(path) == {0: 1, 1: 1, 3: 1, 4: 1, 5: 1}


def test_a_coroutine_cancelled_while_its_group_commits_is_written_once_and_no_caller_waits_on_it(tmp_path):
    """The cancel lands after the leader took the group, before its commit: the record is committed with
    the group (acknowledged to no one, as after Ctrl-C); the others are acknowledged, later callers go on."""
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}
    state: Dict[str, Any] = {}

    def then(point: str, count: int) -> None:  # in the leader's thread
        if point == "taken" and count == 3 and "cancelled" not in state:
            state["cancelled"] = threading.Event()
            state["loop"].call_soon_threadsafe(state["victim"].cancel)
            assert state["cancelled"].wait(WAIT_S)  # its handler has run: the group is still to commit

    async def main(journal: Journal, gate: GroupGate) -> None:
        state["loop"] = asyncio.get_running_loop()
        first = _thread(journal, 0, out)
        await _first_taken(gate)
        tasks = _tasks(journal, [1, 2, 3], out)
        state["victim"] = tasks[1]
        tasks[1].add_done_callback(lambda _t: state["cancelled"].set())
        assert isinstance((await asyncio.gather(*tasks, return_exceptions=True))[1], asyncio.CancelledError)
        await asyncio.to_thread(first.join)
        await asyncio.gather(*_tasks(journal, [6, 7], out))  # the lead went on

    assert _play(path, main, size=3, then=then).groups()[:2] == [1, 3]
    assert isinstance(out[2], asyncio.CancelledError)
    assert all(isinstance(out[i], int) for i in (0, 1, 3, 6, 7)), out
    _each_its_own(path, out)
    assert recorded(path) == {0: 1, 1: 1, 2: 1, 3: 1, 6: 1, 7: 1}


def test_a_leading_coroutine_cancelled_while_its_group_commits_leaves_the_lead_to_the_next(tmp_path):
    """The leader's caller is cancelled after its worker took the group: the group is still committed (the
    record once, acknowledged to no one), and the coroutines queued meanwhile take the lead and commit."""
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}
    taken, go = threading.Event(), threading.Event()

    def observe(point: str, count: int) -> None:  # in the leader's worker thread
        if point == "taken" and not taken.is_set():
            taken.set()
            assert go.wait(WAIT_S)

    async def main(journal: Journal) -> None:
        first = _tasks(journal, [0], out)
        assert await asyncio.to_thread(taken.wait, WAIT_S)
        first[0].cancel()
        assert isinstance((await asyncio.gather(*first, return_exceptions=True))[0], asyncio.CancelledError)
        rest = _tasks(journal, [1, 2, 3], out)
        await asyncio.sleep(0)  # each runs to its first wait: queued
        go.set()
        await asyncio.gather(*rest)

    with Journal(path) as journal:
        appender_of(journal).observe = observe
        _run(main(journal))
        assert isinstance(out[0], asyncio.CancelledError)
        assert all(isinstance(out[i], int) for i in (1, 2, 3)), out
        assert journal.verify() == []
    assert recorded(path) == {0: 1, 1: 1, 2: 1, 3: 1}


def test_a_coroutine_whose_record_cannot_be_written_fails_alone_and_its_group_is_written(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}

    async def main(journal: Journal, gate: GroupGate) -> None:
        first = _thread(journal, 0, out)
        await _first_taken(gate)
        tasks = _tasks(journal, [1, 2, 3], out)
        await _queued(gate, 3)
        tasks += _tasks(journal, [4], out, value={"big": b"\x01" * (3 << 20)})
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(first.join)

    gate = _play(path, main, size=4, map_size=1 << 20, max_size=2 << 20)
    assert isinstance(out[4], JournalFullError)
    assert all(isinstance(out[i], int) for i in range(4)), out
    assert gate.groups()[:2] == [1, 4] and sorted(gate.groups()[2:]) == [1, 1, 1, 1]
    assert recorded(path) == {0: 1, 1: 1, 2: 1, 3: 1}


def test_a_store_failing_after_a_coroutine_led_group_committed_fails_that_coroutine_and_acknowledges_the_others(
        tmp_path):
    """The group's leader is a coroutine (its lead runs in the appender's lead thread): the failure after the commit
    is its caller's alone; the thread and the coroutines beside it are acknowledged, each record written once."""
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}

    async def main(journal: Journal, gate: GroupGate) -> None:
        first = _thread(journal, 0, out)
        await _first_taken(gate)
        tasks = _tasks(journal, [1, 2, 3], out)
        await _queued(gate, 3)
        last = _thread(journal, 4, out)
        await asyncio.gather(*tasks, return_exceptions=True)
        for thread in (first, last):
            await asyncio.to_thread(thread.join)

    objects = (tmp_path / "objects").as_uri()
    assert _play(path, main, size=4, payload_store=MirrorDownForAGroup(objects)).groups()[:2] == [1, 4]
    assert isinstance(out[1], OSError), out  # the first coroutine queued led the group of four
    assert all(isinstance(out[i], int) for i in (0, 2, 3, 4)), out
    assert recorded(path) == {i: 1 for i in range(5)}


def test_without_group_commit_a_coroutine_commits_alone(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}

    async def main(journal: Journal) -> None:
        await asyncio.gather(*_tasks(journal, list(range(4)), out))

    with Journal(path) as journal:
        appender_of(journal).group = False
        seen: List[str] = []
        appender_of(journal).observe = lambda point, count: seen.append(f"{point} {count}")
        _run(main(journal))
        assert seen == ["taken 1", "committed 1"] * 4
    assert recorded(path) == {i: 1 for i in range(4)}


def test_arecord_records_what_record_records(tmp_path):
    """The same arguments give the same event fields and payloads, read back alike."""
    with Journal(str(tmp_path / "j")) as journal:
        kwargs: Dict[str, Any] = dict(gen_index=3, mode="validate", input={"q": "2+2"}, duration_s=0.5, policy="p",
                                      reason="r", stage="tool.calc", not_stored=None)
        a = journal.record(2, {"text": "4"}, **kwargs)
        b = asyncio.run(journal.arecord(2, {"text": "4"}, **{**kwargs, "gen_index": 4}))
        skip = {"ts", "gen_index", "session"}
        assert {k: v for k, v in _fields(a.event).items() if k not in skip} == \
            {k: v for k, v in _fields(b.event).items() if k not in skip}
        assert journal.load(b.event.output) == {"text": "4"}


def _fields(event: Any) -> Dict[str, Any]:
    import attrs

    return attrs.asdict(event, recurse=False)


def test_async_tool_calls_share_a_group_commit_and_keep_the_event_loop_free_while_it_commits(tmp_path):
    """`ToolEngine.acall` awaits its record (`Journal.arecord`): with its journal I/O run inline in the loop, the
    first call's commit is held until eight more calls of the same loop have queued theirs (a record blocking the
    loop would keep them from ever queueing), and the eight then commit as one group."""
    from stepjournal.events import ToolResponse
    from stepjournal.policies import ToolEngine

    path = str(tmp_path / "j")
    ran: List[int] = []

    async def inline(work: Callable[[], Any]) -> Any:
        return work()

    async def main(journal: Journal, gate: GroupGate) -> None:
        engine = ToolEngine(journal, "dump", run_blocking=inline)

        async def call(sample: int) -> None:
            async def run() -> Any:
                ran.append(sample)
                return ToolResponse(text=f"answer {sample}").to_payload()

            outcome = await engine.acall("calc", {"x": sample}, run, step=1, sample=sample)
            assert outcome.action == "generated" and outcome.seq is not None

        first = asyncio.ensure_future(call(0))
        await _first_taken(gate)
        await asyncio.gather(first, *(call(sample) for sample in range(1, 9)))

    assert _play(path, main, size=8).groups() == [1, 8]
    assert sorted(ran) == list(range(9))
    counts = recorded(path)  # each call's record written once
    assert len(counts) == 9 and set(counts.values()) == {1}


def test_closing_the_journal_ends_its_lead_thread_and_a_later_arecord_is_refused(tmp_path):
    from stepjournal.errors import JournalClosedError

    before = set(threading.enumerate())
    journal = Journal(str(tmp_path / "j"))
    _run(journal.arecord(1, RESPONSE, stage="tool:calc"))
    leads = [t for t in set(threading.enumerate()) - before if t.name.startswith("stepjournal-lead")]
    assert len(leads) == 1  # the record was led from the journal's lead thread
    journal.close()
    leads[0].join(WAIT_S)
    assert not leads[0].is_alive()
    try:
        _run(journal.arecord(1, RESPONSE, gen_index=1, stage="tool:calc"))
    except JournalClosedError:
        pass
    else:
        raise AssertionError("arecord on a closed journal recorded")
