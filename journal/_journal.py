"""`Journal`: the append-only event log of generate calls, with payloads stored beside it.

On disk (one LMDB environment in the journal folder):

- ``events``: sequence number (u64 big-endian, gapless from 1) -> event bytes (see `_convert`).
- ``payloads``: BLAKE3 digest (32 bytes) -> encoded payload, zstd-compressed or not.
- ``gen``: projection ``run \\0 mode \\0 step(u64) gen_index(u32)`` -> sequence number of the latest
  `GenerationRecorded` event with a stored output for that key. Rebuilt from events by `reindex`.
- ``meta``: format version.

An event and the payloads it references are written in one transaction: a crash leaves both or neither.
"""

from __future__ import annotations

import bisect
import gc
import os
import socket
import threading
import time
import uuid
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import attrs
import msgpack
import zstandard

from ._codec import CodecRegistry, PAYLOAD_MAGIC, decode_payload_releasing, encode_payload_array
from ._convert import decode_event, encode_event
from ._digest import DIGEST_SIZE, DigestInBackground, digest_bytes
from ._errors import (
    EventDecodeError,
    IntegrityError,
    InvalidKeyError,
    JournalClosedError,
    JournalError,
    PayloadDecodeError,
    StepJournalError,
)
from ._events import (
    CallBypassed,
    CallRefused,
    Event,
    GenerationRecorded,
    PayloadRef,
    ReplayServed,
    SessionOpened,
)
from ._events import check_fingerprint
from ._keys import check_key as _check_key
from ._keys import check_step as _check_step
from ._keys import gen_key as _gen_key
from ._keys import gen_prefix as _gen_prefix
from ._keys import seq_key as _u64
from ._log import get_logger
from ._pages import ReleaseBehind, releaser
from ._paths import security_warnings
from ._store import Store
from ._version import __version__

__all__ = ["Journal", "RecordedGeneration", "PreparedPayload", "VerifyProblem", "DEFAULT_RUN"]

log = get_logger(__name__)

DEFAULT_RUN = "default"
FORMAT_VERSION = 1
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_COMPRESSIONS = (None, "zstd")
# Events per read transaction of `raw_events` (events are small: about half a KB each).
_EVENT_BATCH = 2048
# Payloads from this size up are hashed on a worker thread while they are decoded (Journal.load).
_HASH_BESIDE_DECODE_FROM = 1 << 22
# Decompressed size allowed when no event says how large a payload is (verify of orphans).
_MAX_UNWRAPPED = 1 << 36


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


@attrs.frozen
class PreparedPayload:
    """A value already encoded (and hashed, and compressed) for storage: `Journal.prepare`'s result.

    Pass it to `Journal.record` as `output` or `input` to skip encoding twice; `ref.digest` identifies
    the value's content.
    """

    ref: PayloadRef
    key: bytes = attrs.field(repr=False)
    blob: Any = attrs.field(repr=False)


@attrs.frozen
class VerifyProblem:
    """One thing `Journal.verify` found broken.

    Attributes:
        kind: ``event``, ``payload``, ``index`` or ``missing_payload``.
        where: the event sequence number, payload digest or index key concerned.
        steps: the train steps affected, when known.
        detail: what is wrong.
    """

    kind: str
    where: str
    steps: Tuple[int, ...]
    detail: str


class _StepProjection:
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


# The journals of this process. A thread may hold a journal's lock when another thread calls fork();
# in the child that thread does not exist, so the child gives each journal a new lock.
_JOURNALS: "weakref.WeakSet[Journal]" = weakref.WeakSet()


def _new_locks_in_fork_child() -> None:
    for journal in list(_JOURNALS):
        journal._lock = threading.RLock()


os.register_at_fork(after_in_child=_new_locks_in_fork_child)


class Journal:
    """An append-only journal of generate calls in an LMDB folder.

    `Journal(path)` opens (or creates) the journal for writing under the run key ``"default"`` with an
    empty fingerprint, and records a `SessionOpened` event. Use it as a context manager or call
    `close()`.

    Args:
        path: the journal folder; created owner-only when missing.
        run: the run key: which training run the calls belong to (e.g. ``"exp/proj"``).
        fingerprint: what must match for a recorded generation to be valid for this run (model, batch
            size, lengths ...): a flat dict of JSON scalars.
        readonly: open without writing anything (no session is recorded).
        compression: ``"zstd"`` to compress payloads, or ``None``.
        map_size: initial LMDB map size in bytes; it grows by itself.
        max_size: cap on the journal's size in bytes; reaching it raises `JournalFullError`.
        sync: flush each commit to disk (default True).
        registry: codecs for custom payload types; defaults to the process-wide registry.
        session: False opens for writing without recording a `SessionOpened` (for maintenance such as
            `reindex`, which records no calls); recording calls then raises `JournalError`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        run: str = DEFAULT_RUN,
        fingerprint: Optional[Mapping[str, Any]] = None,
        readonly: bool = False,
        compression: Optional[str] = None,
        map_size: int = 1 << 30,
        max_size: Optional[int] = None,
        sync: bool = True,
        registry: Optional[CodecRegistry] = None,
        session: bool = True,
    ) -> None:
        _check_key(run, "train")
        if compression not in _COMPRESSIONS:
            raise ValueError(f"compression {compression!r} is not supported: use None or 'zstd'")
        self.path = os.fspath(path)
        self.run = run
        self.fingerprint: Dict[str, Any] = _check_fingerprint(fingerprint or {})
        self.readonly = readonly
        self.compression = compression
        self._registry = registry
        self._lock = threading.RLock()
        _JOURNALS.add(self)
        self._store = Store(self.path, readonly=readonly, map_size=map_size, max_size=max_size, sync=sync)
        self._data_file = os.path.realpath(os.path.join(self.path, "data.mdb"))
        self._projections: Dict[Tuple[str, str], _StepProjection] = {}
        self._session_fingerprints: Dict[str, Dict[str, Any]] = {}
        self.session: Optional[str] = None
        self._with_session = session and not readonly
        if not readonly:
            self._init_meta()
        if self._with_session:
            self._open_session()
        log.debug("journal_opened", path=self.path, run=run, readonly=readonly, session=self.session)

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "Journal":
        return self

    def __reduce__(self):
        # Spawn pools, spawn dataloader workers and Ray pickle what they send to another process.
        raise JournalError(
            f"a Journal cannot be sent to another process (pickled); pass the journal's path "
            f"({self.path!r}) and open a Journal there. After fork() an inherited Journal reopens by itself"
        )

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the journal; further use raises `JournalClosedError`. Closing twice is fine."""
        with self._lock:
            self._store.close()

    @property
    def closed(self) -> bool:
        return self._store.closed

    def _live(self) -> Store:
        if self._store.closed:
            raise JournalClosedError(f"journal {self.path!r} is closed; open a new Journal on it")
        if self._store.forked():
            # A fork child (dataloader worker, Ray) must not use the parent's LMDB environment.
            log.info("journal_reopened_after_fork", path=self.path, pid=os.getpid())
            self._store.reopen_after_fork()
            self._projections.clear()
            if self._with_session:
                self._open_session()
        return self._store

    def _init_meta(self) -> None:
        def fn(txn):
            meta = self._store.db("meta")
            if txn.get(b"format", db=meta) is None:
                txn.put(b"format", str(FORMAT_VERSION).encode(), db=meta)
                txn.put(b"created", repr(time.time()).encode(), db=meta)

        self._store.write(fn)

    def _open_session(self) -> None:
        event = SessionOpened(
            session=uuid.uuid4().hex,
            run=self.run,
            fingerprint=dict(self.fingerprint),
            library_version=__version__,
            host=socket.gethostname(),
            pid=os.getpid(),
            ts=time.time(),
        )
        self._append([event], [])
        self.session = event.session

    # -- writing -------------------------------------------------------------------------------
    def _append(self, events: List[Event], payloads: List[Tuple[bytes, Any]]) -> List[int]:
        """Append events (and the payload blobs they reference) in one transaction; return their seqs."""
        store = self._live()
        events_db, payloads_db, gen_db = store.db("events"), store.db("payloads"), store.db("gen")
        encoded = [encode_event(e) for e in events]
        needed = sum(len(blob) for _, blob in payloads) + sum(len(b) for b in encoded)

        def fn(txn):
            for key, blob in payloads:
                # Content-addressed: identical payloads are stored once. A stored copy that no longer
                # matches its digest (damaged on disk) is replaced: the new bytes are what the key names.
                existing = txn.get(key, db=payloads_db)
                if existing is None or not _blob_intact(existing, key):
                    txn.put(key, blob, db=payloads_db)
            cur = txn.cursor(db=events_db)
            seq = int.from_bytes(cur.key(), "big") if cur.last() else 0
            seqs = []
            for event, body in zip(events, encoded):
                seq += 1
                if not txn.put(_u64(seq), body, db=events_db, append=True, overwrite=False):
                    raise JournalError(f"event #{seq} already exists; the journal is damaged")
                _project_into_index(txn, gen_db, seq, event)
                seqs.append(seq)
            return seqs

        with self._lock:
            # buffers: checking a stored duplicate hashes it in place instead of copying it out first.
            return store.write(fn, needed=needed, buffers=True)

    def prepare(self, value: Any) -> PreparedPayload:
        """Encode, hash (and compress) a value for storage, without writing anything.

        Raises:
            UnsupportedValueError: the value (or a part of it, named by its path) cannot be stored.
        """
        if isinstance(value, PreparedPayload):
            return value
        # A numpy buffer, not a bytearray: no zero-fill of fresh 4 KiB pages before the copy (see there).
        raw = encode_payload_array(value, registry=self._registry)
        digest = digest_bytes(raw)
        blob: Any = raw
        if self.compression == "zstd":
            blob = zstandard.ZstdCompressor(level=3, threads=-1).compress(raw)
        ref = PayloadRef(digest=digest.hex(), nbytes=len(raw), stored_nbytes=len(blob), compression=self.compression)
        return PreparedPayload(ref, digest, blob)

    def record(
        self,
        step: int,
        output: Any,
        *,
        gen_index: int = 0,
        mode: str = "train",
        input: Any = None,
        store_input: bool = True,
        input_digest: Optional[str] = None,
        store_output: bool = True,
        duration_s: float = 0.0,
        policy: str = "manual",
        reason: str = "recorded",
        imported_from: Optional[str] = None,
    ) -> RecordedGeneration:
        """Record one generate call that ran: its output (and input) payloads and the event, atomically.

        Args:
            step: the train step.
            output: what the call returned (any encodable value, or a `PreparedPayload`).
            gen_index: which call within the step (0 for the first).
            mode: ``"train"``, ``"validate"`` ...
            input: what the call was given (a value or a `PreparedPayload`); stored when `store_input`.
            input_digest: digest identifying the input; computed from `input` when not given.
            store_output: False journals the call without storing its output (passthrough).
            duration_s: how long the call took.
            policy, reason: which policy decided to generate and why (for the audit).
            imported_from: where an imported record came from (e.g. ``"verl:/dumps/genstep_000003"``).

        Returns:
            The recorded generation (its sequence number and event).
        """
        fields = self._call_fields(step, gen_index, mode)  # validate before the costly encoding
        payloads: List[Tuple[bytes, Any]] = []
        out_ref = in_ref = None
        if store_output:
            out = self.prepare(output)
            out_ref = out.ref
            payloads.append((out.key, out.blob))
        if input is not None and (store_input or input_digest is None):
            inp = self.prepare(input)
            input_digest = input_digest or inp.ref.digest
            if store_input:
                in_ref = inp.ref
                payloads.append((inp.key, inp.blob))
        event = GenerationRecorded(
            **fields,
            input_digest=input_digest,
            output=out_ref,
            input=in_ref,
            duration_s=float(duration_s),
            policy=policy,
            reason=reason,
            ts=time.time(),
            imported_from=imported_from,
        )
        (seq,) = self._append([event], payloads)
        log.debug("generation_recorded", step=step, gen_index=gen_index, mode=mode, seq=seq, stored=store_output)
        return RecordedGeneration(seq, event)

    def record_replay(
        self,
        step: int,
        source: RecordedGeneration,
        *,
        gen_index: int = 0,
        mode: str = "train",
        input_digest: Optional[str] = None,
        policy: str = "manual",
        reason: str = "replayed",
        duration_s: float = 0.0,
    ) -> int:
        """Journal that a call at (step, gen_index) was served from `source`; return the event's seq."""
        if source.event.output is None:
            raise JournalError(f"recorded generation #{source.seq} has no stored output to replay")
        event = ReplayServed(
            **self._call_fields(step, gen_index, mode),
            input_digest=input_digest,
            source_seq=source.seq,
            source_run=source.event.run,
            source_step=source.event.step,
            source_gen_index=source.event.gen_index,
            output=source.event.output,
            policy=policy,
            reason=reason,
            ts=time.time(),
            duration_s=float(duration_s),
        )
        (seq,) = self._append([event], [])
        log.debug("replay_served", step=step, gen_index=gen_index, source_step=source.step, seq=seq)
        return seq

    def record_bypass(
        self,
        step: int,
        *,
        gen_index: int = 0,
        mode: str = "validate",
        policy: str = "manual",
        reason: str = "bypassed",
        duration_s: float = 0.0,
    ) -> int:
        """Journal that a call ran without recording or replay (e.g. validation); return the event's seq."""
        event = CallBypassed(
            **self._call_fields(step, gen_index, mode),
            policy=policy,
            reason=reason,
            ts=time.time(),
            duration_s=float(duration_s),
        )
        return self._append([event], [])[0]

    def record_refusal(
        self, step: int, *, gen_index: int = 0, mode: str = "train", policy: str = "manual", reason: str
    ) -> int:
        """Journal that a call was refused with an error (so the audit shows why); return the event's seq."""
        event = CallRefused(
            **self._call_fields(step, gen_index, mode),
            policy=policy,
            reason=reason,
            ts=time.time(),
        )
        return self._append([event], [])[0]

    def _call_fields(self, step: int, gen_index: int, mode: str) -> Dict[str, Any]:
        """The validated fields every call event starts with."""
        _check_key(self.run, mode)
        _check_step(step, gen_index)
        return {"session": self._session_id(), "run": self.run, "step": step, "gen_index": gen_index, "mode": mode}

    def _session_id(self) -> str:
        self._live()
        if self.session is None:
            raise JournalError(
                f"journal {self.path!r} is open read-only or without a session; open it with "
                "readonly=False and session=True to record"
            )
        return self.session

    # -- reading events --------------------------------------------------------------------------
    def last_seq(self) -> int:
        """The sequence number of the newest event (0 for an empty journal)."""
        store = self._live()
        with store.read() as txn:
            cur = txn.cursor(db=store.db("events"))
            return int.from_bytes(cur.key(), "big") if cur.last() else 0

    def raw_events(self, *, since: int = 0) -> Iterator[Tuple[int, bytes]]:
        """Yield (seq, stored bytes) of every event after `since`, without decoding.

        Events are read in batches, each in its own short transaction: no transaction stays open
        while the caller holds the generator (it would block the other threads, and a fork() then).
        Events never change once written, so the batches join into the log as it was, plus whatever
        was appended meanwhile.
        """
        store = self._live()
        while True:
            batch: List[Tuple[int, bytes]] = []
            with store.read() as txn:
                cur = txn.cursor(db=store.db("events"))
                if cur.set_range(_u64(since + 1)):
                    for key, value in cur:
                        batch.append((int.from_bytes(key, "big"), value))
                        if len(batch) == _EVENT_BATCH:
                            break
            yield from batch
            if len(batch) < _EVENT_BATCH:
                return
            since = batch[-1][0]

    def events(
        self,
        *,
        since: int = 0,
        run: Optional[str] = None,
        types: Optional[Iterable[type]] = None,
        steps: Optional[Any] = None,
    ) -> Iterator[Tuple[int, Event]]:
        """Yield (seq, event) in log order, filtered.

        Args:
            since: only events with a larger sequence number.
            run: only events of this run key (None: every run).
            types: only events of these classes.
            steps: only call events whose step is in this container (a set, range or `StepRanges`).

        Raises:
            EventDecodeError: an event cannot be decoded (the journal is damaged).
        """
        wanted = tuple(types) if types is not None else None
        for seq, raw in self.raw_events(since=since):
            event = decode_event(raw, seq=seq)
            if wanted is not None and not isinstance(event, wanted):
                continue
            if run is not None and event.run != run:
                continue
            if steps is not None and (isinstance(event, SessionOpened) or event.step not in steps):
                continue
            yield seq, event

    def event(self, seq: int) -> Event:
        """Return the event with sequence number `seq`."""
        store = self._live()
        with store.read() as txn:
            raw = txn.get(_u64(seq), db=store.db("events"))
        if raw is None:
            raise JournalError(f"journal {self.path!r} has no event #{seq}")
        return decode_event(raw, seq=seq)

    def sessions(self, *, run: Optional[str] = None) -> List[Tuple[int, SessionOpened]]:
        """Every `SessionOpened` event (optionally of one run), in order."""
        return list(self.events(run=run, types=[SessionOpened]))

    def session_fingerprint(self, session: str) -> Dict[str, Any]:
        """The fingerprint recorded when `session` opened."""
        found = self._session_fingerprints.get(session)
        damaged: List[int] = []
        if found is None:
            # One damaged event elsewhere in the log must not make every replay fail: skip it here
            # (verify reports it), unless it is the session asked for.
            for seq, raw in self.raw_events():
                try:
                    ev = decode_event(raw, seq=seq)
                except EventDecodeError:
                    damaged.append(seq)
                    continue
                if isinstance(ev, SessionOpened):
                    self._session_fingerprints[ev.session] = ev.fingerprint
            found = self._session_fingerprints.get(session)
        if found is None:
            hint = f"; events {damaged[:10]} are damaged (run `stepjournal verify`)" if damaged else ""
            raise IntegrityError(f"session {session!r} has no SessionOpened event in {self.path!r}{hint}")
        return found

    # -- recorded generations (projection) ---------------------------------------------------------
    def lookup(
        self, step: int, gen_index: int = 0, *, mode: str = "train", run: Optional[str] = None
    ) -> Optional[RecordedGeneration]:
        """The latest recorded generation with a stored output at (run, mode, step, gen_index), or None."""
        run = run or self.run
        _check_key(run, mode)
        _check_step(step, gen_index)
        store = self._live()
        with store.read() as txn:
            raw_seq = txn.get(_gen_key(run, mode, step, gen_index), db=store.db("gen"))
            if raw_seq is None:
                return None
            seq = int.from_bytes(raw_seq, "big")
            raw = txn.get(_u64(seq), db=store.db("events"))
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

    def _projection(self, run: str, mode: str) -> _StepProjection:
        """The in-memory recorded-step projection of (run, mode), brought up to date with the log."""
        with self._lock:
            store = self._live()
            proj = self._projections.get((run, mode))
            if proj is None:
                proj = _StepProjection()
                prefix = _gen_prefix(run, mode)
                # Seed from the index and note how far the log went, in one snapshot.
                with store.read() as txn:
                    cur = txn.cursor(db=store.db("events"))
                    proj.seq = int.from_bytes(cur.key(), "big") if cur.last() else 0
                    cur = txn.cursor(db=store.db("gen"))
                    if cur.set_range(prefix):
                        # Index keys come in key order: steps ascending, then indices ascending within
                        # a step. So append instead of insorting (`add`): a journal of 100 000 steps
                        # is read in a third of the time, which is a fresh handle's first decision.
                        steps, indices = proj.steps, proj.indices
                        start, last = len(prefix), None
                        # One list per step is a container the cyclic GC tracks: on a trainer-sized
                        # heap the collections 100 000 of them trigger took 3x the loop itself. They
                        # cannot form cycles, so the collector waits until the loop is done.
                        collecting = gc.isenabled()
                        gc.disable()
                        try:
                            for k in cur.iternext(values=False):
                                if not k.startswith(prefix):
                                    break
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
                self._projections[(run, mode)] = proj
            elif self.last_seq() > proj.seq:
                # Other writers (threads, processes) appended since: apply their events.
                for seq, event in self.events(since=proj.seq):
                    if isinstance(event, GenerationRecorded) and event.output is not None:
                        if (event.run, event.mode) == (run, mode):
                            proj.add(event.step, event.gen_index)
                    proj.seq = seq
            return proj

    def recorded_steps(self, *, mode: str = "train", run: Optional[str] = None) -> List[int]:
        """Every step with at least one recorded output, ascending."""
        return list(self._projection(run or self.run, mode).steps)

    def recorded_indices(self, step: int, *, mode: str = "train", run: Optional[str] = None) -> List[int]:
        """The generation indices recorded (with output) at `step`, ascending."""
        return list(self._projection(run or self.run, mode).indices.get(step, ()))

    def step_count(self, *, mode: str = "train", run: Optional[str] = None) -> int:
        """How many distinct steps have a recorded output."""
        return len(self._projection(run or self.run, mode).steps)

    def nth_step(self, n: int, *, mode: str = "train", run: Optional[str] = None) -> int:
        """The n-th recorded step in ascending order (negative n counts from the end)."""
        return self._projection(run or self.run, mode).steps[n]

    def nearest_below(self, step: int, *, mode: str = "train", run: Optional[str] = None) -> Optional[int]:
        """The largest recorded step smaller than `step`, or None."""
        steps = self._projection(run or self.run, mode).steps
        i = bisect.bisect_left(steps, step)
        return steps[i - 1] if i > 0 else None

    def nearest_above(self, step: int, *, mode: str = "train", run: Optional[str] = None) -> Optional[int]:
        """The smallest recorded step larger than `step`, or None."""
        steps = self._projection(run or self.run, mode).steps
        i = bisect.bisect_right(steps, step)
        return steps[i] if i < len(steps) else None

    # -- payloads --------------------------------------------------------------------------------
    def load(self, ref: PayloadRef, *, step: Optional[int] = None) -> Any:
        """Load and decode a stored payload, verifying its digest first.

        Raises:
            IntegrityError: the payload is missing or its bytes do not match the digest (names the step).
            PayloadDecodeError: the bytes are not a valid payload.
        """
        where = f" (step {step})" if step is not None else ""
        store = self._live()
        key = _digest_key(ref.digest, step)
        with store.read(buffers=True) as txn:
            blob = txn.get(key, db=store.db("payloads"))
            if blob is None:
                raise IntegrityError(f"payload {ref.digest[:16]}…{where} is missing from the journal", step=step)
            raw = _unwrap(blob, ref.digest, step, ref.nbytes)
            mismatch = IntegrityError(
                f"payload {ref.digest[:16]}…{where} does not match its digest: the journal is damaged",
                step=step,
                detail="digest mismatch",
            )
            # An uncompressed payload is read straight from LMDB's memory map. Its pages are unmapped
            # from this process as soon as the digest and the decoder are both done with them, so a
            # replay holds the decoded tensors and not also a mapped copy of the payload (peak RSS).
            release = releaser(raw, self._data_file) if raw is blob else None
            try:
                if len(raw) < _HASH_BESIDE_DECODE_FROM:
                    if digest_bytes(raw, after_chunk=release) != key:
                        raise mismatch
                    # Decoding copies every tensor out of the memory map before the transaction ends.
                    return decode_payload_releasing(raw, registry=self._registry, release=release)
                # A large payload is hashed on a worker thread while this one decodes (copies) it: the
                # two took about as long as each other, one after the other. Nothing decoded is returned
                # unless the digest matches, and a damaged payload reports the mismatch first.
                behind = ReleaseBehind(release, 2) if release is not None else None
                hashing = DigestInBackground(raw, after_chunk=behind.reader(0) if behind else None)
                try:
                    value = decode_payload_releasing(
                        raw, registry=self._registry, release=behind.reader(1) if behind else None
                    )
                except BaseException:
                    if hashing.result() != key:
                        raise mismatch from None
                    raise
                if hashing.result() != key:
                    raise mismatch
                return value
            except PayloadDecodeError as exc:
                raise type(exc)(f"{exc}{where}", step=step) from None

    def load_output(self, recorded: RecordedGeneration) -> Any:
        """Load the stored output of a recorded generation."""
        if recorded.event.output is None:
            raise JournalError(f"event #{recorded.seq} (step {recorded.step}) stored no output")
        return self.load(recorded.event.output, step=recorded.step)

    def load_input(self, recorded: RecordedGeneration) -> Any:
        """Load the stored input of a recorded generation."""
        if recorded.event.input is None:
            raise JournalError(
                f"event #{recorded.seq} (step {recorded.step}) stored no input; record with store_input=True"
            )
        return self.load(recorded.event.input, step=recorded.step)

    def payload_bytes(self, digest: str) -> bytes:
        """The encoded (uncompressed) bytes of a payload, unverified (for inspection tools)."""
        store = self._live()
        with store.read(buffers=True) as txn:
            blob = txn.get(_digest_key(digest, None), db=store.db("payloads"))
            if blob is None:
                raise IntegrityError(f"payload {digest[:16]}… is missing from the journal")
            return bytes(_unwrap(blob, digest, None, None))

    # -- audit -----------------------------------------------------------------------------------
    def audit(self, **filters: Any) -> List[Any]:
        """One typed record per generate call, in log order (see `stepjournal._audit.audit`)."""
        from ._audit import audit

        return audit(self, **filters)

    # -- projections and verification ------------------------------------------------------------
    def index_items(self) -> List[Tuple[bytes, int]]:
        """The `gen` index as (key, seq) pairs, in key order (to compare with a rebuilt one)."""
        store = self._live()
        with store.read() as txn:
            return [(bytes(k), int.from_bytes(v, "big")) for k, v in txn.cursor(db=store.db("gen"))]

    def reindex(self) -> int:
        """Rebuild every projection from the event log; return the number of events replayed.

        Raises:
            EventDecodeError: an event cannot be decoded; nothing was changed.
        """
        decoded = list(self.events())
        store = self._live()
        gen_db = store.db("gen")

        def fn(txn):
            txn.drop(gen_db, delete=False)
            for seq, event in decoded:
                _project_into_index(txn, gen_db, seq, event)

        with self._lock:
            store.write(fn)
            self._projections.clear()
        log.info("journal_reindexed", path=self.path, events=len(decoded))
        return len(decoded)

    def security_warnings(self) -> List[str]:
        """What lets another user change or swap this journal (permissions, owners); empty when nothing.

        A journal is trusted because only its owner writes it: a folder writable by others is
        reported here (and logged when the journal opens), not refused.
        """
        return security_warnings(self.path)

    def verify(self, *, progress: Any = None) -> List[VerifyProblem]:
        """Check everything: each event decodes, each payload matches its digest, the index matches the log.

        Args:
            progress: an optional callable ``progress(done, total)`` called as work advances.

        Returns:
            The problems found; empty when the journal is whole.
        """
        problems: List[VerifyProblem] = []
        store = self._live()
        expected: Dict[bytes, int] = {}
        steps_of_digest: Dict[str, List[int]] = {}
        size_of_digest: Dict[str, int] = {}
        raw = list(self.raw_events())
        total = len(raw)
        for done, (seq, body) in enumerate(raw, 1):
            try:
                event = decode_event(body, seq=seq)
            except StepJournalError as exc:
                problems.append(VerifyProblem("event", f"#{seq}", _salvage_steps(body), str(exc)))
                continue
            if isinstance(event, GenerationRecorded):
                for ref in (event.output, event.input):
                    if ref is not None:
                        steps_of_digest.setdefault(ref.digest, []).append(event.step)
                        size_of_digest[ref.digest] = ref.nbytes
                if event.output is not None:
                    expected[_gen_key(event.run, event.mode, event.step, event.gen_index)] = seq
            if progress is not None:
                progress(done, total)
        found = dict(self.index_items())
        # A live writer may have appended (and indexed) events since the log was read: those are not
        # checked; an entry pointing past the end of the log still is.
        checked_up_to, now = (raw[-1][0] if raw else 0), self.last_seq()
        for key in sorted(set(expected) | set(found)):
            if checked_up_to < (found.get(key) or 0) <= now:
                continue
            if expected.get(key) != found.get(key):
                step = int.from_bytes(key[-12:-4], "big") if len(key) >= 12 else None
                problems.append(
                    VerifyProblem(
                        "index",
                        key.hex(),
                        (step,) if step is not None else (),
                        f"index has {found.get(key)}, event log says {expected.get(key)}; run `stepjournal reindex`",
                    )
                )
        with store.read(buffers=True) as txn:
            payloads_db = store.db("payloads")
            seen = set()
            for key, blob in txn.cursor(db=payloads_db):
                hexd = bytes(key).hex()
                seen.add(hexd)
                steps = tuple(sorted(set(steps_of_digest.get(hexd, ()))))
                try:
                    ok = digest_bytes(_unwrap(blob, hexd, None, size_of_digest.get(hexd))) == bytes(key)
                    detail = "bytes do not match the digest"
                except IntegrityError as exc:
                    ok, detail = False, str(exc)
                if not ok:
                    problems.append(VerifyProblem("payload", hexd, steps, detail))
            for hexd, steps in steps_of_digest.items():
                if hexd not in seen:
                    problems.append(
                        VerifyProblem("missing_payload", hexd, tuple(sorted(set(steps))), "payload is missing")
                    )
        return problems


def _check_fingerprint(fp: Mapping[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in fp.items():
        if not isinstance(key, str):
            raise InvalidKeyError(f"fingerprint key {key!r} is not a string")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise InvalidKeyError(
                f"fingerprint value {key}={value!r} is a {type(value).__name__}; use str, int, float, bool or None"
            )
        out[key] = value
    check_fingerprint(out)  # finite numbers, 64-bit ints: what every reader can compare and print
    return out


def _digest_key(digest: str, step: Optional[int]) -> bytes:
    try:
        key = bytes.fromhex(digest)
    except (ValueError, TypeError):
        key = b""
    if len(key) != DIGEST_SIZE:
        raise IntegrityError(f"payload digest {digest!r} is malformed", step=step)
    return key


def _unwrap(blob: Any, digest: str, step: Optional[int], nbytes: Optional[int]) -> Any:
    """The encoded payload bytes of a stored blob: decompressed when zstd, else the blob itself (no copy).

    `nbytes` is the size the event promised; a frame claiming more is refused before any allocation.
    """
    head = bytes(blob[:4])
    if head == _ZSTD_MAGIC:
        limit = nbytes if nbytes is not None else _MAX_UNWRAPPED
        try:
            claimed = zstandard.frame_content_size(blob)
            if claimed < 0 or claimed > limit:
                raise IntegrityError(
                    f"payload {digest[:16]}… claims {claimed} bytes, expected at most {limit}", step=step
                )
            return zstandard.ZstdDecompressor().decompress(blob, max_output_size=limit)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"payload {digest[:16]}… does not decompress: {exc}", step=step) from None
    if head != PAYLOAD_MAGIC[:4]:
        raise IntegrityError(f"payload {digest[:16]}… is neither a payload nor a zstd frame", step=step)
    return blob


def _blob_intact(blob: Any, key: bytes) -> bool:
    try:
        return digest_bytes(_unwrap(blob, key.hex(), None, None)) == key
    except IntegrityError:
        return False


def _salvage_steps(body: Any) -> Tuple[int, ...]:
    """The step an undecodable event names, read leniently from its msgpack map (for verify's report)."""
    try:
        fields = msgpack.unpackb(bytes(body), raw=False)
        step = fields.get("step") if isinstance(fields, dict) else None
    except Exception:  # damaged bytes may fail in any way; the step is then unknown
        return ()
    return (step,) if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else ()


def _project_into_index(txn, gen_db, seq: int, event: Event) -> None:
    if isinstance(event, GenerationRecorded) and event.output is not None:
        txn.put(_gen_key(event.run, event.mode, event.step, event.gen_index), _u64(seq), db=gen_db)
