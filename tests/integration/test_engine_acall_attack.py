"""Attacks on `Engine.acall`'s awaited record (`_afinish`: the output prepared through ``run_blocking``, then
`Journal.arecord`): a call cancelled at each point of that path writes its record once or not at all, and what it
prepared for its commit (a large output's file, staged while it was hashed) is neither lost nor written twice.

Each point is reached through the appender's observed points (`GroupGate`), never after a sleep.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from typing import Any, Awaitable, Callable, Dict, List

import numpy as np

from group_commit_support import WAIT_S, GroupGate, recorded
from stepjournal import Journal
from stepjournal.policies import CallHooks, Engine
from stepjournal.payloads._file_store import PAYLOAD_FOLDER, TMP_FOLDER, FilePayloadStore  # private: file layout
from stepjournal.payloads._payload_store import FILE_FROM  # private: the size from which a payload is a file

BIG = FILE_FROM + 4096  # uint8: a payload file


def _tmp_files(path: str) -> List[str]:
    tmp = os.path.join(path, PAYLOAD_FOLDER, TMP_FOLDER)
    return sorted(os.listdir(tmp)) if os.path.isdir(tmp) else []


def _written_at_commit(monkeypatch: Any) -> List[str]:
    """The payload files a commit wrote itself (not renamed into place from the file staged while hashing)."""
    written: List[str] = []
    real_write = FilePayloadStore._write
    monkeypatch.setattr(FilePayloadStore, "_write", lambda self, at, buffers: (written.append(at),
                                                                                real_write(self, at, buffers)))
    return written


def _caller(engine: Engine) -> Callable[[Any], Awaitable[Any]]:
    """``await call(value)``: one `acall` of `engine` answering `value`, its encoding in a worker thread."""
    async def call(value: Any) -> Any:
        async def generate() -> Any:
            return value

        return await engine.acall(1, generate, hooks=CallHooks(run_blocking=asyncio.to_thread))

    return call


def test_a_call_cancelled_while_its_group_commits_keeps_its_staged_file_for_that_commit(tmp_path, monkeypatch):
    """A call cancelled once its record was taken into a group is committed (acknowledged to no one): the file
    its large output was staged into while hashed is the one put in place, even when the cancelled call's frames
    are collected before the commit reaches its payloads (a garbage collection may run in any thread then)."""
    path = str(tmp_path / "j")
    written = _written_at_commit(monkeypatch)
    state: Dict[str, Any] = {}
    cancelled, dropped, committed = threading.Event(), threading.Event(), threading.Event()

    def then(point: str, count: int) -> None:  # in the lead thread, at the big call's group, before its commit
        if point == "taken" and "big" in state:
            state["loop"].call_soon_threadsafe(state["big"].cancel)
            assert cancelled.wait(WAIT_S)
            state["loop"].call_soon_threadsafe(drop)  # after the cancelled task's callbacks: nothing holds it
            assert dropped.wait(WAIT_S)
            gc.collect()  # its frames go, with what they prepared
        elif point == "committed" and dropped.is_set():
            committed.set()

    def drop() -> None:
        state.pop("big")
        dropped.set()

    with Journal(path) as journal:
        call = _caller(Engine(journal, "dump"))
        gate = GroupGate(journal, size=1, then=then)

        async def main() -> Any:
            state["loop"] = asyncio.get_running_loop()
            first = asyncio.ensure_future(call({"small": 1}))
            assert await asyncio.to_thread(gate.first_taken.wait, WAIT_S)
            big = state["big"] = asyncio.ensure_future(call(np.full(BIG, 7, dtype=np.uint8)))
            big.add_done_callback(lambda task: cancelled.set() if task.cancelled() else None)
            del big  # the lead thread drops it once cancelled, as a caller that gave up on it would
            outcome = await asyncio.wait_for(first, WAIT_S)
            assert await asyncio.to_thread(committed.wait, WAIT_S)  # the cancelled call's group
            return outcome

        assert asyncio.run(main()).action == "generated"
        assert gate.groups() == [1, 1]
        assert written == [], "the commit wrote the payload again: the file staged for it was discarded"
        assert _tmp_files(path) == [] and journal.verify() == []
    assert recorded(path) == {0: 1, 1: 1}  # the cancelled call's record written once


def test_a_compressing_journal_compresses_an_acall_output_and_input_in_run_blocking_not_in_the_loop(
        tmp_path, monkeypatch):
    """`acall` runs a generated call's encoding through ``run_blocking`` (a worker thread here) and awaits only the
    record: a journal that compresses packs the output and the input there too (on their first use, `ref`), not in
    the event loop's thread, which the other calls of the loop share."""
    from stepjournal.payloads._payloads import PreparedPayload  # private: where a payload is compressed

    packing: List[str] = []
    real_blob = PreparedPayload.blob

    def blob(self: Any) -> Any:
        if not self._packed and self.compression == "zstd":
            packing.append(threading.current_thread().name)
        return real_blob.fget(self)

    monkeypatch.setattr(PreparedPayload, "blob", property(blob))
    with Journal(str(tmp_path / "j"), compression="zstd") as journal:
        engine = Engine(journal, "dump")

        async def generate() -> Any:
            return np.arange(1 << 18)

        async def main() -> Any:
            return await engine.acall(1, generate, input={"prompt": np.arange(1 << 16)},
                                      hooks=CallHooks(run_blocking=asyncio.to_thread))

        loop_thread = threading.current_thread().name  # `asyncio.run` runs the loop in this thread
        outcome = asyncio.run(main())
        assert outcome.action == "generated" and outcome.source.event.output.compression == "zstd"
        assert outcome.source.event.input is not None
        assert len(packing) == 2 and loop_thread not in packing, packing
        assert journal.verify() == []


def test_a_call_cancelled_while_queued_leaves_the_file_another_call_staged_for_the_same_output(
        tmp_path, monkeypatch):
    """Two calls answer the same large output (two samples reading one file), each staging it while hashing; the
    second is cancelled while its record waits in the queue: its staged file goes, and the first call's own staged
    file is the one its commit puts in place (the payload is not written a second time)."""
    path = str(tmp_path / "j")
    written = _written_at_commit(monkeypatch)
    with Journal(path) as journal:
        call = _caller(Engine(journal, "dump"))
        gate = GroupGate(journal, size=3)

        async def main() -> List[Any]:
            held = asyncio.ensure_future(call({"small": 0}))
            assert await asyncio.to_thread(gate.first_taken.wait, WAIT_S)
            first = asyncio.ensure_future(call(np.full(BIG, 7, dtype=np.uint8)))
            await asyncio.to_thread(gate.wait_queued, 1)
            second = asyncio.ensure_future(call(np.full(BIG, 7, dtype=np.uint8)))
            await asyncio.to_thread(gate.wait_queued, 2)
            second.cancel()
            try:
                await second
            except asyncio.CancelledError:
                pass
            del second
            gc.collect()  # the cancelled call's frames go, with what it prepared
            more = [asyncio.ensure_future(call({"small": i})) for i in (1, 2)]
            return await asyncio.wait_for(asyncio.gather(held, first, *more), WAIT_S)

        assert [outcome.action for outcome in asyncio.run(main())] == ["generated"] * 4
        assert gate.groups() == [1, 3]
        assert written == [], "the commit wrote the payload again: the file staged for it was discarded"
        assert _tmp_files(path) == [] and journal.verify() == []
    assert recorded(path) == {0: 1, 1: 1, 3: 1, 4: 1}  # the cancelled call (index 2) not written
