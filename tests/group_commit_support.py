"""Groups of records made at observed points (the group commit's tests, in one process and in a child).

`GroupGate` watches a journal's appender (`Appender.observe`): the first leader stops at its
``"taken"`` point until `size` more records wait in the queue, so the next group holds exactly them,
however the threads are scheduled. No sleep, no timing: each wait is on a state the appender reports.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, List, Optional, Tuple

from stepjournal import Journal
from stepjournal.events import GenerationRecorded
from stepjournal.payloads import ObjectPayloadStore
from stepjournal.storage._appender import appender_of  # private: the group commit's observation point (internal seam)

WAIT_S = 120  # a bound on each observed wait, so that a broken appender fails the test instead of hanging it


class GroupGate:
    """Hold the first group's leader until `size` records are queued behind it; `then(point, count)` is
    called at every later point (a test raises or kills there)."""

    def __init__(self, journal: Any, size: int, then: Optional[Callable[[str, int], None]] = None) -> None:
        self.size = size
        self.then = then
        self.points: List[Tuple[str, int]] = []
        self._changed = threading.Condition()
        self._queued = 0
        self._first = True
        self.first_taken = threading.Event()
        appender_of(journal).observe = self._observe

    def _observe(self, point: str, count: int) -> None:
        with self._changed:
            self.points.append((point, count))
            if point == "queued":
                self._queued = count
                self._changed.notify_all()
        if point == "taken" and self._first:
            self._first = False
            with self._changed:  # the queue is empty now: a wait for the next records counts only them
                self._queued = 0
            self.first_taken.set()
            with self._changed:  # the leader waits here, outside the queue's lock, while others queue
                assert self._changed.wait_for(lambda: self._queued >= self.size, WAIT_S), self.points[-5:]
            return
        if self.then is not None and point != "queued":
            self.then(point, count)

    def wait_queued(self, count: int) -> None:
        """Wait until the queue holds `count` records (seen at a ``"queued"`` point)."""
        with self._changed:
            assert self._changed.wait_for(lambda: self._queued >= count, WAIT_S), self.points[-5:]

    def groups(self) -> List[int]:
        """The size of each group taken, in order."""
        return [count for point, count in self.points if point == "taken"]


def recorded(path: str) -> "collections.Counter[int]":
    """How many times each call index is in the log of the journal at `path`."""
    with Journal(path, readonly=True) as journal:
        return collections.Counter(e.gen_index for _s, e in journal.events(types=[GenerationRecorded]))


class MirrorDownForAGroup(ObjectPayloadStore):
    """A user's payload store whose commit raises after a group's events committed (a mirror it feeds is down)."""

    failed = False

    def commit(self, items, write_events):
        seqs = super().commit(items, write_events)
        if len(items) > 1 and not self.failed:
            self.failed = True
            raise OSError("the mirror is down")
        return seqs
