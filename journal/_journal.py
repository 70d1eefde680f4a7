"""`Journal`: the append-only event log of generate calls, with payloads stored beside it.

`Journal` is a facade: it owns the lifecycle (open, close, fork, sessions), validates each call and
prepares its payloads, and hands everything else to a room with one job (see docs/architecture.md):

- `_appender.Appender`: the one write path: records committed in groups (concurrent callers share one
  durable commit), and the pulls, imports, prunes and reindex that write through it;
- `_eventlog.EventLog`: appending and reading the ``events`` database (the truth);
- `_projections.Projections`: the ``gen`` step index, the ``steps`` rank index and the ``sessions``
  index, kept by each append and rebuilt by `reindex` (nothing cached in memory);
- `_payloads` (encode -> digest -> compress on store) and a `PayloadStore` (by default the journal's
  own, `_file_store.local_payload_store`: small payloads in the event's transaction, large ones files);
- `_verify.verify` and `_audit.audit`: pure functions over what the rooms read.

One file, long: every public method of a journal handle is here, each a few lines (docs/architecture.md
names it). On disk: see `_keys` (key layout) and docs/architecture.md (databases).
"""

from __future__ import annotations

import itertools
import os
import socket
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import lmdb

from .index._audit import AUDIT_EVENT_TYPES, audit as _audit
from .events._convert import encode_event
from .base._errors import IntegrityError, JournalClosedError, JournalError
from .events._events import CALL_EVENT_TYPES, CallBypassed, CallRefused, GenerationRecorded, ReplayServed
from .events._keys import DEFAULT_STAGE
from .events._keys import check_step as _check_step
from .index._runs_index import RunSummary, RunsFold, summaries
from .storage._eventlog import EventLog
from .events._events import Event, PayloadRef, SessionOpened, check_fingerprint
from .index._import_map import FoldedImports
from .index._session_fingerprints import SessionFingerprints
from .events._keys import META_CREATED
from .storage._format import check_format_in, is_new_in, mark_format_in
from .events._keys import check_key as _check_key
from .base._log import get_logger
from .base._paths import security_warnings
from .payloads._object_store import open_payload_store
from .payloads._file_store import local_payload_store
from .payloads._payload_store import PayloadStore
from .payloads._payloads import COMPRESSIONS, PreparedPayload, decode_verified, digest_key, joined, prepare_payload
from .index._projections import Projections, RecordedGeneration, layout_of
from .index._rows_index import stored_layout, stored_rows
from .upkeep._release import Retainer, Rules
from .storage._appender import Appender, Pending, own_appender
from .storage._store import Store
from .upkeep._verify import VerifyProblem, verify as _verify
from .base._version import __version__
from ._writers import RunWriter

if TYPE_CHECKING:  # the codec imports torch; a verb that reads no payload never loads it
    from .payloads._codec import CodecRegistry

__all__ = ["Journal", "RecordedGeneration", "PreparedPayload", "VerifyProblem", "DEFAULT_RUN"]

log = get_logger(__name__)

DEFAULT_RUN = "default"


# The journals of this process. A thread may hold a journal's lock when another thread calls fork();
# in the child that thread does not exist, so the child gives each journal a new lock.
_JOURNALS: "weakref.WeakSet[Journal]" = weakref.WeakSet()


def _new_locks_in_fork_child() -> None:
    for journal in list(_JOURNALS):
        journal._appender.forget_in_fork_child()  # new locks, and none of the parent's queued records
        journal._writer.forget_in_fork_child()  # the parent's claim to its run stays the parent's
        if journal._with_session:  # here, while the child has one thread: its threads' calls name one session
            journal._open_session()


os.register_at_fork(after_in_child=_new_locks_in_fork_child)


class Journal:
    """An append-only journal of generate calls in an LMDB folder.

    `Journal(path)` opens (or creates) the journal for writing under the run key ``"default"`` with an
    empty fingerprint; its session's `SessionOpened` event is recorded with its first call. Use it as a
    context manager or call `close()`.

    Args:
        path: the journal folder; created owner-only when missing.
        run: the run key: which training run the calls belong to (e.g. ``"exp/proj"``).
        fingerprint: what must match for a recorded generation to be valid for this run (model, batch
            size, lengths ...): a flat dict of JSON scalars.
        readonly: open without writing anything (no session is recorded).
        compression: ``"zstd"`` to compress payloads, or ``None``.
        map_size: initial LMDB map size in bytes; it grows by itself.
        max_size: cap on the journal's size in bytes (LMDB's file and the payload files); reaching it raises
            `JournalFullError`.
        sync: flush each commit to disk (default True).
        registry: codecs for custom payload types; defaults to the process-wide registry.
        session: False opens for writing without a session (for maintenance such as `reindex`, which
            records no calls); recording calls then raises `JournalError`.
        payload_store: where payloads live: a `PayloadStore`, or a URL (``"s3://bucket/prefix"``, see
            docs/sharing.md) for an `ObjectPayloadStore` cached in the journal's LMDB; default: an
            `LmdbPayloadStore` in the journal's own LMDB environment.
        retention: a `Retention` (or a list of them) applied in the transaction of each record.
        check: when the structure of ``data.mdb`` is checked (LMDB trusts its pages: a crafted file
            could crash it): ``"open"`` (default) every tree at open; ``"as-read"`` (read-only only)
            the small trees at open and each other tree, or for the event log each range of it,
            before it is first read, so that opening costs what is read, not the file's size.
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
        payload_store: Union[None, str, "os.PathLike[str]", PayloadStore] = None,
        retention: Optional[Rules] = None,
        check: str = "open",
    ) -> None:
        _check_key(run, "train")
        if check not in ("open", "as-read") or check == "as-read" and not readonly:
            raise ValueError(f"check {check!r} is not supported: use 'open', or 'as-read' with readonly=True")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression {compression!r} is not supported: use None or 'zstd'")
        self.path = os.fspath(path)
        self.run = run
        check_fingerprint(fingerprint or {})  # names to JSON scalars, finite numbers, 64-bit ints
        self.fingerprint: Dict[str, Any] = dict(fingerprint or {})
        self.readonly = readonly
        self.compression = compression
        self._registry = registry
        self._writer = RunWriter(self.path, run)  # the session's live-writer claim on its run
        self._with_session = session and not readonly
        self._store = Store(self.path, readonly=readonly, map_size=map_size, max_size=max_size, sync=sync, check=check)
        self._log = EventLog(self._live, self.path)
        self._index = Projections(self._log)
        self._fingerprints = SessionFingerprints(self.path, self._log, self._index, self._live)
        local = local_payload_store(self._store)
        self._payloads: PayloadStore = open_payload_store(payload_store, local)
        self._retainer = Retainer(retention, self._payloads) if retention is not None else None
        # The one write path: records (grouped), and the pulls, imports and prunes given it by `appender_of`.
        after = None if self._retainer is None else self._retainer.committed
        self._appender = Appender(self._live, local, self._payloads, self._project_in, lead=self._lead_events,
                                  opened=self._session_written, after=after)
        own_appender(self, self._appender)
        _JOURNALS.add(self)  # once it has its appender, which the fork hook renews
        self._imports = FoldedImports()  # the import map, kept as the log grows: one read for many replays
        self.session: Optional[str] = None
        self._opening: Optional[SessionOpened] = None  # this session's SessionOpened, until its first call
        try:
            if not readonly:
                self._init_meta()
            else:
                with self._store.read() as txn:
                    check_format_in(txn, self._store.db("meta"), self.path, writing=False)
                    Projections.check_layout_in(txn, self._store)
        except BaseException:  # e.g. a layout newer than this library: leave nothing open behind
            self._store.close()
            raise
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
        with self._appender.lock:  # after the write in flight
            self._writer.close()
            self._store.close()
            self._appender.close()

    @property
    def closed(self) -> bool:
        return self._store.closed

    @property
    def payload_store(self) -> PayloadStore:
        """Where this journal's payloads live (its `PayloadStore`)."""
        self._live()
        return self._payloads

    def _live(self) -> Store:
        if self._store.closed:
            raise JournalClosedError(f"journal {self.path!r} is closed; open a new Journal on it")
        if self._store.forked():
            # A fork child (dataloader worker, Ray) must not use the parent's LMDB environment.
            log.info("journal_reopened_after_fork", path=self.path, pid=os.getpid())
            self._store.reopen_after_fork()
            self._index.clear()
        return self._store

    def _init_meta(self) -> None:
        def fn(txn):
            meta = self._store.db("meta")
            check_format_in(txn, meta, self.path, writing=True)  # before anything is written
            new = is_new_in(txn, meta, self._store.db("events"), self.path)
            mark_format_in(txn, meta, new=new)
            if new:
                txn.put(META_CREATED, repr(time.time()).encode(), db=meta)
            if Projections.upgrade_layout_in(txn, self._store, new=new):
                log.info("journal_index_upgraded", path=self.path,
                         note="layout-1 index rebuilt with stages in its keys")
            Projections.ensure_sessions_in(txn, self._store, new=new)

        self._appender.write(fn)

    def _open_session(self) -> None:
        # Written with the session's first call, in its transaction: a start that fails before any call (a
        # policy spec refused after the journal opened) leaves no empty session in the log.
        self._opening = SessionOpened(
            session=uuid.uuid4().hex,
            run=self.run,
            fingerprint=dict(self.fingerprint),
            library_version=__version__,
            host=socket.gethostname(),
            pid=os.getpid(),
            ts=time.time(),
        )
        self.session = self._opening.session

    # -- recording calls -------------------------------------------------------------------------
    def prepare(self, value: Any, *, store: bool = True, copy: bool = True) -> PreparedPayload:
        """Encode and hash a value for storage, without writing anything.

        Compression (when the journal compresses) waits until the payload is stored or its `ref` is
        asked for, so a value only needed for its `digest` is never compressed.

        Args:
            value: any encodable value (a `PreparedPayload` is returned as it is).
            store: False keeps only the digest (the encoding is dropped): for an input that is
                compared, never stored.
            copy: False keeps the encoding as pieces that are the tensors' own memory where they are laid
                out in C order (no copy of them): for a value recorded right away, which must not change
                until then (`record` and the policies' engine prepare so). A payload large enough to be
                a file is written while it is hashed; dropped without being recorded, its file is removed.

        Raises:
            UnsupportedValueError: the value (or a part of it, named by its path) cannot be stored.
        """
        if isinstance(value, PreparedPayload):
            return value
        # Not copied: a large payload's file is written while it is hashed (its store's `stage`).
        stage = self._payloads.stage if not copy and self._payloads.stages_writes else None
        return prepare_payload(value, registry=self._registry, compression=self.compression, store=store, copy=copy,
                               stage=stage)

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
        stage: str = DEFAULT_STAGE,
        not_stored: Optional[str] = None,
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
            stage: which stage of the step the call belongs to (``"generate"``, ``"reward"`` ...).
            not_stored: why a part of the call (its output, its input) was left out, in words; the
                event's `not_stored` field, which `JournalView.not_stored` reads.

        Returns:
            The recorded generation (its sequence number and event).
        """
        event, prepared = self._recording(
            step, output, gen_index=gen_index, mode=mode, input=input, store_input=store_input,
            input_digest=input_digest, store_output=store_output, duration_s=duration_s, policy=policy, reason=reason,
            imported_from=imported_from, stage=stage, not_stored=not_stored)
        # `prepared` is held until the record committed (by its `Pending`, whose group may outlive this caller): a
        # large payload's file, staged while it was hashed, is removed with its `PreparedPayload` (one dropped
        # unrecorded leaves no file), and written again if so.
        (seq,) = self._append([event], [(p.key, p.blob) for p in prepared], kept=prepared)
        log.debug("generation_recorded", step=step, gen_index=gen_index, mode=mode, seq=seq, stored=store_output)
        return RecordedGeneration(seq, event)

    async def arecord(
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
        stage: str = DEFAULT_STAGE,
        not_stored: Optional[str] = None,
    ) -> RecordedGeneration:
        """`record` for a caller in an event loop: the same record, awaited instead of blocking the loop.

        Concurrent callers (coroutines of any loop, and threads calling `record`) share one durable commit:
        each returns once the commit holding its record is durable, and a coroutine waits for it without a
        thread of its own. The encoding and hashing run in the loop's thread, as they would in a caller's;
        an output of many megabytes is better recorded through ``await asyncio.to_thread(journal.record, ...)``.
        As with `record`, the output must not change until the call returns (a large tensor is stored from its
        own memory). The arguments, the result and the errors are `record`'s.
        """
        event, prepared = self._recording(
            step, output, gen_index=gen_index, mode=mode, input=input, store_input=store_input,
            input_digest=input_digest, store_output=store_output, duration_s=duration_s, policy=policy, reason=reason,
            imported_from=imported_from, stage=stage, not_stored=not_stored)
        # `prepared` is held until the record committed (see `record`).
        (seq,) = await self._appender.append_async(self._pending([event], [(p.key, p.blob) for p in prepared],
                                                                 kept=prepared))
        log.debug("generation_recorded", step=step, gen_index=gen_index, mode=mode, seq=seq, stored=store_output)
        return RecordedGeneration(seq, event)

    def _recording(
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
        stage: str = DEFAULT_STAGE,
        not_stored: Optional[str] = None,
    ) -> Tuple[GenerationRecorded, List[PreparedPayload]]:
        """`record`'s event and the prepared payloads it names, validated and encoded (nothing written)."""
        fields = self._call_fields(step, gen_index, mode, stage)  # validate before the costly encoding
        prepared: List[PreparedPayload] = []
        out_ref = in_ref = None
        if store_output:
            out = self.prepare(output, copy=False)  # stored by the caller, before its caller gets control back
            out_ref = out.ref
            prepared.append(out)
        if input is not None and (store_input or input_digest is None):
            # An input kept only for its digest is neither stored nor compressed.
            inp = self.prepare(input, store=store_input)
            input_digest = input_digest or inp.digest
            if store_input:
                in_ref = inp.ref
                prepared.append(inp)
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
            not_stored=not_stored,
        )
        return event, prepared

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
        stage: str = DEFAULT_STAGE,
    ) -> int:
        """Journal that a call at (stage, step, gen_index) was served from `source`; return the event's seq.

        Raises:
            JournalError: `source` stored no output, or belongs to another stage.
        """
        if source.event.output is None:
            raise JournalError(f"recorded generation #{source.seq} has no stored output to replay")
        if source.event.stage != stage:
            raise JournalError(
                f"recorded call #{source.seq} is of stage {source.event.stage!r}; a call of stage {stage!r} "
                "is served only from its own stage's records"
            )
        event = ReplayServed(
            **self._call_fields(step, gen_index, mode, stage),
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
        stage: str = DEFAULT_STAGE,
    ) -> int:
        """Journal that a call ran without recording or replay (e.g. validation); return the event's seq."""
        event = CallBypassed(
            **self._call_fields(step, gen_index, mode, stage),
            policy=policy,
            reason=reason,
            ts=time.time(),
            duration_s=float(duration_s),
        )
        return self._append([event], [])[0]

    def record_refusal(
        self,
        step: int,
        *,
        gen_index: int = 0,
        mode: str = "train",
        policy: str = "manual",
        reason: str,
        stage: str = DEFAULT_STAGE,
    ) -> int:
        """Journal that a call was refused with an error (so the audit shows why); return the event's seq."""
        event = CallRefused(
            **self._call_fields(step, gen_index, mode, stage),
            policy=policy,
            reason=reason,
            ts=time.time(),
        )
        return self._append([event], [])[0]

    def _call_fields(self, step: int, gen_index: int, mode: str, stage: str = DEFAULT_STAGE) -> Dict[str, Any]:
        """The validated fields every call event starts with."""
        _check_key(self.run, mode, stage)
        _check_step(step, gen_index)
        return {
            "session": self._session_id(), "run": self.run, "step": step, "gen_index": gen_index, "mode": mode,
            "stage": stage,
        }

    def _session_id(self) -> str:
        self._live()
        if self.session is None:
            raise JournalError(
                f"journal {self.path!r} is open read-only or without a session; open it with "
                "readonly=False and session=True to record"
            )
        return self.session

    # -- writing -------------------------------------------------------------------------------
    def _append(self, events: List[Event], payloads: List[Tuple[bytes, Any]], kept: Sequence[Any] = ()) -> List[int]:
        """Append events (and the payload blobs they reference) durably; return their seqs. The appender
        commits them with the records of other threads (group commit); the payload store decides how
        (`PayloadStore.commit`): each payload is durable when its event commits."""
        return self._appender.append(self._pending(events, payloads, kept))

    def _pending(self, events: List[Event], payloads: List[Tuple[bytes, Any]], kept: Sequence[Any] = ()) -> Pending:
        """The appender's record of `events` and their payloads (`kept`: what owns their staged files): checked by
        the writer, encoded, sized."""
        self._live()
        self._writer.before_append(events, self.session)
        encoded = [encode_event(e) for e in events]
        if not self._payloads.takes_pieces:  # the store's declaration (`PayloadStore`): it takes bytes only
            payloads = [(key, joined(blob)) for key, blob in payloads]
        # the map grows for what LMDB will hold
        needed = self._payloads.lmdb_bytes(payloads) + sum(len(b) for b in encoded)
        return Pending(events, encoded, payloads, needed, kept)

    def _project_in(self, txn: lmdb.Transaction[Any], events: List[Event], bodies: List[bytes]) -> List[int]:
        """A group's events appended and projected in its transaction (retention planned there too)."""
        store = self._store
        seqs = [seq for seq, _ in Projections.append_and_project_in(txn, store, events, bodies)]
        if self._retainer is not None:
            self._retainer.in_txn(txn, store, seqs, events)
        return seqs

    def _lead_events(self, events: List[Event]) -> Tuple[List[Event], List[bytes]]:
        """This session's `SessionOpened`, written with its first call, in its transaction."""
        opening = self._opening
        if opening is None or not any(getattr(e, "session", None) == self.session for e in events):
            return [], []
        return [opening], [encode_event(opening)]

    def _session_written(self) -> None:
        self._opening = None  # committed: whatever the payload store does after, the session is open in the log

    # -- reading events --------------------------------------------------------------------------
    def last_seq(self) -> int:
        """The sequence number of the newest event (0 for an empty journal)."""
        return self._log.last_seq()

    def raw_events(self, *, since: int = 0) -> Iterator[Tuple[int, bytes]]:
        """Yield (seq, stored bytes) of every event after `since`, without decoding.

        Events are read in batches, each in its own short transaction: no transaction stays open
        while the caller holds the generator. Events never change once written, so the batches join
        into the log as it was, plus whatever was appended meanwhile.
        """
        return self._log.raw_events(since=since)

    def events(
        self,
        *,
        since: int = 0,
        run: Optional[str] = None,
        types: Optional[Iterable[type]] = None,
        steps: Optional[Any] = None,
        stage: Optional[str] = None,
    ) -> Iterator[Tuple[int, Event]]:
        """Yield (seq, event) in log order, filtered.

        Args:
            since: only events with a larger sequence number.
            run: only events of this run key (None: every run).
            types: only events of these classes.
            steps: only call events whose step is in this container (a set, range or `StepRanges`).
            stage: only call events of this stage (``"generate"``, ``"reward"`` ...; None: every stage).

        Raises:
            EventDecodeError: an event cannot be decoded (the journal is damaged).
        """
        return self._log.events(since=since, run=run, types=types, steps=steps, stage=stage)

    def event(self, seq: int) -> Event:
        """Return the event with sequence number `seq`."""
        return self._log.event(seq)

    def as_read_here(self, seq: int, event: Event) -> Event:
        """`event` (at `seq`) as this journal reads it: a pulled release or replay names its record by
        this journal's seq (the seq it had where it was recorded is the audit's ``origin_seq``)."""
        return self._imports.current(self._log, self._appender.lock).translate(seq, event)

    def sessions(self, *, run: Optional[str] = None) -> List[Tuple[int, SessionOpened]]:
        """Every `SessionOpened` event (optionally of one run), in order."""
        return [(seq, event) for seq, event in self.events(run=run, types=[SessionOpened])
                if isinstance(event, SessionOpened)]  # all of them: the narrowing is for the type

    def session_fingerprint(self, session: str) -> Dict[str, Any]:
        """The fingerprint recorded when `session` opened (one read of the sessions index).

        Raises:
            IntegrityError: the log holds no `SessionOpened` event of `session` (nor is it this journal's
                own session, whose event is written with its first call).
        """
        opening = self._opening
        if opening is not None and session == opening.session:
            return dict(opening.fingerprint)
        return self._fingerprints.of(session)

    # -- projection queries: one read transaction of the gen / steps indexes per (run, mode, stage), nothing cached
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
            # `types` yields call events only, each with a stage; the checker sees the whole Event union.
            seen.setdefault(event.stage, None)  # type: ignore[union-attr]
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
        return summaries(fold, self._session_at, stage)

    def _session_at(self, seq: int) -> SessionOpened:
        """The `SessionOpened` at `seq`, which the runs index names as a session."""
        event = self.event(seq)
        if not isinstance(event, SessionOpened):
            raise IntegrityError(
                f"the runs index of {self.path} names seq {seq} as a session, but it holds a "
                f"{type(event).__name__}: the index is damaged; rebuild it with `stepjournal reindex`",
                detail="runs index")
        return event

    # -- payloads --------------------------------------------------------------------------------
    def load(self, ref: PayloadRef, *, step: Optional[int] = None) -> Any:
        """Load and decode a stored payload, verifying its digest first.

        Raises:
            IntegrityError: the payload is missing or its bytes do not match the digest (names the step).
            PayloadDecodeError: the bytes are not a valid payload.
        """
        where = f" (step {step})" if step is not None else ""
        self._live()
        key = digest_key(ref.digest, step)
        try:
            with self._payloads.view(key, nbytes=ref.nbytes) as (raw, release):
                return decode_verified(raw, key, registry=self._registry, release=release, where=where, step=step)
        except IntegrityError as exc:
            if exc.step is None and step is not None:
                raise type(exc)(f"{exc}{where}", step=step, detail=exc.detail) from None
            raise

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
        self._live()
        with self._payloads.view(digest_key(digest)) as (raw, _):
            return bytes(raw)

    # -- audit -----------------------------------------------------------------------------------
    def audit(self, **filters: Any) -> List[Any]:
        """One typed record per generate call, in log order (see `stepjournal.index._audit.audit`)."""
        return _audit(self.events(types=AUDIT_EVENT_TYPES), **filters)  # it filters, seeing provenance

    def samples(self, step: int, *, run: Optional[str] = None, mode: str = "train", gen_index: int = 0,
                tokenizer: Any = None, decoded: Optional[int] = None, session: Optional[str] = None) -> List[Any]:
        """The samples of the generate call at `step` (of `session` only, when given), with the rewards and
        log-probs that session journaled (`stepjournal.Sample`; see `stepjournal.index._samples.samples`)."""
        from .index._samples import samples  # here: it reads tensors (torch), which a push or clone never loads

        return samples(self, step, run=run, mode=mode, gen_index=gen_index, tokenizer=tokenizer, decoded=decoded,
                       session=session)

    # -- projections and verification ------------------------------------------------------------
    def index_items(self) -> List[Tuple[bytes, int]]:
        """The `gen` index as (key, seq) pairs, in key order (to compare with a rebuilt one)."""
        return self._index.index_items(self._live())

    def rank_items(self) -> List[Tuple[bytes, int]]:
        """The ``steps`` rank index as (key, step) pairs, in key order (to compare with a rebuilt one)."""
        return self._index.rank_items(self._live())

    def reindex(self) -> int:
        """Rebuild every projection from the event log; return the number of events replayed.

        The log is read inside the write transaction that rebuilds, so an event another process
        commits meanwhile is either in the rebuild or appended (and indexed) after it.

        Raises:
            EventDecodeError: an event cannot be decoded; nothing was changed.
        """
        store = self._live()
        with self._appender.lock:
            # Room up front, unless capped: a rebuild that fits in the pages earlier writes freed must not fail there.
            needed = Projections.rebuild_bytes(store) if store.max_size is None else 0
            count = self._appender.write(lambda txn: Projections.rebuild_in(txn, store), needed=needed)
            self._index.clear()
            self._fingerprints.clear()
        log.info("journal_reindexed", path=self.path, events=count)
        return count

    def security_warnings(self) -> List[str]:
        """What lets another user change or swap this journal (permissions, owners); empty when nothing.

        A journal is trusted because only its owner writes it: a folder writable by others is
        reported here (and logged when the journal opens), not refused.
        """
        return security_warnings(self.path)

    def verify(self, *, progress: Any = None) -> List[VerifyProblem]:
        """Check everything: each event decodes, each payload matches its digest, the index matches the log;
        return the problems found (empty: whole). `progress`: called as ``progress(done, total)`` in bytes."""
        store = self._live()
        with store.read() as txn:
            layout = layout_of(txn, store)
        def rows():  # every stored row, read after the log (`verify` compares them when no writer appended)
            return stored_rows(store, self.last_seq(), seqs=True, checked=False, whole=True)

        return _verify(self.raw_events(), self.index_items, self.last_seq, self._payloads, progress=progress,
                       layout=layout, stored_rows=rows)
