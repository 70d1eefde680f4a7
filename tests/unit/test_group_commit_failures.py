"""Failures in a shared commit: a payload store that raises once the group's events committed, and a
journal closed while a group waits, settle each caller on its own: every acknowledged record is in the
log once, each failed caller's record is not, nothing waits forever (storage/_appender.py)."""

from __future__ import annotations

import collections
import threading
from typing import Any, Dict, List

from group_commit_support import GroupGate, MirrorDownForAGroup
from stepjournal import Journal
from stepjournal.errors import JournalClosedError
from stepjournal.events import GenerationRecorded

RESPONSE = {"text": "x" * 256}


def _record(journal: Journal, index: int, out: Dict[int, Any]) -> None:
    try:
        out[index] = journal.record(1, RESPONSE, gen_index=index, stage="tool:calc").seq
    except BaseException as exc:  # the test looks at it
        out[index] = exc


def _start(journal: Journal, indices: List[int], out: Dict[int, Any]) -> List[threading.Thread]:
    threads = [threading.Thread(target=_record, args=(journal, i, out)) for i in indices]
    for thread in threads:
        thread.start()
    return threads


def _recorded(path: str, **options: Any) -> collections.Counter:
    with Journal(path, readonly=True, **options) as journal:
        assert journal.verify() == []
        return collections.Counter(e.gen_index for _s, e in journal.events(types=[GenerationRecorded]))


def test_a_store_that_fails_after_a_group_committed_fails_one_caller_and_acknowledges_the_others(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}
    with Journal(path, payload_store=MirrorDownForAGroup((tmp_path / "objects").as_uri())) as journal:
        gate = GroupGate(journal, size=4)
        first = _start(journal, [0], out)
        gate.first_taken.wait()
        for thread in first + _start(journal, [1, 2, 3, 4], out):
            thread.join()
        assert gate.groups()[:2] == [1, 4]
    failed = [i for i, outcome in out.items() if not isinstance(outcome, int)]
    assert len(failed) == 1 and isinstance(out[failed[0]], OSError), out  # the group's leader's caller
    assert _recorded(path, payload_store=(tmp_path / "objects").as_uri()) == {i: 1 for i in range(5)}  # its record too: the events had committed


def test_a_journal_closed_while_a_group_waits_fails_the_waiting_callers_alone_and_hangs_none(tmp_path):
    path = str(tmp_path / "j")
    out: Dict[int, Any] = {}
    journal = Journal(path)
    gate = GroupGate(journal, size=4)
    first = _start(journal, [0], out)
    gate.first_taken.wait()
    rest = _start(journal, [1, 2, 3], out)
    gate.wait_queued(3)
    closer = threading.Thread(target=journal.close)  # waits for the write in flight, then closes
    closer.start()
    rest += _start(journal, [4], out)  # the fourth releases the first group
    for thread in first + rest + [closer]:
        thread.join(120)
        assert not thread.is_alive()
    assert isinstance(out[0], int)
    counts = _recorded(path)
    for index, outcome in out.items():
        assert counts[index] == (1 if isinstance(outcome, int) else 0), (index, outcome)
        assert isinstance(outcome, (int, JournalClosedError)), outcome


def test_a_group_size_of_zero_or_less_still_commits_a_record_at_a_time(tmp_path):
    """`max_group` (the appender's attribute) 0 or negative would take empty groups forever."""
    from stepjournal.storage._appender import appender_of  # private: the group size (internal seam)

    for max_group in (0, -1):
        path = str(tmp_path / f"j{max_group}")
        out: Dict[int, Any] = {}
        with Journal(path) as journal:
            appender_of(journal).max_group = max_group
            threads = [threading.Thread(target=_record, args=(journal, i, out), daemon=True) for i in range(3)]
            for thread in threads:  # daemon: a caller that never returns fails the test instead of hanging it
                thread.start()
            for thread in threads:
                thread.join(120)
            assert not any(thread.is_alive() for thread in threads), f"max_group {max_group}: a caller never returned"
        assert _recorded(path) == {0: 1, 1: 1, 2: 1}
