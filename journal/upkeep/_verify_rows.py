"""`verify`'s check of the rows projection: the texts each append kept, against the rows the log gives.

``stepjournal audit --json`` prints the stored texts when they hold the whole log (`_rows_index`); read
from the log, the same rows come from `_call_rows.json_rows` and `_row_text`. A stored row that differs
from the log's, is missing or has no event would make the verb's output wrong, so each is a problem
of kind ``rows``, which `reindex` mends (it rebuilds the rows from the log).
"""

from __future__ import annotations

import itertools
from typing import Iterable, Iterator, List, Optional, Tuple

from ..base._errors import EventDecodeError
from ..index._call_rows import json_rows, releases_of
from ..index._row_text import compact_texts

__all__ = ["rows_problems"]

_SHOWN = 20  # differing rows reported one by one; past that, one problem counts the rest
_FIX = "run `stepjournal reindex` (it rebuilds the rows from the log)"


def rows_problems(raw: List[Tuple[int, bytes]], stored: Optional[Iterable[Tuple[int, bytes]]]) -> List[Tuple[str, str]]:
    """(where, detail) of each stored row that is not the log's (`raw`: (seq, stored bytes) of every event;
    `stored`: (seq, text) of every stored row, those past the log's end too, None when the rows do not hold
    the log: nothing to check). An event that cannot be decoded is the log pass's problem; the rows of such
    a log are not compared."""
    if stored is None:
        return []
    found: List[Tuple[int, str]] = []
    kept = iter(stored)
    here = next(kept, None)
    try:
        for seq, text in _expected(raw):
            while here is not None and here[0] < seq:
                found.append((here[0], "the rows hold a row for this seq, which the log has no row for"))
                here = next(kept, None)
            if here is None or here[0] != seq:
                found.append((seq, "the rows lack this event's row"))
            else:
                if bytes(here[1]) != text:
                    found.append((seq, "the stored row differs from the row the log gives"))
                here = next(kept, None)
    except EventDecodeError:  # the log pass reports the event
        return []
    while here is not None:  # past the log's last row (the caller compares only when no writer appended since)
        found.append((here[0], "the rows hold a row for this seq, which the log has no row for"))
        here = next(kept, None)
    shown = [(str(seq), f"audit row #{seq}: {what}; {_FIX}") for seq, what in found[:_SHOWN]]
    if len(found) > _SHOWN:
        shown.append(("...", f"{len(found) - _SHOWN} more audit rows differ from the log's; {_FIX}"))
    return shown


def _expected(raw: List[Tuple[int, bytes]]) -> Iterator[Tuple[int, bytes]]:
    """(seq, compact text) of each row the log gives, as ``audit --json`` reads the log."""
    rows = json_rows(raw, native=True, released_by=releases_of(raw))
    for batch in iter(lambda: list(itertools.islice(rows, 512)), []):
        yield from zip([row["seq"] for row in batch], compact_texts(batch))
