"""Queries of the projections: the reading half of `Journal` over its indexes (a base class the facade inherits).

Each answer is one read transaction on the ``gen`` / ``steps`` indexes (`_projections`), for one
(run, mode, stage): nothing is cached, so what another process appended is seen at once.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .events._events import CALL_EVENT_TYPES
from .events._keys import DEFAULT_STAGE
from .events._keys import check_key as _check_key
from .events._keys import check_step as _check_step
from .index._projections import Projections, RecordedGeneration
from .index._rows_index import stored_layout, stored_rows
from .index._runs_index import RunSummary, RunsFold, summaries

__all__ = ["Queries"]


class Queries:
    """The lookup and recorded-step methods of `Journal`; the facade provides the attributes used here."""

    run: str
    _index: Projections

    def _live(self) -> Any:  # pragma: no cover - provided by Journal
        raise NotImplementedError

    def events(self, **filters: Any) -> Iterator[Tuple[int, Any]]:  # pragma: no cover - provided by Journal
        raise NotImplementedError

    def event(self, seq: int) -> Any:  # pragma: no cover - provided by Journal
        raise NotImplementedError

    def lookup(self, step: int, gen_index: int = 0, *, mode: str = "train", run: Optional[str] = None,
               stage: str = DEFAULT_STAGE) -> Optional[RecordedGeneration]:
        """The latest recorded call with a stored output at (run, mode, stage, step, gen_index), or None."""
        run = run or self.run
        _check_key(run, mode, stage)
        _check_step(step, gen_index)
        return self._index.lookup(self._live(), run, mode, step, gen_index, stage)

    def recorded_steps(self, *, mode: str = "train", run: Optional[str] = None, start: int = 0,
                       stop: Optional[int] = None, stage: str = DEFAULT_STAGE) -> List[int]:
        """Every step with at least one recorded output, ascending (from `start` to `stop` inclusive)."""
        return self._index.steps(self._live(), run or self.run, mode, max(start, 0), stop, stage)

    def recorded_indices(self, step: int, *, mode: str = "train", run: Optional[str] = None,
                         stage: str = DEFAULT_STAGE, start: int = 0, stop: Optional[int] = None) -> List[int]:
        """The call indices recorded (with output) at `step`, ascending; only ``start <= index < stop`` when given
        (read as a range of the index: a tool call's sample, `ToolCallKey.sample_span`)."""
        if isinstance(step, bool) or not isinstance(step, int):
            _check_step(step)  # a step that is no int (1.5, True) is refused, naming it
        if step < 0:
            return []  # as lookup: no step below 0 is ever recorded
        return self._index.indices(self._live(), run or self.run, mode, step, stage, start, stop)

    def step_count(self, *, mode: str = "train", run: Optional[str] = None, start: int = 0,
                   stop: Optional[int] = None, stage: str = DEFAULT_STAGE) -> int:
        """How many distinct steps have a recorded output (from `start` to `stop` inclusive)."""
        if stop is not None and stop < max(start, 0):
            return 0
        return self._index.count(self._live(), run or self.run, mode, max(start, 0), stop, stage)

    def nth_step(self, n: int, *, mode: str = "train", run: Optional[str] = None, start: int = 0,
                 stop: Optional[int] = None, stage: str = DEFAULT_STAGE) -> int:
        """The n-th recorded step in ascending order (negative n counts from the end), within `start`..`stop`.

        Raises:
            IndexError: fewer steps are recorded.
        """
        if stop is not None and stop < max(start, 0):
            raise IndexError(f"step #{n} of 0 recorded steps")
        return self._index.nth(self._live(), run or self.run, mode, n, max(start, 0), stop, stage)

    def nearest_below(self, step: int, *, mode: str = "train", run: Optional[str] = None,
                      stage: str = DEFAULT_STAGE) -> Optional[int]:
        """The largest recorded step smaller than `step`, or None."""
        return self._index.nearest_below(self._live(), run or self.run, mode, step, stage)

    def nearest_above(self, step: int, *, mode: str = "train", run: Optional[str] = None,
                      stage: str = DEFAULT_STAGE) -> Optional[int]:
        """The smallest recorded step larger than `step`, or None."""
        return self._index.nearest_above(self._live(), run or self.run, mode, step, stage)

    def stages(self, *, run: Optional[str] = None) -> List[str]:
        """The stages with at least one journaled call (of `run`; None: every run), in first-seen order."""
        seen: Dict[str, None] = {}
        for _, event in self.events(run=run, types=CALL_EVENT_TYPES):
            seen.setdefault(event.stage, None)
        return list(seen)

    def stored_audit_rows(self, *, laid_out: bool = False, limit: Optional[int] = None) -> Optional[Iterator[bytes]]:
        """The rows ``stepjournal audit --json`` prints, as the rows projection keeps them (`_rows_index`), in
        log order, read in batches of short read transactions: each row's JSON object (compact, UTF-8), or
        with `laid_out` the printed array's body a batch at a time (rows joined by ``,\\n``, laid out as the
        verb prints them); at most `limit` rows. None when the projection does not hold the whole log (a
        journal a library without it wrote last, opened read-only): then read the rows from the log, as
        `audit` does.

        Raises:
            IntegrityError: a stored row is not one this library writes (run ``stepjournal verify``).
        """
        store, last = self._live(), self.last_seq()
        if laid_out:
            return stored_layout(store, last, limit)
        rows = stored_rows(store, last)
        return rows if rows is None or limit is None else itertools.islice(rows, limit)

    def last_seq(self) -> int:  # pragma: no cover - provided by Journal
        raise NotImplementedError

    def run_summaries(self, *, stage: Optional[str] = None) -> List[RunSummary]:
        """One `RunSummary` per run key, as `summarize_runs` gives it, read from the runs index.

        What the index does not hold yet (a journal written before it, opened read-only; events a
        writer without it appended) is folded from the log, so the answer is always the scan's.

        Args:
            stage: only the calls of this stage (every session is kept), as ``stepjournal runs --stage``.

        Raises:
            EventDecodeError: an event the index does not hold cannot be decoded.
        """
        store = self._live()
        with store.read() as txn:
            fold = RunsFold.read_in(txn, store) or RunsFold()
        fold.add_all(self.events(since=fold.last))
        return summaries(fold, self.event, stage)
