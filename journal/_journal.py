"""`Journal`: the append-only event log of generate calls, with payloads stored beside it.

`Journal` is a facade: it owns the lifecycle (open, close, fork, sessions) and the sequence of a
record (validate, prepare payloads, commit payloads and events), and hands everything else to a room
with one job (see docs/architecture.md):

- `_eventlog.EventLog`: appending and reading the ``events`` database (the truth);
- `_projections.Projections`: the ``gen`` step index, the ``steps`` rank index and the ``sessions``
  index, kept by each append and rebuilt by `reindex` (nothing cached in memory);
- `_payloads` (encode -> digest -> compress on store) and a `PayloadStore` (by default the journal's
  own, `_file_store.local_payload_store`: small payloads in the event's transaction, large ones files);
- `_verify.verify` and `_audit.audit`: pure functions over what the rooms read.

On disk: see `_keys` (key layout) and docs/architecture.md (databases).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from .index._audit import AUDIT_EVENT_TYPES, audit as _audit
from .events._convert import encode_event
from .base._errors import IntegrityError, JournalClosedError, JournalError
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
from .payloads._payload_store import LmdbPayloadStore, PayloadStore
from .payloads._payloads import COMPRESSIONS, PreparedPayload, decode_verified, digest_key, joined
from .index._projections import Projections, RecordedGeneration, layout_of
from .index._rows_index import stored_rows
from .upkeep._release import Retainer
from ._queries import Queries
from ._recording import Recording
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
        journal._lock = threading.RLock()
        journal._writer.forget_in_fork_child()  # the parent's claim to its run stays the parent's
        if journal._with_session:  # here, while the child has one thread: its threads' calls name one session
            journal._open_session()


os.register_at_fork(after_in_child=_new_locks_in_fork_child)


class Journal(Recording, Queries):
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
        payload_store: Any = None,
        retention: Any = None,
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
        self._lock = threading.RLock()
        self._writer = RunWriter(self.path, run)  # the session's live-writer claim on its run
        self._with_session = session and not readonly  # before the fork hook can see this journal
        _JOURNALS.add(self)
        self._store = Store(self.path, readonly=readonly, map_size=map_size, max_size=max_size, sync=sync, check=check)
        self._log = EventLog(self._live, self.path)
        self._index = Projections(self._log)
        self._fingerprints = SessionFingerprints(self.path, self._log, self._index, self._live)
        self._local_payloads = local_payload_store(self._store)
        self._payloads: PayloadStore = open_payload_store(payload_store, self._local_payloads)
        self._retainer = Retainer(retention, self._payloads) if retention is not None else None
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
        with self._lock:
            self._writer.close()
            self._store.close()

    @property
    def closed(self) -> bool:
        return self._store.closed

    @property
    def payload_store(self) -> PayloadStore:
        """Where this journal's payloads live (its `PayloadStore`)."""
        self._live()
        return self._payloads

    def local_payloads(self) -> LmdbPayloadStore:  # what push, pull, bundles and status read and write
        """This journal's own payloads (LMDB table, ``payloads/`` files), whatever its `payload_store`."""
        self._live()
        return self._local_payloads

    def lmdb_store(self) -> Store:  # the seam of the modules that work in the journal's own transactions
        """The open LMDB `Store`, for prune, push, pull, bundles and status (docs/architecture.md, "Seams").
        JournalClosedError once closed; a fork child's environment is reopened first."""
        return self._live()

    @property
    def write_lock(self) -> threading.RLock:
        """The lock this journal's appends hold; another module's write (prune, pull) takes it too."""
        return self._lock

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
                log.info("journal_index_upgraded", path=self.path, note="layout-1 index rebuilt with stages in its keys")
            Projections.ensure_sessions_in(txn, self._store, new=new)

        self._store.write(fn)

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

    # -- writing -------------------------------------------------------------------------------
    def _append(self, events: List[Event], payloads: List[Tuple[bytes, Any]]) -> List[int]:
        """Append events (and the payload blobs they reference) durably; return their seqs. The payload
        store decides how (`PayloadStore.commit`): each payload is durable when its event commits."""
        store = self._live()
        self._writer.before_append(events, self.session)
        encoded = [encode_event(e) for e in events]
        if not getattr(self._payloads, "takes_pieces", False):  # a store of the user's: bytes, as the protocol says
            payloads = [(key, joined(blob)) for key, blob in payloads]
        in_lmdb = getattr(self._payloads, "lmdb_bytes", None)  # the map grows for what LMDB will hold
        needed = (in_lmdb(payloads) if in_lmdb else 0) + sum(len(b) for b in encoded)

        lead: List[Event] = []  # this session's SessionOpened, written with its first call

        def write_events(in_txn):
            def fn(txn):
                if in_txn is not None:
                    in_txn(txn)
                appended = Projections.append_and_project_in(txn, store, lead + events, lead_bytes + encoded)
                seqs = [seq for seq, _ in appended][len(lead):]
                if self._retainer is not None:
                    self._retainer.in_txn(txn, store, seqs, events)
                return seqs

            # buffers: checking a stored duplicate payload hashes it in place instead of copying it.
            seqs = store.write(fn, needed=needed + sum(len(b) for b in lead_bytes), buffers=True)
            if lead:  # committed: whatever the payload store does after, the session is open in the log
                self._opening = None
            return seqs

        with self._lock:
            if self._opening is not None and any(getattr(e, "session", None) == self.session for e in events):
                lead.append(self._opening)
            lead_bytes = [encode_event(e) for e in lead]
            seqs = self._payloads.commit(payloads, write_events)
            if self._retainer is not None:
                self._retainer.committed()  # after the commit: what a remote store deletes
        return seqs

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
        return self._imports.current(self._log, self._lock).translate(seq, event)

    def sessions(self, *, run: Optional[str] = None) -> List[Tuple[int, SessionOpened]]:
        """Every `SessionOpened` event (optionally of one run), in order."""
        return list(self.events(run=run, types=[SessionOpened]))

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
        with self._lock:
            # Room up front, unless capped: a rebuild that fits in the pages earlier writes freed must not fail there.
            needed = Projections.rebuild_bytes(store) if store.max_size is None else 0
            count = store.write(lambda txn: Projections.rebuild_in(txn, store), needed=needed)
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
