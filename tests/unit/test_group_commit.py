"""Group commit: concurrent records of one process share one durable commit, each caller acknowledged
with its own seqs, and no record is written twice or lost for another's failure (storage/_appender.py).

Groups are made at observed points (`GroupGate`): the first leader waits at its ``"taken"`` point until
the records of the next group are queued, so each test knows its groups whatever the scheduling.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List

import pytest

from group_commit_support import GroupGate, recorded
from stepjournal import Journal
from stepjournal.errors import JournalFullError
from stepjournal.storage._appender import appender_of  # private: the switch to one commit per call (internal seam)

RESPONSE = {"text": "x" * 1024}


def _record(journal: Journal, index: int, out: Dict[int, Any], value: Any = RESPONSE) -> None:
    try:
        out[index] = journal.record(1, value, gen_index=index, stage="tool:calc").seq
    except BaseException as exc:  # the test looks at it
        out[index] = exc


def _start(journal: Journal, indices: List[int], out: Dict[int, Any], value: Any = RESPONSE) -> List[threading.Thread]:
    threads = [threading.Thread(target=_record, args=(journal, i, out, value)) for i in indices]
    for thread in threads:
        thread.start()
    return threads


def test_records_queued_together_commit_as_one_group_and_each_caller_gets_its_own_seq(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}
    with Journal(path) as journal:
        gate = GroupGate(journal, size=8)
        first = _start(journal, [0], out)
        gate.first_taken.wait()
        rest = _start(journal, list(range(1, 9)), out)
        for thread in first + rest:
            thread.join()
        assert gate.groups() == [1, 8]
        for index, seq in out.items():
            assert journal.event(seq).gen_index == index  # each acknowledged with its own record's seq
        assert journal.verify() == []
    assert recorded(path) == {i: 1 for i in range(9)}


def test_many_threads_recording_at_once_lose_nothing_and_write_nothing_twice(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}
    with Journal(path) as journal:
        threads = [threading.Thread(target=lambda t=t: [_record(journal, t * 100 + i, out) for i in range(25)])
                   for t in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(out.values())) == 32 * 25
        assert journal.verify() == []
    assert recorded(path) == {t * 100 + i: 1 for t in range(32) for i in range(25)}


def test_a_leader_interrupted_after_its_group_committed_writes_no_record_twice(tmp_path):
    """The interrupt lands after the durable commit, before the acknowledgements: every record of the
    group is in the log once, each follower is acknowledged, the leader's caller gets the interrupt."""
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}

    def interrupt(point: str, count: int) -> None:
        if point == "committed" and count > 1 and threading.current_thread() is threading.main_thread():
            raise KeyboardInterrupt  # as Python's SIGINT handler raises it here, in the leader

    with Journal(path) as journal:
        gate = GroupGate(journal, size=5, then=interrupt)
        first = _start(journal, [0], out)
        gate.first_taken.wait()
        # This (main) thread queues next, so it leads the next group; four followers queue behind it.
        helper = threading.Thread(target=lambda: (gate.wait_queued(1), rest.extend(_start(journal, [2, 3, 4, 5], out))))
        rest: List[threading.Thread] = []
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            journal.record(1, RESPONSE, gen_index=1, stage="tool:calc")
        helper.join()
        for thread in first + rest:
            thread.join()
        assert gate.groups() == [1, 5]  # no record was committed again, alone or in a group
        assert all(isinstance(out[i], int) for i in (0, 2, 3, 4, 5)), out
        assert journal.verify() == []
    assert recorded(path) == {i: 1 for i in range(6)}


def test_a_leader_interrupted_before_its_group_committed_leaves_the_others_to_commit_alone(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}

    def interrupt(point: str, count: int) -> None:
        if point == "taken" and count > 1 and threading.current_thread() is threading.main_thread():
            raise KeyboardInterrupt

    with Journal(path) as journal:
        gate = GroupGate(journal, size=5, then=interrupt)
        first = _start(journal, [0], out)
        gate.first_taken.wait()
        rest: List[threading.Thread] = []
        helper = threading.Thread(target=lambda: (gate.wait_queued(1), rest.extend(_start(journal, [2, 3, 4, 5], out))))
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            journal.record(1, RESPONSE, gen_index=1, stage="tool:calc")
        helper.join()
        for thread in first + rest:
            thread.join()
        assert gate.groups() == [1, 5, 1, 1, 1, 1]  # the four followers, each alone
        assert all(isinstance(out[i], int) for i in (0, 2, 3, 4, 5)), out
    assert recorded(path) == {0: 1, 2: 1, 3: 1, 4: 1, 5: 1}  # the interrupted caller's record was not written


def test_a_record_that_cannot_be_written_fails_alone_and_its_group_is_written(tmp_path):
    """A group holding a record over the size cap fails; each of its records is retried alone, and only
    the record that cannot be written gets the error."""
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}
    with Journal(path, map_size=1 << 20, max_size=2 << 20) as journal:
        gate = GroupGate(journal, size=4)
        first = _start(journal, [0], out)
        gate.first_taken.wait()
        rest = _start(journal, [1, 2, 3], out)
        gate.wait_queued(3)
        rest += _start(journal, [4], out, value={"big": b"\x01" * (3 << 20)})
        for thread in first + rest:
            thread.join()
        assert isinstance(out[4], JournalFullError)
        assert all(isinstance(out[i], int) for i in range(4)), out
        assert gate.groups()[:2] == [1, 4] and sorted(gate.groups()[2:]) == [1, 1, 1, 1]
        assert journal.verify() == []
    assert recorded(path) == {0: 1, 1: 1, 2: 1, 3: 1}


def test_without_group_commit_each_record_is_a_commit_of_its_own(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}
    with Journal(path) as journal:
        appender_of(journal).group = False
        seen: List[str] = []
        appender_of(journal).observe = lambda point, count: seen.append(f"{point} {count}")
        for thread in _start(journal, list(range(6)), out):
            thread.join()
        assert seen == ["taken 1", "committed 1"] * 6
    assert recorded(path) == {i: 1 for i in range(6)}


def test_the_session_opens_once_with_the_first_group(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}
    with Journal(path) as journal:
        gate = GroupGate(journal, size=3)
        first = _start(journal, [0], out)
        gate.first_taken.wait()
        for thread in first + _start(journal, [1, 2, 3], out):
            thread.join()
        assert [type(e).__name__ for _s, e in journal.events()][:2] == ["SessionOpened", "GenerationRecorded"]
        assert len(journal.sessions()) == 1


def test_a_record_made_inside_a_write_of_its_own_thread_commits_alone_instead_of_waiting_on_itself(tmp_path):
    with Journal(str(tmp_path / "j")) as journal:
        seqs: List[int] = []
        appender_of(journal).write(lambda txn: None, after=lambda: seqs.append(journal.record(1, RESPONSE).seq))
        assert journal.event(seqs[0]).step == 1


def test_a_journal_dropped_without_closing_is_collected_with_its_appender(tmp_path):
    """The seam's registry holds neither the journal nor its appender alive."""
    import gc
    import weakref

    journal = Journal(str(tmp_path / "j"))
    journal.record(1, RESPONSE)
    dropped = weakref.ref(journal), weakref.ref(appender_of(journal))
    del journal
    gc.collect()
    assert [ref() for ref in dropped] == [None, None]
