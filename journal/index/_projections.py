"""The projections: state derived from the event log, kept up to date by each append, rebuilt by `reindex`.

- ``gen`` (the step index): `_keys.gen_key` -> seq of the latest `GenerationRecorded` with a stored
  output for that call. Read by `lookup`; `nearest_below` / `nearest_above` / `indices` are cursor
  moves on it under the (run, mode, stage) prefix.
- ``steps`` (the rank index): `_keys.rank_key` (run, mode, stage, ordinal) -> step: the distinct
  recorded steps of one (run, mode, stage) ascending, numbered from 0. It is written in the transaction that writes
  the first record of a step, so the count is the last ordinal + 1 and the n-th step is one read. A
  step recorded below the largest one (out of order) shifts the ordinals above it up by one: free
  for a trainer, which records ascending; O(steps above it) otherwise. `reindex` rebuilds it from
  ``gen`` in one ordered pass.
- ``sessions`` (the sessions index): session id -> seq of its `SessionOpened`, so a session's
  fingerprint is one read, not a scan of the log.

A journal may lack an index's database (a library that kept none wrote it): opened read-only they fall back (a scan
of the log for sessions, a walk of ``gen`` for ranks: time, never memory); opened for writing they
build it once (``meta`` keys ``sessions_index`` and ``steps_index`` say it was built).

Key layout (``meta`` key ``layout``, see `_keys`): layout 1 has no stage in the
keys. Opened for writing, its indexes are rebuilt in layout 2 in one write transaction
(`upgrade_layout_in`); opened read-only, the layout-1 index is read as it is: its keys are those of
the ``"generate"`` stage (the only one layout 1 holds) and every other stage has no records. A layout
newer than this library's is refused (`check_layout`). Nothing is
kept in memory, so a fresh handle answers its first decision as fast as its thousandth, and what
another process appended is seen at once.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Tuple

import attrs
import lmdb

from ._call_rows import KeyRuleCache, checked_row
from ..events._convert import decode_event, encode_event, event_of
from ..base._errors import EventDecodeError, IntegrityError, UnsupportedSchemaVersionError
from . import _rows_index as rows_index
from . import _runs_index as runs_index
from ..storage._eventlog import EventLog
from ..events._events import Event, EventsImported, GenerationRecorded, PayloadsReleased, SessionOpened
from ._import_map import ImportMap
from ..events._keys import (
    DEFAULT_STAGE,
    LAYOUT_VERSION,
    META_LAYOUT,
    MAX_KEY_BYTES,
    MAX_GEN_INDEX,
    MAX_STEP,
    META_SESSIONS_INDEX,
    META_STEPS_INDEX,
    gen_key_at,
    gen_prefix,
    prefix_end,
    rank_key,
    seq_key,
    seq_of,
    session_key,
)
from ..storage._store import Store

__all__ = ["RecordedGeneration", "Projections", "SESSIONS_FLAG", "STEPS_FLAG"]

# ``meta`` keys: present once the sessions / rank index holds everything of the log.
SESSIONS_FLAG = META_SESSIONS_INDEX
STEPS_FLAG = META_STEPS_INDEX
_STEP = 8  # bytes of the step (and of an ordinal) in a key


@attrs.frozen
class RecordedGeneration:
    """A recorded generate call that has a stored output: its sequence number and event."""

    seq: int
    event: GenerationRecorded

    @property
    def step(self) -> int:
        return self.event.step

    @property
    def gen_index(self) -> int:
        return self.event.gen_index


def layout_of(txn: lmdb.Transaction[Any], store: Store) -> int:
    """The key layout of the ``gen`` and ``steps`` indexes as `txn` sees them (absent: 1, no stage in the keys)."""
    raw = txn.get(META_LAYOUT, db=store.db("meta"))
    if raw is None:
        return 1
    try:
        return int(bytes(raw))
    except ValueError:
        raise IntegrityError(f"the journal's meta key 'layout' holds {bytes(raw)[:20]!r}, not a number") from None


def _prefix(txn: lmdb.Transaction[Any], store: Store, run: str, mode: str, stage: str) -> Optional[bytes]:
    """The index prefix of (run, mode, stage) in the layout on disk; None: that layout has no such stage."""
    layout = layout_of(txn, store)
    if layout == 1:
        return gen_prefix(run, mode, layout=1) if stage == DEFAULT_STAGE else None
    return gen_prefix(run, mode, stage)


def _step_of(key: bytes, start: int) -> int:
    return int.from_bytes(key[start : start + _STEP], "big")


def _has_step_in(txn: lmdb.Transaction[Any], gen: lmdb._Database, prefix: bytes, step: int) -> bool:
    """Whether ``gen`` holds a record of `step` under `prefix`."""
    skey = prefix + step.to_bytes(_STEP, "big")
    cur = txn.cursor(db=gen)
    return cur.set_range(skey) and bytes(cur.key()).startswith(skey)


class _Ranks:
    """Order statistics of one (run, mode) inside one transaction: from ``steps``, or by walking ``gen``."""

    def __init__(self, txn: lmdb.Transaction[Any], store: Store, prefix: bytes) -> None:
        self.txn, self.prefix = txn, prefix
        self.gen = store.db("gen")
        steps = store.db("steps")
        # Without a built rank index (an old journal opened read-only) the answers come from `gen`.
        built = steps is not None and txn.get(STEPS_FLAG, db=store.db("meta")) is not None
        self.db = steps if built else None

    def count(self) -> int:
        if self.db is None:
            return sum(1 for _ in self.walk(0))
        cur = self.txn.cursor(db=self.db)
        found = cur.prev() if cur.set_range(prefix_end(self.prefix)) else cur.last()
        if not found or not bytes(cur.key()).startswith(self.prefix):
            return 0
        return _step_of(cur.key(), len(self.prefix)) + 1

    def nth(self, ordinal: int) -> int:
        """The `ordinal`-th step (0 <= ordinal < count)."""
        if self.db is None:
            for i, step in enumerate(self.walk(0)):
                if i == ordinal:
                    return step
            raise IndexError(ordinal)
        raw = self.txn.get(rank_key(self.prefix, ordinal), db=self.db)
        if raw is None:
            raise IntegrityError(f"the rank index has no step #{ordinal}; run `stepjournal reindex`")
        return int.from_bytes(raw, "big")

    def rank(self, step: int, count: int) -> int:
        """How many recorded steps are smaller than `step` (binary search over the ordinals)."""
        if self.db is None:
            return sum(1 for s in self.walk(0) if s < step)
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) // 2
            if self.nth(mid) < step:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def walk(self, start: int, stop: Optional[int] = None) -> Iterator[int]:
        """The distinct recorded steps from `start` to `stop` (inclusive) ascending, from ``gen``."""
        prefix, at = self.prefix, len(self.prefix)
        cur = self.txn.cursor(db=self.gen)
        if not cur.set_range(prefix + start.to_bytes(_STEP, "big")):
            return
        last = None
        for key in cur.iternext(values=False):
            if not key.startswith(prefix):
                return
            step = _step_of(key, at)
            if stop is not None and step > stop:
                return
            if step != last:
                yield step
                last = step

    def insert(self, step: int) -> None:
        """Give a newly recorded `step` its ordinal, shifting the larger steps' ordinals up by one."""
        txn, db, prefix = self.txn, self.db, self.prefix
        count = self.count()
        if count and self.nth(count - 1) > step:
            at = self.rank(step, count)
            for ordinal in range(count - 1, at - 1, -1):
                # Every ordinal below count() holds a step, so get() finds one.
                txn.put(rank_key(prefix, ordinal + 1), txn.get(rank_key(prefix, ordinal), db=db),  # type: ignore[arg-type]
                        db=db)
            count = at
        txn.put(rank_key(prefix, count), step.to_bytes(_STEP, "big"), db=db)

    def remove(self, step: int) -> None:
        """Take a step that no longer has a record out, shifting the larger steps' ordinals down by one."""
        txn, db, prefix = self.txn, self.db, self.prefix
        count = self.count()
        at = self.rank(step, count)
        if at >= count or self.nth(at) != step:
            return
        cur = txn.cursor(db=db)
        above = []
        if cur.set_range(rank_key(prefix, at + 1)):
            for key, value in cur:
                if not bytes(key).startswith(prefix):
                    break
                above.append(bytes(value))
        if above:
            txn.cursor(db=db).putmulti([(rank_key(prefix, at + i), v) for i, v in enumerate(above)])
        txn.delete(rank_key(prefix, count - 1), db=db)


class _GenIndex:
    """Where every record lands in the ``gen`` step index and the ``steps`` rank index, and where a
    release takes it out: the one writer of both, for an append (`Projections.apply_in`) and for
    `reindex` (`Projections.rebuild_in`).

    A record's key goes in unless the step index's rule for pulled records (`ImportMap.replaces`)
    keeps the one there; a step new to its (run, mode, stage) takes its rank. Rebuilding, the table
    starts empty and a trainer's log comes in key order (steps ascending): a key above every key in
    the table is appended (no search, full pages), and while every key is, the rank index is appended
    in the same pass (`_build_ranks_in` makes it afterwards otherwise).
    """

    __slots__ = ("txn", "store", "gen", "steps", "imports", "rebuilding", "prefixes", "last", "ranks_inline",
                 "rank_prefix", "ordinal", "rank_last")

    def __init__(self, txn: lmdb.Transaction[Any], store: Store, imports: Optional[ImportMap], *,
                 rebuilding: bool = False) -> None:
        gen = store.db("gen")
        assert gen is not None  # it folds events in a write, and a writable open makes every database
        self.txn, self.store, self.gen, self.steps = txn, store, gen, store.db("steps")
        self.imports, self.rebuilding = imports, rebuilding
        self.prefixes: dict = {}
        self.last = b""
        self.ranks_inline = rebuilding and self.steps is not None
        self.rank_prefix, self.ordinal, self.rank_last = b"", 0, -1

    def put(self, seq: int, run: str, mode: str, stage: str, step: int, gen_index: int, *, ranks: bool = True,
            seq_bytes: Optional[bytes] = None) -> None:
        """Index the record `seq` of one call (`ranks`: keep the rank index too, when it exists; a
        rebuild keeps it inline or builds it after); `seq_bytes`: its stored key, when at hand."""
        group = (run, mode, stage)
        prefix = self.prefixes.get(group)
        if prefix is None:
            if len(self.prefixes) > 65536:  # hostile variety: keep memory bounded
                self.prefixes.clear()
            prefix = self.prefixes[group] = gen_prefix(*group)
        key = gen_key_at(prefix, step, gen_index)
        txn = self.txn
        value = seq_bytes if seq_bytes is not None and len(seq_bytes) == 8 else seq_key(seq)
        if self.rebuilding and key > self.last:
            txn.put(key, value, db=self.gen, append=True)
            self.last = key
            if self.ranks_inline:
                if prefix != self.rank_prefix:
                    self.rank_prefix, self.ordinal, self.rank_last = prefix, 0, -1
                if step != self.rank_last:
                    txn.put(rank_key(prefix, self.ordinal), step.to_bytes(_STEP, "big"), db=self.steps, append=True)
                    self.ordinal, self.rank_last = self.ordinal + 1, step
            return
        if self.imports is not None:
            held = txn.get(key, db=self.gen)
            if not self.imports.replaces(seq, seq_of(held) if held is not None else None):
                return
        if self.rebuilding:
            txn.put(key, value, db=self.gen)
            self.ranks_inline = False
            return
        new_step = ranks and self.steps is not None and not _has_step_in(txn, self.gen, prefix, step)
        txn.put(key, value, db=self.gen)
        if new_step:
            r = _Ranks(txn, self.store, prefix)
            if r.db is not None:
                r.insert(step)

    def release(self, record_seq: int, run: str, mode: str, stage: str, step: int, gen_index: int, *,
                ranks: bool = True) -> None:
        """Retention released the record `record_seq`: its key goes, when it still names that record, and
        the step's rank with it when no other record of the step is left (`ranks`, as for `put`)."""
        prefix = gen_prefix(run, mode, stage)
        key = gen_key_at(prefix, step, gen_index)
        txn = self.txn
        raw = txn.get(key, db=self.gen)
        if raw is None or seq_of(raw) != record_seq:
            return
        txn.delete(key, db=self.gen)
        if self.rebuilding:  # appends go after what the table holds now; the ranks are built after
            self.ranks_inline = False
            cur = txn.cursor(db=self.gen)
            self.last = bytes(cur.key()) if cur.last() else b""
        elif ranks and self.steps is not None and not _has_step_in(txn, self.gen, prefix, step):
            r = _Ranks(txn, self.store, prefix)
            if r.db is not None:
                r.remove(step)


_PROJECTED = ("gen", "steps", "sessions", "runs", "rows")  # the databases `rebuild_in` writes


class Projections:
    """The step index, the rank index and the sessions index of one journal.

    Not thread-safe by itself: the journal calls it under its lock.
    """

    def __init__(self, log: EventLog) -> None:
        self._log = log

    # -- inside write transactions ---------------------------------------------------------------
    @classmethod
    def append_and_project_in(cls, txn: lmdb.Transaction[Any], store: Store, events: List[Event],
                              bodies: Optional[List[bytes]] = None, *, imports: Optional[ImportMap] = None,
                              ranks: bool = True) -> List[Tuple[int, Event]]:
        """Append `events` to the log (their stored `bodies`, else encoded here) and project each in the same
        transaction: the one way a record, a prune and a pull add events. With `imports` (a pull), an
        `EventsImported` marks its block and each event is projected as translated to this journal's seqs
        (`ImportMap.translate`). Returns (seq, event as projected) of each."""
        encoded = bodies if bodies is not None else [encode_event(e) for e in events]
        appended, stored = [], []
        index = _GenIndex(txn, store, imports)  # one for the batch: its prefixes are kept from event to event
        for seq, event in zip(EventLog.append_in(txn, store, encoded), events):
            stored.append((seq, event))
            if imports is not None:
                if isinstance(event, EventsImported):
                    imports.marker(seq, event)
                event = imports.translate(seq, event)
            cls.apply_in(txn, store, seq, event, ranks=ranks, runs=False, imports=imports, index=index)
            appended.append((seq, event))
        runs_index.apply_all_in(txn, store, appended)  # one read and write of each run's row per batch
        rows_index.apply_in(txn, store, stored, imports, encoded)  # the audit rows read the events as stored
        return appended

    @staticmethod
    def apply_in(txn: lmdb.Transaction[Any], store: Store, seq: int, event: Event, *, ranks: bool = True,
                 runs: bool = True, imports: Optional[ImportMap] = None, index: Optional[_GenIndex] = None) -> None:
        """Project one appended event, in the transaction that appends it (`ranks`: the rank index
        too; `runs`: the runs index too; `imports`: the journal's pulled blocks, which decide whether
        a pulled record takes its call's entry, `ImportMap.replaces`; `index`: the rebuild's writer of
        the step and rank indexes, else one for this event)."""
        if runs:
            runs_index.apply_all_in(txn, store, [(seq, event)])
        if isinstance(event, GenerationRecorded):
            if event.output is not None:
                (index or _GenIndex(txn, store, imports)).put(seq, event.run, event.mode, event.stage, event.step,
                                                             event.gen_index, ranks=ranks)
        elif isinstance(event, PayloadsReleased):
            # Retention released the record: `lookup` and the step queries stop seeing it.
            (index or _GenIndex(txn, store, imports)).release(event.record_seq, event.run, event.mode, event.stage,
                                                             event.step, event.gen_index, ranks=ranks)
        elif isinstance(event, SessionOpened):
            sessions = store.db("sessions")
            key = session_key(event.session)
            # An id LMDB cannot take as a key is left out; its lookups fall back to a scan.
            if sessions is not None and 0 < len(key) <= MAX_KEY_BYTES:
                txn.put(key, seq_key(seq), db=sessions)

    @classmethod
    def rebuild_in(cls, txn: lmdb.Transaction[Any], store: Store, *, skip_damaged: bool = False) -> int:
        """Drop every index and replay the log into it, all inside `txn`; return the events replayed.

        Reading the log in the same write transaction means no event committed by another process
        can slip between the read and the rebuild (LMDB has one writer at a time). The indexes are
        written in the current key layout, which ``meta`` then names.

        Args:
            skip_damaged: leave out events that cannot be decoded (`verify` reports them) instead of
                raising: for the layout upgrade at open, which must not make a damaged journal unopenable.

        Raises:
            EventDecodeError: an event cannot be decoded (and not `skip_damaged`); the caller's
                transaction is aborted.
        """
        for name in ("gen", "sessions", "steps"):
            db = store.db(name)
            if db is not None:
                txn.drop(db, delete=False)
        from ._native_rows import index_fields  # msgspec: imported by the verbs that use it

        count, runs, seq, keys, imports, damaged = 0, runs_index.RunsFold(), 0, KeyRuleCache(), ImportMap(), False
        index = _GenIndex(txn, store, imports, rebuilding=True)
        # The rows are rewritten in place: only a row that differs from the log's is written.
        rows = rows_index.RowsWriter(txn, store, imports, rewrite=True) if store.db("rows") is not None else None
        for seq_bytes, body in txn.cursor(db=store.db("events")):
            seq = seq_of(seq_bytes)
            # A call event msgspec decodes exactly, or whose map passes its class's rules, is projected
            # from its row (no event object); anything else is decoded, which projects it or raises the
            # same error.
            row, found = checked_row(seq, body, keys)
            if row is not None:
                run, mode, stage, step, gen_index, action, stored = index_fields(row)
                if stored is not None:
                    index.put(seq, run, mode, stage, step, gen_index, seq_bytes=seq_bytes)
                runs.add_call((run, stage, mode), seq, action, step, stored or 0)
                if rows is not None:
                    rows.add(seq, row)
                count += 1
                continue
            try:
                event = event_of(body, found, seq=seq)  # `found`: the map checked above, not unpacked again
            except EventDecodeError:
                if not skip_damaged:
                    raise
                damaged = True
                continue
            if rows is not None:
                rows.event(seq, event)  # as stored: the rows say a pulled event's origin themselves
            if isinstance(event, EventsImported):
                imports.marker(seq, event)
            event = imports.translate(seq, event)  # a pulled release names its record by this journal's seq
            cls.apply_in(txn, store, seq, event, runs=False, imports=imports, index=index)
            runs.add(seq, event)
            count += 1
        runs.last = seq
        runs.write_in(txn, store)
        if rows is not None:
            rows.finish(seq, damaged=damaged)
        if store.db("sessions") is not None:
            txn.put(SESSIONS_FLAG, b"1", db=store.db("meta"))
        if index.ranks_inline:
            txn.put(STEPS_FLAG, b"1", db=store.db("meta"))
        else:
            cls._build_ranks_in(txn, store)
        txn.put(META_LAYOUT, str(LAYOUT_VERSION).encode(), db=store.db("meta"))
        return count

    @staticmethod
    def rebuild_bytes(store: Store) -> int:
        """What `rebuild_in` may write, at most: the projections' pages as they are (the rows' whole, though it
        writes only the rows that differ). The pages it drops are free only to later transactions, so it writes
        that much anew; the map grows for it before the rebuild starts
        (`Store.write`'s `needed`) rather than filling midway, which would run the whole rebuild again."""
        with store.read() as txn:
            dbs = [store.db(name) for name in _PROJECTED]
            stats = [txn.stat(db) for db in dbs if db is not None]
        return sum((s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]) * s["psize"] for s in stats)

    @classmethod
    def upgrade_layout_in(cls, txn: lmdb.Transaction[Any], store: Store, *, new: bool) -> bool:
        """Bring the indexes to this library's key layout inside `txn` (a writable open); True if rebuilt.

        A new journal is marked with the current layout; a journal of layout 1 is reindexed.

        Raises:
            UnsupportedSchemaVersionError: the layout is newer than this library reads.
        """
        layout = cls.check_layout_in(txn, store)
        if new:
            txn.put(META_LAYOUT, str(LAYOUT_VERSION).encode(), db=store.db("meta"))
            return False
        if layout < LAYOUT_VERSION:
            cls.rebuild_in(txn, store, skip_damaged=True)
            return True
        return False

    @staticmethod
    def check_layout_in(txn: lmdb.Transaction[Any], store: Store) -> int:
        """The layout on disk; refuses one newer than this library's.

        Raises:
            UnsupportedSchemaVersionError: naming both versions and what to do.
        """
        layout = layout_of(txn, store)
        if layout > LAYOUT_VERSION:
            raise UnsupportedSchemaVersionError(
                f"the journal's key layout is version {layout}; this stepjournal reads up to {LAYOUT_VERSION}: "
                "it was written by a newer stepjournal, so upgrade stepjournal from the clone or wheel that wrote "
                "the journal to open it"
            )
        return layout

    @staticmethod
    def build_ranks_in(txn: lmdb.Transaction[Any], store: Store) -> None:
        """Rewrite the rank index from ``gen`` (after events applied with ``ranks=False``)."""
        Projections._build_ranks_in(txn, store)

    @staticmethod
    def _build_ranks_in(txn: lmdb.Transaction[Any], store: Store) -> None:
        """Write the rank index from ``gen`` in one ordered pass (both are ordered by prefix first)."""
        steps = store.db("steps")
        if steps is None:
            return
        txn.drop(steps, delete=False)
        prefix, ordinal, last = b"", 0, None
        for key in txn.cursor(db=store.db("gen")).iternext(values=False):
            key = bytes(key)
            head, step = key[: -_STEP - 4], _step_of(key, len(key) - _STEP - 4)
            if head != prefix:
                prefix, ordinal, last = head, 0, None
            if step != last:
                txn.put(rank_key(prefix, ordinal), step.to_bytes(_STEP, "big"), db=steps, append=True)
                ordinal, last = ordinal + 1, step
        txn.put(STEPS_FLAG, b"1", db=store.db("meta"))

    @classmethod
    def ensure_sessions_in(cls, txn: lmdb.Transaction[Any], store: Store, *, new: bool) -> None:
        """Build the sessions, rank and runs indexes of a journal that lacks them (once, when
        writable; the runs index also folds in what a writer without it appended)."""
        meta = store.db("meta")
        runs_index.catch_up_in(txn, store)
        rows_index.catch_up_in(txn, store, build=True)
        if store.db("steps") is not None and txn.get(STEPS_FLAG, db=meta) is None:
            cls._build_ranks_in(txn, store)
        sessions = store.db("sessions")
        if sessions is None or txn.get(SESSIONS_FLAG, db=meta) is not None:
            return
        if not new:
            # Damaged events are skipped here (verify reports them); their sessions fall back to a scan.
            for key, body in txn.cursor(db=store.db("events")):
                seq = seq_of(key)
                try:
                    event = decode_event(body, seq=seq)
                except EventDecodeError:
                    continue
                if isinstance(event, SessionOpened):
                    Projections.apply_in(txn, store, seq, event)
        txn.put(SESSIONS_FLAG, b"1", db=meta)

    # -- reading ---------------------------------------------------------------------------------
    def session_seq(self, store: Store, session: str) -> Optional[int]:
        """The seq of `session`'s SessionOpened per the sessions index, or None (not indexed)."""
        sessions = store.db("sessions")
        if sessions is None:
            return None
        key = session_key(session)
        if not 0 < len(key) <= MAX_KEY_BYTES:
            return None
        with store.read() as txn:
            raw = txn.get(key, db=sessions)
        return seq_of(raw) if raw is not None else None

    def index_items(self, store: Store) -> List[Tuple[bytes, int]]:
        """The ``gen`` index as (key, seq) pairs, in key order."""
        with store.read() as txn:
            return [(bytes(k), seq_of(v)) for k, v in txn.cursor(db=store.db("gen"))]

    def lookup(
        self, store: Store, run: str, mode: str, step: int, gen_index: int, stage: str = DEFAULT_STAGE
    ) -> Optional[RecordedGeneration]:
        """The latest recorded call with a stored output at the call, or None (see `Journal.lookup`)."""
        with store.read() as txn:
            prefix = _prefix(txn, store, run, mode, stage)
            if prefix is None:
                return None
            key = prefix + step.to_bytes(_STEP, "big") + gen_index.to_bytes(4, "big")
            raw_seq = txn.get(key, db=store.db("gen"))
            if raw_seq is None:
                return None
            seq = seq_of(raw_seq)
            raw = txn.get(seq_key(seq), db=store.db("events"))
        where = f"step {step} index {gen_index}" + ("" if stage == DEFAULT_STAGE else f" of stage {stage!r}")
        if raw is None:
            raise IntegrityError(f"index entry for {where} points at missing event #{seq}", step=step)
        try:
            event = decode_event(raw, seq=seq)
        except EventDecodeError as exc:
            raise type(exc)(f"{exc} (the record of {where})", step=step) from None
        if not isinstance(event, GenerationRecorded) or (
            event.run, event.mode, event.stage, event.step, event.gen_index
        ) != (run, mode, stage, step, gen_index):
            raise IntegrityError(
                f"index entry for {where} points at event #{seq}, which is another call; run `stepjournal reindex`",
                step=step,
            )
        return RecordedGeneration(seq, event)

    def clear(self) -> None:
        """Forget cached state (after a rebuild, or in a fork child): there is none; every answer is read."""

    # -- recorded steps: cursor moves on ``gen`` and reads of ``steps``, memory independent of history --
    def count(
        self, store: Store, run: str, mode: str, start: int = 0, stop: Optional[int] = None, stage: str = DEFAULT_STAGE
    ) -> int:
        """How many distinct steps from `start` to `stop` (inclusive; None: no end) are recorded."""
        with store.read() as txn:
            prefix = _prefix(txn, store, run, mode, stage)
            if prefix is None:
                return 0
            r = _Ranks(txn, store, prefix)
            if r.db is None and (start or stop is not None):
                return sum(1 for _ in r.walk(start, stop))
            total = r.count()
            hi = total if stop is None or stop >= MAX_STEP else r.rank(stop + 1, total)
            return max(0, hi - (r.rank(start, total) if start > 0 else 0))

    def nth(
        self,
        store: Store,
        run: str,
        mode: str,
        n: int,
        start: int = 0,
        stop: Optional[int] = None,
        stage: str = DEFAULT_STAGE,
    ) -> int:
        """The n-th recorded step from `start` to `stop` ascending (negative n from the end).

        Raises:
            IndexError: fewer than n + 1 (or -n) steps are recorded there.
        """
        with store.read() as txn:
            prefix = _prefix(txn, store, run, mode, stage)
            if prefix is None:
                raise IndexError(f"step #{n} of 0 recorded steps")
            r = _Ranks(txn, store, prefix)
            total = r.count()
            lo = r.rank(start, total) if start > 0 else 0
            hi = total if stop is None or stop >= MAX_STEP else r.rank(stop + 1, total)
            size = max(0, hi - lo)
            i = n + size if n < 0 else n
            if not 0 <= i < size:
                raise IndexError(f"step #{n} of {size} recorded steps")
            return r.nth(lo + i)

    def steps(
        self, store: Store, run: str, mode: str, start: int = 0, stop: Optional[int] = None, stage: str = DEFAULT_STAGE
    ) -> List[int]:
        """The distinct recorded steps from `start` to `stop` (inclusive), ascending."""
        with store.read() as txn:
            prefix = _prefix(txn, store, run, mode, stage)
            return [] if prefix is None else list(_Ranks(txn, store, prefix).walk(start, stop))

    def nearest_below(self, store: Store, run: str, mode: str, step: int, stage: str = DEFAULT_STAGE) -> Optional[int]:
        """The largest recorded step smaller than `step`, or None."""
        if step <= 0:
            return None
        with store.read() as txn:
            prefix = _prefix(txn, store, run, mode, stage)
            if prefix is None:
                return None
            cur = txn.cursor(db=store.db("gen"))
            key = prefix + min(step, MAX_STEP + 1).to_bytes(_STEP, "big")
            found = cur.prev() if cur.set_range(key) else cur.last()
            if not found or not bytes(cur.key()).startswith(prefix):
                return None
            return _step_of(cur.key(), len(prefix))

    def nearest_above(self, store: Store, run: str, mode: str, step: int, stage: str = DEFAULT_STAGE) -> Optional[int]:
        """The smallest recorded step larger than `step`, or None."""
        if step >= MAX_STEP:
            return None
        with store.read() as txn:
            prefix = _prefix(txn, store, run, mode, stage)
            if prefix is None:
                return None
            cur = txn.cursor(db=store.db("gen"))
            if not cur.set_range(prefix + max(step + 1, 0).to_bytes(_STEP, "big")):
                return None
            key = bytes(cur.key())
            return _step_of(key, len(prefix)) if key.startswith(prefix) else None

    def indices(self, store: Store, run: str, mode: str, step: int, stage: str = DEFAULT_STAGE, start: int = 0,
                stop: Optional[int] = None) -> List[int]:
        """The generation indices recorded (with output) at `step`, ascending; those in ``start <= i < stop``
        (a range of the index is a cursor walk over that range only: a tool call reads its sample's calls)."""
        if not 0 <= step <= MAX_STEP or start > MAX_GEN_INDEX or (stop is not None and stop <= start):
            return []
        out: List[int] = []
        with store.read() as txn:
            prefix = _prefix(txn, store, run, mode, stage)
            if prefix is None:
                return out
            skey = prefix + step.to_bytes(_STEP, "big")
            cur = txn.cursor(db=store.db("gen"))
            if cur.set_range(skey + max(start, 0).to_bytes(4, "big")):
                for key in cur.iternext(values=False):
                    if not key.startswith(skey):
                        break
                    index = int.from_bytes(key[len(skey) :], "big")
                    if stop is not None and index >= stop:
                        break
                    out.append(index)
        return out

    def rank_items(self, store: Store) -> List[Tuple[bytes, int]]:
        """The ``steps`` index as (key, step) pairs, in key order (to compare with a rebuilt one)."""
        steps = store.db("steps")
        if steps is None:
            return []
        with store.read() as txn:
            return [(bytes(k), int.from_bytes(v, "big")) for k, v in txn.cursor(db=steps)]
