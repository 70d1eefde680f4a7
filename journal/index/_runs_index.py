"""The runs index: what ``stepjournal runs`` prints, kept on append instead of scanned from the log.

``runs`` database (a projection, rebuilt by `reindex`):

- ``b"g" run \\0 stage \\0 mode`` -> the group's row: 8 u64 big-endian (the seq of its first event,
  the seq of its first call or 0, the calls per action in `ACTIONS` order, the smallest and largest
  step of a call that was not refused, ``lo > hi`` when there is none) then the stored output bytes
  (big-endian, as many bytes as the number needs). A `PayloadsReleased` makes a row (it places its
  run in the order) but counts no call.
- ``b"s" run \\0 seq(u64 BE)`` -> empty: the run's `SessionOpened` events.

``meta`` key `META_RUNS_INDEX` holds the seq of the last event folded in. A reader folds whatever
the log holds after it (events another writer appended without this index: none, or a short tail),
so the answer is the scan's; a journal without the index (written before it, opened read-only)
is folded from its first event. Each append updates it in its own write transaction, so a kill
mid-append leaves index and log alike. `summaries` turns the rows into the `RunSummary` list that
`summarize_runs` computes from the whole log (`tests/unit/test_runs_index.py` checks they are equal).
"""

from __future__ import annotations

import struct

import attrs
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple
import lmdb

from ..events._convert import decode_event
from ..base._errors import EventDecodeError
from ..events._events import (ACTIONS, AUDIT_SCHEMA_VERSION, CALL_ACTIONS, Event, EventsImported, SessionOpened,
                              iso_time)
from ..events._keys import META_RUNS_INDEX, seq_key, seq_of
from ..events._words import Action
from ..storage._store import Store

__all__ = ["RunSummary", "RunsFold", "apply_all_in", "catch_up_in", "summaries"]

_ROW = struct.Struct(">8Q")
_NO_STEP = (1 << 64) - 1  # `lo` of a group without a step (any step is smaller)
# An audit row's action -> the place of its count in a group's row (the counts follow `ACTIONS`), and the
# same per call event class (`CALL_ACTIONS`, the one map of call event to action).
_AT_OF_ACTION = {action: 2 + i for i, action in enumerate(ACTIONS)}
_COUNT_AT = {cls: _AT_OF_ACTION[action] for cls, action in CALL_ACTIONS.items()}
_GENERATED_AT, _REFUSED_AT = _AT_OF_ACTION[Action.GENERATED], _AT_OF_ACTION[Action.REFUSED]
Group = Tuple[str, str, str]  # run, stage, mode


@attrs.frozen
class RunSummary:
    """What a journal holds for one run key: its sessions and how its calls went.

    Attributes:
        run: the run key.
        sessions: every `SessionOpened` of the run, in order, with its sequence number.
        counts: calls per action (every action in `ACTIONS` is a key).
        modes: calls per mode.
        stages: calls per stage (``{"generate": 8, "reward": 8}``), in order of first call.
        first_step, last_step: the smallest and largest step of any call (None without calls).
        stored_bytes: encoded size of the outputs this run's calls stored (duplicates counted each time).
    """

    run: str
    sessions: Tuple[Tuple[int, SessionOpened], ...]
    counts: Dict[str, int]
    modes: Dict[str, int]
    first_step: Optional[int]
    last_step: Optional[int]
    stored_bytes: int
    stages: Dict[str, int] = attrs.field(factory=dict)

    @property
    def calls(self) -> int:
        return sum(self.counts.values())

    def fingerprints(self) -> List[Dict[str, Any]]:
        """The distinct fingerprints its sessions opened with, in order of first use."""
        found: List[Dict[str, Any]] = []
        for _, session in self.sessions:
            if session.fingerprint not in found:
                found.append(session.fingerprint)
        return found

    def to_json(self) -> Dict[str, Any]:
        """This summary as a JSON object (the row format of ``stepjournal runs --json``)."""
        return {
            "schema_version": AUDIT_SCHEMA_VERSION,
            "run": self.run,
            "calls": self.calls,
            "counts": dict(self.counts),
            "modes": dict(self.modes),
            "stages": dict(self.stages),
            "first_step": self.first_step,
            "last_step": self.last_step,
            "stored_bytes": self.stored_bytes,
            "fingerprints": self.fingerprints(),
            "sessions": [
                {
                    "seq": seq,
                    "session": s.session,
                    "fingerprint": s.fingerprint,
                    "library_version": s.library_version,
                    "host": s.host,
                    "pid": s.pid,
                    "ts": s.ts,
                    "time": iso_time(s.ts),
                }
                for seq, s in self.sessions
            ],
        }


def _group_key(group: Group) -> bytes:
    return b"g" + "\x00".join(group).encode()


def _session_key(run: str, seq: int) -> bytes:
    return b"s" + run.encode() + b"\x00" + seq_key(seq)


def _pack(row: List[int]) -> bytes:
    stored = row[8]
    return _ROW.pack(*row[:8]) + stored.to_bytes(max(1, (stored.bit_length() + 7) // 8), "big")


def _unpack(raw: bytes) -> List[int]:
    raw = bytes(raw)
    return [*_ROW.unpack_from(raw), int.from_bytes(raw[_ROW.size :], "big")]


def _fold(row: Optional[List[int]], seq: int, event: Event) -> List[int]:
    """The group's row with `event` (a call or a `PayloadsReleased` of that group, log order) folded in."""
    at = _COUNT_AT.get(type(event))
    out = getattr(event, "output", None)
    nbytes = out.nbytes if at == _GENERATED_AT and out is not None else 0
    return _fold_call(row, seq, at, getattr(event, "step", 0), nbytes)


def _fold_call(row: Optional[List[int]], seq: int, at: Optional[int], step: int, nbytes: int) -> List[int]:
    """`_fold` of a call given by its count's place `at` (None: a release), step and stored output bytes."""
    if row is None:
        row = [seq, 0, 0, 0, 0, 0, _NO_STEP, 0, 0]
    if at is None:
        return row  # a release: the group exists (the run's place in the order), no call
    if not row[1]:
        row[1] = seq
    row[at] += 1
    if at != _REFUSED_AT:  # a refused call did not happen at its step (see `summarize_runs`)
        if step < row[6]:
            row[6] = step
        if step > row[7]:
            row[7] = step
    row[8] += nbytes
    return row


def _group_of(event: Event) -> Optional[Group]:
    # Every other event is a call (`_COUNT_AT`) or a release, each of one run, stage and mode.
    if isinstance(event, (SessionOpened, EventsImported)):
        return None
    return (event.run, event.stage, event.mode)


class RunsFold:
    """The index's content in memory: rows per group and session seqs per run, folded event by event."""

    def __init__(self) -> None:
        self.groups: Dict[Group, List[int]] = {}
        self.sessions: Dict[str, List[int]] = {}
        self.last = 0

    def add(self, seq: int, event: Event) -> None:
        if isinstance(event, SessionOpened):
            self.sessions.setdefault(event.run, []).append(seq)
        else:
            group = _group_of(event)
            if group is not None:
                self.groups[group] = _fold(self.groups.get(group), seq, event)
        self.last = max(self.last, seq)

    def add_call(self, group: Group, seq: int, action: str, step: int, nbytes: int) -> None:
        """Fold in a call given by its audit row's values (`_native_rows.Row`: a reindex without event objects;
        `nbytes`: its stored output bytes, 0 when not stored)."""
        at = _AT_OF_ACTION[action]
        self.groups[group] = _fold_call(self.groups.get(group), seq, at, step, nbytes if at == _GENERATED_AT else 0)
        if seq > self.last:
            self.last = seq

    def add_all(self, pairs: Iterable[Tuple[int, Event]]) -> "RunsFold":
        for seq, event in pairs:
            self.add(seq, event)
        return self

    @classmethod
    def read_in(cls, txn: lmdb.Transaction[Any], store: Store) -> Optional["RunsFold"]:
        """The index as `txn` sees it, or None when the journal has none (written before it)."""
        db = store.db("runs")
        covered = txn.get(META_RUNS_INDEX, db=store.db("meta")) if db is not None else None
        if covered is None:
            return None
        fold = cls()
        fold.last = seq_of(covered)
        for key, value in txn.cursor(db=db):
            key = bytes(key)
            if key[:1] == b"g":
                run, stage, mode = key[1:].decode().split("\x00")
                fold.groups[(run, stage, mode)] = _unpack(value)
            elif key[:1] == b"s":
                fold.sessions.setdefault(key[1:-9].decode(), []).append(seq_of(key[-8:]))
        for seqs in fold.sessions.values():
            seqs.sort()
        return fold

    def write_in(self, txn: lmdb.Transaction[Any], store: Store) -> None:
        """Replace the index with this fold (a rebuild inside `txn`)."""
        db = store.db("runs")
        if db is None:
            return
        txn.drop(db, delete=False)
        for group, row in self.groups.items():
            txn.put(_group_key(group), _pack(row), db=db)
        for run, seqs in self.sessions.items():
            for seq in seqs:
                txn.put(_session_key(run, seq), b"", db=db)
        txn.put(META_RUNS_INDEX, seq_key(self.last), db=store.db("meta"))


def _readable_in(txn: lmdb.Transaction[Any], store: Store, since: int) -> Iterable[Tuple[int, Event]]:
    """The events after `since` as `txn` sees the log; one that cannot be decoded is left out (`verify` says so)."""
    cur = txn.cursor(db=store.db("events"))
    if not cur.set_range(seq_key(since + 1)):
        return
    for key, body in cur:
        seq = seq_of(key)
        try:
            yield seq, decode_event(body, seq=seq)
        except EventDecodeError:
            continue


def _last_in(txn: lmdb.Transaction[Any], store: Store) -> int:
    cur = txn.cursor(db=store.db("events"))
    return seq_of(cur.key()) if cur.last() else 0


def apply_all_in(txn: lmdb.Transaction[Any], store: Store, appended: List[Tuple[int, Event]]) -> None:
    """Fold appended events (seq, event, in log order) into the index, in the transaction that appends them:
    each group's row read and written once (first the events before them that the index lacks: another
    library appended them without it)."""
    if not appended:
        return
    db, meta = store.db("runs"), store.db("meta")
    if db is None:
        return
    covered = txn.get(META_RUNS_INDEX, db=meta)
    if covered is None:
        return  # not built (yet): the writable open builds it from the log
    first = appended[0][0]
    if seq_of(covered) < first - 1:
        catch_up_in(txn, store, until=first - 1)
    rows: Dict[bytes, List[int]] = {}
    for seq, event in appended:
        if isinstance(event, SessionOpened):
            txn.put(_session_key(event.run, seq), b"", db=db)
            continue
        group = _group_of(event)
        if group is None:
            continue
        key = _group_key(group)
        row = rows.get(key)
        if row is None:
            raw = txn.get(key, db=db)
            row = None if raw is None else _unpack(raw)
        rows[key] = _fold(row, seq, event)
    for key, row in rows.items():
        txn.put(key, _pack(row), db=db)
    txn.put(META_RUNS_INDEX, seq_key(appended[-1][0]), db=meta)


def catch_up_in(txn: lmdb.Transaction[Any], store: Store, until: Optional[int] = None) -> None:
    """Build the index (absent) or fold in the events it lacks (up to `until`; None: the log's end)."""
    if store.db("runs") is None:
        return
    end = _last_in(txn, store) if until is None else until
    covered = txn.get(META_RUNS_INDEX, db=store.db("meta"))
    if covered is not None and seq_of(covered) >= end:
        return
    fold = RunsFold.read_in(txn, store) or RunsFold()
    for seq, event in _readable_in(txn, store, fold.last):
        if seq > end:
            break
        fold.add(seq, event)
    fold.last = end
    fold.write_in(txn, store)


def summaries(fold: RunsFold, session_event: Callable[[int], SessionOpened],
              stage: Optional[str] = None) -> List[RunSummary]:
    """The `RunSummary` of each run, as `summarize_runs` gives it over the same log (`stage`: only its calls,
    every session, as ``stepjournal runs --stage``)."""
    per_run: Dict[str, List[Tuple[str, str, List[int]]]] = {}
    for (run, group_stage, mode), row in fold.groups.items():
        if stage is None or group_stage == stage:
            per_run.setdefault(run, []).append((group_stage, mode, row))
    firsts = {run: min(row[0] for _s, _m, row in rows) for run, rows in per_run.items()}
    for run, seqs in fold.sessions.items():
        firsts[run] = min(firsts.get(run, seqs[0]), seqs[0])
    out = []
    for run in sorted(firsts, key=firsts.__getitem__):
        rows = per_run.get(run, [])
        calls = [(row[1], group_stage, mode, row) for group_stage, mode, row in rows if row[1]]
        modes: Dict[str, List[int]] = {}
        stages: Dict[str, List[int]] = {}
        for first_call, group_stage, mode, row in calls:
            n = sum(row[2:6])
            for named, key in ((modes, mode), (stages, group_stage)):
                entry = named.setdefault(key, [first_call, 0])
                entry[0], entry[1] = min(entry[0], first_call), entry[1] + n
        spans = [(row[6], row[7]) for _s, _m, row in rows if row[6] <= row[7]]
        out.append(RunSummary(
            run=run,
            sessions=tuple((seq, session_event(seq)) for seq in fold.sessions.get(run, ())),
            counts={action: sum(row[2 + i] for _s, _m, row in rows) for i, action in enumerate(ACTIONS)},
            modes={k: v[1] for k, v in sorted(modes.items(), key=lambda kv: kv[1][0])},
            first_step=min(lo for lo, _ in spans) if spans else None,
            last_step=max(hi for _, hi in spans) if spans else None,
            stored_bytes=sum(row[8] for _s, _m, row in rows),
            stages={k: v[1] for k, v in sorted(stages.items(), key=lambda kv: kv[1][0])},
        ))
    return out
