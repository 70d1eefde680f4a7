"""`MemoryJournal`: the read side of a journal that a `JournalView` reads, folded in memory from events.

A policy is a pure decision, ``(call context, view) -> decision``, so testing one needs no LMDB: the view is
the real `JournalView` (its scopes and serving rules included) over a `MemoryJournal`, which holds a list of
events, the truth, and answers the journal's queries from them as the journal's projections do (the latest
stored record of a key; a release takes its record out).
"""

from __future__ import annotations

import bisect
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from stepjournal import DEFAULT_RUN
from stepjournal.events import (
    CallBypassed,
    CallRefused,
    EventsImported,
    GenerationRecorded,
    PayloadRef,
    PayloadsReleased,
    ReplayServed,
    SessionOpened,
)
from stepjournal.index import RecordedGeneration

from ._base import CallContext, JournalView

__all__ = ["MemoryJournal", "memory_view"]

_DEFAULT_STAGE: str = CallContext(run=DEFAULT_RUN, step=0).stage
# (run, mode, stage) -> (step, gen_index) -> seq of the record `lookup` serves
_Served = Dict[Tuple[str, str, str], Dict[Tuple[int, int], int]]
# The events a log holds; those of one step of a run (a call, a release); those of a run.
Event = Union[SessionOpened, GenerationRecorded, ReplayServed, CallBypassed, CallRefused, PayloadsReleased,
              EventsImported]
_OF_A_STEP = (GenerationRecorded, ReplayServed, CallBypassed, CallRefused, PayloadsReleased)
_OF_A_RUN = (SessionOpened, *_OF_A_STEP)  # an import names no run


def _run_of(event: Event) -> Optional[str]:
    return event.run if isinstance(event, _OF_A_RUN) else None


def _step_of(event: Event) -> Optional[int]:
    return event.step if isinstance(event, _OF_A_STEP) else None


class MemoryJournal:
    """The queries a `JournalView` makes, answered from `events` kept in memory (no LMDB, no files).

    Args:
        events: the log, oldest first (`GenerationRecorded`, `PayloadsReleased`, any other event).
        run: the run key a view reads by default.
    """

    def __init__(self, events: Iterable[Event] = (), *, run: str = DEFAULT_RUN) -> None:
        self.run = run
        self._log: List[Tuple[int, Event]] = []
        self._served: _Served = {}
        for event in events:
            self.append(event)

    # -- building --------------------------------------------------------------------------------
    def append(self, event: Event) -> int:
        """Add `event` to the log and fold it in; return its seq (1 for the first)."""
        seq = len(self._log) + 1
        self._log.append((seq, event))
        if isinstance(event, GenerationRecorded) and event.output is not None:
            self._served.setdefault((event.run, event.mode, event.stage), {})[(event.step, event.gen_index)] = seq
        elif isinstance(event, PayloadsReleased):
            keys = self._served.get((event.run, event.mode, event.stage), {})
            if keys.get((event.step, event.gen_index)) == event.record_seq:
                del keys[(event.step, event.gen_index)]
        return seq

    def record(self, step: int, gen_index: int = 0, *, mode: str = "train", stage: str = _DEFAULT_STAGE,
               run: Optional[str] = None, stored: bool = True, reason: str = "recorded",
               not_stored: Optional[str] = None) -> RecordedGeneration:
        """Append the `GenerationRecorded` of one call (with a stored output unless `stored` is False; why
        not in `not_stored`)."""
        output = PayloadRef(digest=f"{len(self._log) + 1:064x}", nbytes=1, stored_nbytes=1) if stored else None
        event = GenerationRecorded(
            session="memory", run=run or self.run, step=step, gen_index=gen_index, mode=mode, input_digest=None,
            output=output, input=None, duration_s=0.0, policy="manual", reason=reason, ts=0.0, stage=stage,
            not_stored=not_stored)
        return RecordedGeneration(self.append(event), event)

    def release(self, record: RecordedGeneration, *, rule: str = "keep_last=1") -> int:
        """Append the `PayloadsReleased` of `record` (retention let its payloads go); return its seq."""
        event = record.event
        return self.append(PayloadsReleased(
            run=event.run, step=event.step, gen_index=event.gen_index, mode=event.mode, record_seq=record.seq,
            released=[event.output.digest] if event.output is not None else [], retained=[], rule=rule,
            reason="released", ts=0.0, stage=event.stage))

    # -- what a view reads -----------------------------------------------------------------------
    def events(self, *, run: Optional[str] = None, steps: Optional[Iterable[int]] = None,
               types: Optional[Sequence[type]] = None) -> Iterator[Tuple[int, Event]]:
        """(seq, event) of the log, oldest first, of `run`, `steps` and `types` when given."""
        wanted = set(steps) if steps is not None else None
        for seq, event in self._log:
            if run is not None and _run_of(event) != run:
                continue
            if wanted is not None and _step_of(event) not in wanted:
                continue
            if types is not None and not isinstance(event, tuple(types)):
                continue
            yield seq, event

    def as_read_here(self, seq: int, event: Event) -> Event:
        """The event as this journal names things (a memory journal pulls nothing: as it is)."""
        return event

    def lookup(self, step: int, gen_index: int = 0, *, mode: str = "train", run: Optional[str] = None,
               stage: str = _DEFAULT_STAGE) -> Optional[RecordedGeneration]:
        seq = self._keys(run, mode, stage).get((step, gen_index))
        if seq is None:
            return None
        event = self._log[seq - 1][1]
        assert isinstance(event, GenerationRecorded)  # only a record's seq is kept
        return RecordedGeneration(seq, event)

    def recorded_steps(self, *, mode: str = "train", run: Optional[str] = None, start: int = 0,
                       stop: Optional[int] = None, stage: str = _DEFAULT_STAGE) -> List[int]:
        steps = sorted({step for step, _ in self._keys(run, mode, stage)})
        return [s for s in steps if s >= max(start, 0) and (stop is None or s <= stop)]

    def recorded_indices(self, step: int, *, mode: str = "train", run: Optional[str] = None,
                         stage: str = _DEFAULT_STAGE, start: int = 0, stop: Optional[int] = None) -> List[int]:
        return sorted(i for s, i in self._keys(run, mode, stage) if s == step and i >= start
                      and (stop is None or i < stop))

    def step_count(self, *, mode: str = "train", run: Optional[str] = None, start: int = 0,
                   stop: Optional[int] = None, stage: str = _DEFAULT_STAGE) -> int:
        return len(self.recorded_steps(mode=mode, run=run, start=start, stop=stop, stage=stage))

    def nth_step(self, n: int, *, mode: str = "train", run: Optional[str] = None, start: int = 0,
                 stop: Optional[int] = None, stage: str = _DEFAULT_STAGE) -> int:
        steps = self.recorded_steps(mode=mode, run=run, start=start, stop=stop, stage=stage)
        if not -len(steps) <= n < len(steps):
            raise IndexError(f"step #{n} of {len(steps)} recorded steps")
        return steps[n]

    def nearest_below(self, step: int, *, mode: str = "train", run: Optional[str] = None,
                      stage: str = _DEFAULT_STAGE) -> Optional[int]:
        steps = self.recorded_steps(mode=mode, run=run, stage=stage)
        at = bisect.bisect_left(steps, step)
        return steps[at - 1] if at > 0 else None

    def nearest_above(self, step: int, *, mode: str = "train", run: Optional[str] = None,
                      stage: str = _DEFAULT_STAGE) -> Optional[int]:
        steps = self.recorded_steps(mode=mode, run=run, stage=stage)
        at = bisect.bisect_right(steps, step)
        return steps[at] if at < len(steps) else None

    def _keys(self, run: Optional[str], mode: str, stage: str) -> Dict[Tuple[int, int], int]:
        return self._served.get((run or self.run, mode, stage), {})


def memory_view(journal: MemoryJournal, *, mode: str = "train", stage: str = _DEFAULT_STAGE,
                run: Optional[str] = None) -> JournalView:
    """The `JournalView` a policy decides against, over `journal` in memory."""
    return JournalView(journal, run=run, mode=mode, stage=stage)  # type: ignore[arg-type]  # the queries a view makes
