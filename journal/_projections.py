"""The projections: state derived from the event log, kept up to date by each append, rebuilt by `reindex`.

- ``gen`` (the step index): `_keys.gen_key` -> seq of the latest `GenerationRecorded` with a stored
  output for that call. Read by `lookup`, and the seed of the in-memory step lists.
- ``sessions`` (the sessions index): session id -> seq of its `SessionOpened`, so a session's
  fingerprint is one read, not a scan of the log. Journals written before it existed have no such
  database: opened read-only they fall back to a scan; opened for writing they build it once
  (``meta`` key ``sessions_index`` says it was built).
- the in-memory step projection of one (run, mode): recorded steps ascending with their generation
  indices, seeded from ``gen`` and brought up to date with the events appended since.
"""

from __future__ import annotations

import bisect
import gc
from typing import Any, Dict, List, Optional, Tuple

import attrs

from ._convert import decode_event
from ._errors import EventDecodeError, IntegrityError
from ._eventlog import EventLog
from ._events import Event, GenerationRecorded, SessionOpened
from ._keys import MAX_KEY_BYTES, META_SESSIONS_INDEX, gen_key, gen_prefix, seq_key, seq_of, session_key
from ._store import Store

__all__ = ["RecordedGeneration", "StepProjection", "Projections", "SESSIONS_FLAG"]

# ``meta`` key: present once the sessions index holds every SessionOpened of the log.
SESSIONS_FLAG = META_SESSIONS_INDEX


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


class StepProjection:
    """Recorded steps of one (run, mode), in order, with their generation indices (in memory)."""

    def __init__(self) -> None:
        self.seq = 0  # the newest event applied
        self.steps: List[int] = []
        self.indices: Dict[int, List[int]] = {}

    def add(self, step: int, gen_index: int) -> None:
        found = self.indices.get(step)
        if found is None:
            bisect.insort(self.steps, step)
            self.indices[step] = [gen_index]
        elif gen_index not in found:
            bisect.insort(found, gen_index)


class Projections:
    """The step index, the sessions index and the in-memory step projections of one journal.

    Not thread-safe by itself: the journal calls it under its lock.
    """

    def __init__(self, log: EventLog) -> None:
        self._log = log
        self._steps: Dict[Tuple[str, str], StepProjection] = {}

    # -- inside write transactions ---------------------------------------------------------------
    @staticmethod
    def apply_in(txn: Any, store: Store, seq: int, event: Event) -> None:
        """Project one appended event, in the transaction that appends it."""
        if isinstance(event, GenerationRecorded):
            if event.output is not None:
                txn.put(gen_key(event.run, event.mode, event.step, event.gen_index), seq_key(seq), db=store.db("gen"))
        elif isinstance(event, SessionOpened):
            sessions = store.db("sessions")
            key = session_key(event.session)
            # An id LMDB cannot take as a key is left out; its lookups fall back to a scan.
            if sessions is not None and 0 < len(key) <= MAX_KEY_BYTES:
                txn.put(key, seq_key(seq), db=sessions)

    @classmethod
    def rebuild_in(cls, txn: Any, store: Store) -> int:
        """Drop every index and replay the log into it, all inside `txn`; return the events replayed.

        Reading the log in the same write transaction means no event committed by another process
        can slip between the read and the rebuild (LMDB has one writer at a time).

        Raises:
            EventDecodeError: an event cannot be decoded; the caller's transaction is aborted.
        """
        txn.drop(store.db("gen"), delete=False)
        if store.db("sessions") is not None:
            txn.drop(store.db("sessions"), delete=False)
        count = 0
        for seq, event in EventLog.decoded_in(txn, store):
            cls.apply_in(txn, store, seq, event)
            count += 1
        if store.db("sessions") is not None:
            txn.put(SESSIONS_FLAG, b"1", db=store.db("meta"))
        return count

    @staticmethod
    def ensure_sessions_in(txn: Any, store: Store, *, new: bool) -> None:
        """Build the sessions index of a journal written before it existed (once, when writable)."""
        meta, sessions = store.db("meta"), store.db("sessions")
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

    def lookup(self, store: Store, run: str, mode: str, step: int, gen_index: int) -> Optional[RecordedGeneration]:
        """The latest recorded generation with a stored output at the call, or None (see `Journal.lookup`)."""
        with store.read() as txn:
            raw_seq = txn.get(gen_key(run, mode, step, gen_index), db=store.db("gen"))
            if raw_seq is None:
                return None
            seq = seq_of(raw_seq)
            raw = txn.get(seq_key(seq), db=store.db("events"))
        if raw is None:
            raise IntegrityError(f"index entry for step {step} points at missing event #{seq}", step=step)
        try:
            event = decode_event(raw, seq=seq)
        except EventDecodeError as exc:
            raise type(exc)(f"{exc} (the record of step {step} index {gen_index})", step=step) from None
        if not isinstance(event, GenerationRecorded) or (event.run, event.mode, event.step, event.gen_index) != (
            run,
            mode,
            step,
            gen_index,
        ):
            raise IntegrityError(
                f"index entry for step {step} index {gen_index} points at event #{seq}, which is another call; "
                "run `stepjournal reindex`",
                step=step,
            )
        return RecordedGeneration(seq, event)

    def clear(self) -> None:
        """Forget the in-memory projections (after a rebuild, or in a fork child)."""
        self._steps.clear()

    def steps(self, store: Store, run: str, mode: str) -> StepProjection:
        """The in-memory step projection of (run, mode), brought up to date with the log."""
        proj = self._steps.get((run, mode))
        if proj is None:
            proj = self._seed(store, run, mode)
            self._steps[(run, mode)] = proj
        elif self._log.last_seq() > proj.seq:
            # Other writers (threads, processes) appended since: apply their events.
            for seq, event in self._log.events(since=proj.seq):
                if isinstance(event, GenerationRecorded) and event.output is not None:
                    if (event.run, event.mode) == (run, mode):
                        proj.add(event.step, event.gen_index)
                proj.seq = seq
        return proj

    @staticmethod
    def _seed(store: Store, run: str, mode: str) -> StepProjection:
        proj = StepProjection()
        prefix = gen_prefix(run, mode)
        # Seed from the index and note how far the log went, in one snapshot.
        with store.read() as txn:
            cur = txn.cursor(db=store.db("events"))
            proj.seq = seq_of(cur.key()) if cur.last() else 0
            cur = txn.cursor(db=store.db("gen"))
            if cur.set_range(prefix):
                # Index keys come in key order: steps ascending, then indices ascending within a
                # step. So append instead of insorting (`add`): a journal of 100 000 steps is read in
                # a third of the time, which is a fresh handle's first decision.
                steps, indices = proj.steps, proj.indices
                start, last = len(prefix), None
                # One list per step is a container the cyclic GC tracks: on a trainer-sized heap the
                # collections 100 000 of them trigger took 3x the loop itself. They cannot form
                # cycles, so the collector waits until the loop is done.
                collecting = gc.isenabled()
                gc.disable()
                try:
                    for k in cur.iternext(values=False):
                        if not k.startswith(prefix):
                            break
                        # The `_keys.gen_key` layout read in place (parse_gen_key would split each key).
                        step = int.from_bytes(k[start : start + 8], "big")
                        gen_index = int.from_bytes(k[start + 8 : start + 12], "big")
                        if step == last:
                            indices[step].append(gen_index)
                        else:
                            steps.append(step)
                            indices[step] = [gen_index]
                            last = step
                finally:
                    if collecting:
                        gc.enable()
        return proj
