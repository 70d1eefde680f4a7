"""A fork while a group is in flight (its leader holding the write lock, followers queued): the child,
with none of the parent's threads or queued records, records at once; the parent's group commits too."""

from __future__ import annotations

import collections
import multiprocessing as mp
import threading
from typing import Any, Dict

from group_commit_support import GroupGate
from stepjournal import Journal
from stepjournal.events import GenerationRecorded

RESPONSE = {"text": "x" * 256}


def _record(journal: Journal, index: int, out: Dict[int, Any]) -> None:
    out[index] = journal.record(1, RESPONSE, gen_index=index, stage="tool:calc").seq


def _child(journal: Journal) -> None:
    journal.record(2, RESPONSE, gen_index=0)  # the inherited journal, reopened in this process
    journal.close()


def test_a_fork_child_records_while_the_parents_group_is_in_flight(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}
    with Journal(path) as journal:
        gate = GroupGate(journal, size=3)
        threads = [threading.Thread(target=_record, args=(journal, 0, out), daemon=True)]
        threads[0].start()
        gate.first_taken.wait()  # the leader holds the write lock at its "taken" point
        for index in (1, 2):
            threads.append(threading.Thread(target=_record, args=(journal, index, out), daemon=True))
            threads[-1].start()
        gate.wait_queued(2)
        child = mp.get_context("fork").Process(target=_child, args=(journal,))
        child.start()
        child.join(120)
        assert child.exitcode == 0  # it did not wait on the parent's lock or queue
        threads.append(threading.Thread(target=_record, args=(journal, 3, out), daemon=True))
        threads[-1].start()  # the third queued record lets the parent's first group go on
        for thread in threads:
            thread.join(120)
        assert sorted(out) == [0, 1, 2, 3]
        assert journal.verify() == []
    with Journal(path, readonly=True) as journal:
        counts = collections.Counter((e.step, e.gen_index) for _s, e in journal.events(types=[GenerationRecorded]))
        assert counts == {(1, 0): 1, (1, 1): 1, (1, 2): 1, (1, 3): 1, (2, 0): 1}
        assert len(journal.sessions()) == 2  # the child's own session
