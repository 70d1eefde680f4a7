"""Where pulled events sit in this journal: (source journal, seq there) -> seq here.

A pulled event keeps its bytes, so an event that names another by seq (a `PayloadsReleased`'s
`record_seq`, a `ReplayServed`'s `source_seq`) names it by the seq it had in the journal that
recorded it. Each `EventsImported` says which source seqs follow it; this map, folded from those
markers in log order, translates such a seq into this journal's own, for the projections, `verify`
and retention.
"""

from __future__ import annotations

import bisect
from typing import Any, Dict, List, Optional, Tuple

import attrs

from ..events._events import Event, EventsImported, PayloadsReleased, ReplayServed

__all__ = ["FoldedImports", "ImportMap"]


class ImportMap:
    """The blocks of pulled events of one journal, folded from its `EventsImported` markers."""

    def __init__(self) -> None:
        self._starts: List[int] = []  # local seq of each block's first event, ascending (log order)
        self._blocks: List[Tuple[int, int, str, int]] = []  # (local first, local last, source, source first)
        # source -> [(source first, source last, local first)]
        self._by_source: Dict[str, List[Tuple[int, int, int]]] = {}

    def __len__(self) -> int:
        """How many pulled blocks the map holds (an empty map: nothing here was pulled)."""
        return len(self._blocks)

    @classmethod
    def of(cls, events: Any) -> "ImportMap":  # Any: a journal's events(types=[EventsImported]), typed Event
        """The map of a journal's markers: `events` yields (seq, `EventsImported`) in log order."""
        found = cls()
        for seq, event in events:
            found.marker(seq, event)
        return found

    def marker(self, seq: int, event: EventsImported) -> None:
        """Fold the marker at `seq`: the events right after it are its source's, in order."""
        count = event.source_last - event.source_first + 1
        if self._starts and self._starts[-1] >= seq + 1:
            return  # folded already (a write transaction run again)
        self._starts.append(seq + 1)
        self._blocks.append((seq + 1, seq + count, event.source, event.source_first))
        rows = self._by_source.setdefault(event.source, [])
        bisect.insort(rows, (event.source_first, event.source_last, seq + 1))

    def source_of(self, seq: int) -> Optional[str]:
        """The journal a local event was pulled from, or None (recorded here)."""
        i = bisect.bisect_right(self._starts, seq) - 1
        if i < 0 or seq > self._blocks[i][1]:
            return None
        return self._blocks[i][2]

    def origin(self, seq: int) -> Optional[Tuple[str, int]]:
        """(source journal, seq there) of a local event that was pulled, or None (recorded here)."""
        i = bisect.bisect_right(self._starts, seq) - 1
        if i < 0 or seq > self._blocks[i][1]:
            return None
        first, _last, source, source_first = self._blocks[i]
        return source, source_first + seq - first

    def replaces(self, seq: int, held: Optional[int]) -> bool:
        """Whether the record at local `seq` takes its call's index entry from the record at `held`.

        The one rule of the step index: a record this journal made always does (None: the entry is
        empty). A pulled record does only where the entry is empty or holds an earlier record of the
        same source journal (that journal's own history, followed): an import never changes what
        this journal already replays, whatever the order selections were imported in.
        """
        if held is None or not self._starts:
            return True
        mine = self.origin(seq)
        if mine is None:
            return True
        theirs = self.origin(held)
        return theirs is not None and theirs[0] == mine[0] and theirs[1] < mine[1]

    def covers(self, source: str, first: int, last: int) -> bool:
        """Whether every event `first`..`last` of `source` was pulled already."""
        rows = self._by_source.get(source, [])
        i = bisect.bisect_right(rows, (first, float("inf"), 0)) - 1
        at = first
        while 0 <= i < len(rows) and rows[i][0] <= at:
            at = max(at, rows[i][1] + 1)
            if at > last:
                return True
            i += 1
        return False

    def local(self, source: str, source_seq: int) -> Optional[int]:
        """The local seq of event `source_seq` of `source`, or None when it was not pulled."""
        rows = self._by_source.get(source, [])
        i = bisect.bisect_right(rows, (source_seq, float("inf"), 0)) - 1
        if i < 0 or not rows[i][0] <= source_seq <= rows[i][1]:
            return None
        return rows[i][2] + source_seq - rows[i][0]

    def translate(self, seq: int, event: Event) -> Event:
        """`event` (at local `seq`) as this journal reads it: a pulled release (or replay) names its record
        by the local seq, or by a seq no event has when that record was not pulled; anything else as is."""
        field = _SEQ_FIELD.get(type(event))
        if field is None or not self._starts:
            return event
        source = self.source_of(seq)
        if source is None:
            return event
        local = self.local(source, getattr(event, field))
        # mypy's attrs plugin cannot evolve a union of classes by a field name known only at run time.
        return attrs.evolve(event, **{field: local if local is not None else _NO_SEQ})  # type: ignore[arg-type]


class FoldedImports:
    """One journal handle's `ImportMap`, folded once and then only from the markers appended since: a
    report or `show` of many replays reads the log once, not once per replay. Events never change once
    written, so what was folded stays true; a pull into the handle is folded at the next read."""

    def __init__(self) -> None:
        self._map, self._folded = ImportMap(), 0  # the markers of seqs 1.._folded are in _map

    def current(self, log: Any, lock: Any) -> ImportMap:
        """The map of every marker `log` (an `EventLog`) holds now; `lock` is the handle's."""
        with lock:
            last = log.last_seq()
            if last > self._folded:
                for seq, marker in log.events(since=self._folded, types=[EventsImported]):
                    self._map.marker(seq, marker)  # a marker past `last` is ignored when it comes again
                self._folded = last
            return self._map


# The field by which an event names another event by seq.
_SEQ_FIELD = {PayloadsReleased: "record_seq", ReplayServed: "source_seq"}
_NO_SEQ = (1 << 64) - 1  # valid for the field, past any seq a journal holds: matches nothing
