"""The event log: append events inside a write transaction, read them back in order.

``events``: sequence number (u64 big-endian, gapless from 1; `_keys.seq_key`) -> event bytes (see
`_convert`). This is the truth every projection is rebuilt from.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import lmdb

from ..events._convert import decode_event
from ..base._errors import JournalError
from ..events._events import Event, EventsImported, SessionOpened
from ..events._keys import seq_key, seq_of
from ._lmdb_check import KEY_ABOVE_ALL
from ._store import Store

__all__ = ["EventLog"]

# Events per read transaction of `raw_events` (events are small: about half a KB each).
_EVENT_BATCH = 2048
_FIRST_BATCH = 64  # the first batch is small and they double: the first rows of a long log come at once
_LAST_SEQ = (1 << 64) - 1


class EventLog:
    """Appending to and reading the ``events`` database.

    Args:
        live: returns the journal's open `Store` (and raises when the journal is closed).
        path: the journal folder, for messages.
    """

    def __init__(self, live: Callable[[], Store], path: str) -> None:
        self._live = live
        self._path = path

    # -- writing ---------------------------------------------------------------------------------
    @staticmethod
    def append_in(txn: lmdb.Transaction[Any], store: Store, bodies: Sequence[bytes]) -> List[int]:
        """Append encoded events inside the write transaction `txn`; return their sequence numbers."""
        db = store.db("events")
        cur = txn.cursor(db=db)
        seq = seq_of(cur.key()) if cur.last() else 0
        seqs = []
        for body in bodies:
            seq += 1
            if not txn.put(seq_key(seq), body, db=db, append=True, overwrite=False):
                raise JournalError(f"event #{seq} already exists; the journal is damaged")
            seqs.append(seq)
        return seqs

    @staticmethod
    def decoded_in(txn: lmdb.Transaction[Any], store: Store) -> Iterator[Tuple[int, Event]]:
        """Every event, decoded, as the transaction `txn` sees the log (for rebuilds inside a write)."""
        for key, body in txn.cursor(db=store.db("events")):
            seq = seq_of(key)
            yield seq, decode_event(body, seq=seq)

    # -- reading ---------------------------------------------------------------------------------
    def last_seq(self) -> int:
        """The sequence number of the newest event (0 for an empty journal)."""
        store = self._live()
        with store.read() as txn:
            cur = txn.cursor(db=store.db_reading(txn, "events", KEY_ABOVE_ALL, None))
            return seq_of(cur.key()) if cur.last() else 0

    def raw_events(self, *, since: int = 0) -> Iterator[Tuple[int, bytes]]:
        """Yield (seq, stored bytes) of every event after `since`, without decoding.

        Events are read in batches, each in its own short transaction: no transaction stays open
        while the caller holds the generator (it would block the other threads, and a fork() then).
        Events never change once written, so the batches join into the log as it was, plus whatever
        was appended meanwhile.
        """
        store = self._live()
        size = _FIRST_BATCH
        while True:
            batch: List[Tuple[int, bytes]] = []
            # The batch reads the seqs since+1 .. since+size (the next batch starts at the
            # first seq past them): a journal checked as read checks just the pages of that range.
            lo, hi = seq_key(since + 1), seq_key(min(since + size, _LAST_SEQ))
            size = min(2 * size, _EVENT_BATCH)
            after = None
            with store.read() as txn:
                cur = txn.cursor(db=store.db_reading(txn, "events", lo, hi))
                if cur.set_range(lo):
                    for key, value in cur:
                        if key > hi:
                            after = seq_of(key)
                            break
                        batch.append((seq_of(key), value))
            yield from batch
            if after is None:
                return
            since = after - 1

    def events(
        self,
        *,
        since: int = 0,
        run: Optional[str] = None,
        types: Optional[Iterable[type]] = None,
        steps: Optional[Any] = None,
        stage: Optional[str] = None,
    ) -> Iterator[Tuple[int, Event]]:
        """Yield (seq, event) in log order, filtered (see `Journal.events`)."""
        wanted = tuple(types) if types is not None else None
        for seq, raw in self.raw_events(since=since):
            event = decode_event(raw, seq=seq)
            if wanted is not None and not isinstance(event, wanted):
                continue
            if run is not None and getattr(event, "run", None) != run:  # an EventsImported has no run
                continue
            if steps is not None and (not hasattr(event, "step") or event.step not in steps):
                continue
            # A session's opening and an import's marker belong to no stage.
            if stage is not None and (isinstance(event, (SessionOpened, EventsImported)) or event.stage != stage):
                continue
            yield seq, event

    def get_raw(self, seq: int) -> Optional[bytes]:
        """The stored bytes of event `seq`, or None."""
        store = self._live()
        with store.read() as txn:
            key = seq_key(seq)
            return txn.get(key, db=store.db_reading(txn, "events", key, key))

    def event(self, seq: int) -> Event:
        """The event with sequence number `seq`."""
        raw = self.get_raw(seq)
        if raw is None:
            raise JournalError(f"journal {self._path!r} has no event #{seq}")
        return decode_event(raw, seq=seq)
