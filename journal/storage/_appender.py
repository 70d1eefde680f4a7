"""`Appender`: the journal's one write path, with group commit.

Every write of a journal goes through its appender: a record (`append`), and a pull, an import, a
prune or a release (`write`). Both hold the journal's write lock (`lock`), so one thread of the
process writes at a time, and LMDB's own lock keeps other processes out meanwhile.

**Group commit.** Concurrent `append` calls of one process share one durable commit, as PostgreSQL
and RocksDB group theirs. Each caller queues its `Pending` record. The first caller, finding no
leader, leads: it takes the queue (up to `max_group` records) under the write lock, commits their
payloads and events in one write transaction, made durable by LMDB's sync, then acknowledges each
record. Callers arriving meanwhile wait; when the leader is done, the oldest of them leads the next
group. A caller returns only once the commit holding its record is durable; payloads are still made
durable before (or with) the events that name them (`PayloadStore.commit`, one call per group).

**Outcomes are remembered.** A record is written once: the seqs it took are kept on it the moment
its commit returns. When a group's commit raises (in it, or after it: an interrupt, a failure after
LMDB committed), the leader looks at the log for each record's first event at the seq the
transaction gave it: there, the record is committed and acknowledged; missing, it was not written.
A record that was not written is retried alone by its own caller, so one caller's failure (a payload
over the size cap, an interrupt) fails no other's record, and only the caller whose record cannot be
written gets the error. A group of one gets its error at once. The leader's own interrupt
(`KeyboardInterrupt`, `SystemExit`), and a failure after the group committed (a payload store whose
`commit` raises once the events are in), go to the leader's caller after it settled the others: every
record of a committed group is acknowledged to the others. Wherever an interrupt lands in a caller, its
record leaves the queue if still there and the lead is handed on (`_leave`): no caller waits forever.

**Callers in an event loop** (`append_async`, `Journal.arecord`) share the queue, each waiting on a future instead of
a lock: no thread and no thread switch per record. A coroutine's lead runs at once on the appender's lead thread
(`_start_lead`), so the loop goes on encoding while a group commits, and the lead never waits on the loop (blocked by
a `record` call, or closed with the task in it) nor on its executor (whose workers may be `record` calls waiting for
that lead); a group's coroutines are settled with one call into each loop. Outcomes, retries alone and the hand-over
are the threads' own: the two kinds of caller share every group. A cancelled coroutine is an interrupt: its record
leaves the queue if still there; one a leader already took is committed and acknowledged to no one, as after Ctrl-C.

`appender_of(journal)` is the seam through which the modules that write or read inside the journal's own transactions
(`_pull`, `_prune`, `_remote`, `_bundle`, `_status`) reach its store, own payloads and write path (not public).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import lmdb

from ..base._errors import JournalError
from ..events._keys import seq_key
from ._store import Store

__all__ = ["Appender", "Pending", "appender_of", "own_appender", "MAX_GROUP"]

# Records committed in one transaction at most: a group's transaction holds LMDB's writer lock (other
# processes wait) and its bytes in memory; 1024 records of a few KiB is a few MB.
MAX_GROUP = 1024

# ``project(txn, events, bodies) -> seqs``: appends the events to the log and projects them.
Project = Callable[[Any, List[Any], List[bytes]], List[int]]
# ``observe(point, count)``: what the group commit is doing (for tests that kill at an observed point):
# ``"queued"`` (the queue's length after a record joined it), ``"taken"`` (a leader's group, before its
# commit) and ``"committed"`` (the group, durable, before its callers are acknowledged).
Observe = Callable[[str, int], None]


class Pending:
    """One caller's record in the appender's queue, and its outcome once settled.

    Args:
        events: the events to append, in order.
        bodies: their stored bytes (`encode_event`), encoded by the caller's thread.
        payloads: ``(digest, blob)`` of the payloads they name, for `PayloadStore.commit`.
        needed: the bytes the record puts in LMDB's pages (for the map's growth).
        kept: what owns the payloads' files staged while hashed (`PreparedPayload`s): held with the record, so a
            caller gone meanwhile (a cancelled coroutine, an interrupt) leaves them to the commit that takes it.
    """

    __slots__ = ("events", "bodies", "payloads", "needed", "kept", "seqs", "error", "alone", "leads", "tentative",
                 "future", "awaited", "thread_leads", "lead_error")

    def __init__(self, events: List[Any], bodies: List[bytes], payloads: List[Tuple[bytes, Any]], needed: int,
                 kept: Sequence[Any] = ()) -> None:
        self.events, self.bodies, self.payloads, self.needed, self.kept = events, bodies, payloads, needed, kept
        self.seqs: Optional[List[int]] = None  # committed: the seqs its events took (never written again)
        self.error: Optional[BaseException] = None  # not written: what its caller raises
        self.alone = False  # its group's commit failed before writing it: its caller commits it alone
        self.leads = False  # the leader of the next group
        self.tentative: Optional[List[int]] = None  # its seqs in the transaction being committed
        # A coroutine's record (`append_async`): what its caller awaits until the record leads or is settled.
        self.future: Optional[asyncio.Future[None]] = None
        self.awaited = False  # a coroutine's record: the lead thread leads for it (`_start_lead`)
        self.thread_leads = False  # that thread is leading (its caller waits until it is done)
        self.lead_error: Optional[BaseException] = None  # what that lead raised: its caller's

    @property
    def settled(self) -> bool:
        return self.seqs is not None or self.error is not None or self.alone


class Appender:
    """The write path of one journal handle: group commit of records, and exclusive writes.

    Args:
        live: the open `Store` (raises once the journal is closed; reopens in a fork child).
        local: the journal's own payload store (its LMDB table and ``payloads/`` files).
        payloads: the `PayloadStore` records commit through (``commit(items, write_events)``).
        project: appends and projects a group's events inside its transaction; returns their seqs.
        lead: ``lead(events)``: events to write before a group's (the session's `SessionOpened`, with
            its first call), as ``(events, bodies)``; `opened` is called once they committed.
        opened: see `lead`.
        after: called after each group's commit (retention's deletions of what it released).
        group: False commits each record alone (one durable commit per call, the path before group commit).
    """

    def __init__(self, live: Callable[[], Store], local: Any, payloads: Any, project: Project, *,
                 lead: Callable[[List[Any]], Tuple[List[Any], List[bytes]]], opened: Callable[[], None],
                 after: Optional[Callable[[], None]] = None, group: bool = True, max_group: int = MAX_GROUP) -> None:
        self._live = live
        self.local = local
        self._payloads = payloads
        self._project = project
        self._lead = lead
        self._opened = opened
        self._after = after
        self.group = group
        self.max_group = max_group
        self.observe: Optional[Observe] = None
        self._new_locks()

    def _new_locks(self) -> None:
        self.lock = threading.RLock()  # the write lock: a group's leader, a pull, a prune, a reindex
        self._cond = threading.Condition(threading.Lock())  # guards the queue and the leadership
        self._queue: List[Pending] = []
        self._leading = False
        self._writing = threading.local()  # this thread is inside a write (`write`, a group's commit)
        # The thread leading coroutines' records (`_start_lead`): one; a lead handed on waits behind it.
        self._leads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepjournal-lead")

    def close(self) -> None:
        """The journal closes (under the write lock, no group in flight): the idle lead thread ends."""
        self._leads.shutdown(wait=False)

    def forget_in_fork_child(self) -> None:
        """In a fork child: new locks and an empty queue (the parent's threads and records are not here)."""
        self._new_locks()

    @property
    def store(self) -> Store:
        """The journal's open LMDB `Store` (`JournalClosedError` once closed; reopened in a fork child)."""
        return self._live()

    # -- exclusive writes ------------------------------------------------------------------------
    def write(self, fn: Callable[[Any], Any], *, needed: int = 0, buffers: bool = False,
              after: Optional[Callable[[], None]] = None) -> Any:
        """Run `fn(txn)` in one durable write transaction under the write lock (a pull, an import, a prune,
        a reindex), then `after()` (what must wait until it committed: deleting released files)."""
        with self.lock, self._inside():
            result = self.store.write(fn, needed=needed, buffers=buffers)
            if after is not None:
                after()
        return result

    @contextmanager
    def _inside(self) -> Iterator[None]:
        outer = getattr(self._writing, "on", False)
        self._writing.on = True
        try:
            yield
        finally:
            self._writing.on = outer

    # -- records ---------------------------------------------------------------------------------
    def append(self, pending: Pending) -> List[int]:
        """Commit `pending` durably (with the records queued beside it, see the module's docstring); return
        the seqs of its events.

        Raises:
            What committing the record alone raised (`JournalFullError` ...); nothing of it was written.
        """
        if not self.group or getattr(self._writing, "on", False):  # called inside a write: no group to wait on
            return self._alone(pending)
        try:
            with self._cond:
                self._join(pending)
                while not pending.leads and not pending.settled:
                    self._cond.wait()
            if pending.leads and not pending.settled:
                self._lead_groups(pending)
        except BaseException:  # an interrupt, wherever it lands: no record left queued, no lead lost
            self._leave(pending)
            raise
        return self._alone(pending) if pending.alone else self._acknowledged(pending)

    async def append_async(self, pending: Pending) -> List[int]:
        """`append` for a caller in an event loop: the same group commit, awaited (see the module's docstring).

        Raises:
            What committing the record alone raised; nothing of it was written.
        """
        if getattr(self._writing, "on", False):  # in a write of this thread (holding the write lock) a lead would
            return self._alone(pending)  # wait for it as it waits for the lead: alone, as in `append`
        if not self.group:
            return await asyncio.to_thread(self._alone, pending)
        loop = asyncio.get_running_loop()
        pending.awaited = True
        try:
            with self._cond:
                self._join(pending)
            while True:
                with self._cond:
                    if pending.settled and not pending.thread_leads:
                        break
                    future = pending.future = loop.create_future()
                await future
        except BaseException:  # a cancellation, wherever it lands: no record left queued, no lead lost
            self._leave(pending)
            raise
        if pending.lead_error is not None:  # an interrupt or a failure after the commit, in the lead it took
            raise pending.lead_error
        return await asyncio.to_thread(self._alone, pending) if pending.alone else self._acknowledged(pending)

    def _join(self, pending: Pending) -> None:
        """Queue `pending` (under `_cond`); it leads when nobody does."""
        self._queue.append(pending)
        if not self._leading:
            self._leading = pending.leads = True
            if pending.awaited:
                self._start_lead(pending)
        self._tell("queued", len(self._queue))

    def _start_lead(self, pending: Pending) -> None:
        """Lead for a coroutine's record in the appender's lead thread, asked now (under `_cond`): the lead never
        waits for its loop to run (a loop blocked by a `record` call, a loop closed with the task in it) nor
        for a worker of the loop's executor (each may be a `record` call waiting for this very lead)."""
        if pending.thread_leads:
            return
        pending.thread_leads = True
        try:
            self._leads.submit(self._lead_for, pending)
        except RuntimeError:  # the interpreter exits (its executors take no more work) while a thread records
            threading.Thread(target=self._lead_for, args=(pending,), name="stepjournal-lead").start()

    def _lead_for(self, pending: Pending) -> None:
        try:
            self._lead_groups(pending)
        except BaseException as exc:  # the leader's caller's (see the module's docstring): its coroutine raises it
            pending.lead_error = exc
        finally:
            with self._cond:
                pending.thread_leads = False
                _resume([pending])

    @staticmethod
    def _acknowledged(pending: Pending) -> List[int]:
        """The seqs of a settled record, or the error that kept it out."""
        if pending.error is not None:
            raise pending.error
        assert pending.seqs is not None
        return pending.seqs

    def _lead_groups(self, mine: Pending) -> None:
        """Lead: commit the queue a group at a time until `mine` is settled, then hand the lead over."""
        try:
            while not mine.settled:
                group: List[Pending] = []
                try:
                    with self.lock:
                        with self._cond:  # one statement: an interrupt leaves the group taken or not
                            size = max(1, self.max_group)  # 0 or less would take empty groups forever
                            group, self._queue = self._queue[:size], self._queue[size:]
                        if group:  # none: another leader's group, committed under this lock, held `mine`
                            self._commit_group(group)
                finally:
                    for p in group:  # a second interrupt cut the settling short: no record is left waiting
                        if not p.settled:
                            if p.tentative is None:
                                p.alone = True  # it never reached a transaction: not written
                            else:
                                p.error = JournalError("the write of this record was interrupted; it may be in "
                                                       "the journal: look before recording it again")
                    with self._cond:
                        _resume(group)
        finally:
            with self._cond:
                self._hand_over()

    def _leave(self, pending: Pending) -> None:
        """After an interrupt of `pending`'s caller, wherever it landed: a record still queued is not written
        (it leaves the queue), and the lead goes on, handed over whether or not this caller held it (it may
        have been handed to it, or been handing it on): a second leader is harmless (groups are taken and
        committed under the write lock), a lead nobody takes would leave every caller waiting."""
        with self._cond:
            if pending in self._queue:
                self._queue.remove(pending)
                # Settled as not written: a lead taken for it (a coroutine's thread) stops instead of waiting
                # for a record no group will hold.
                pending.error = JournalError("this record was not written: its caller was interrupted while it "
                                             "waited to be committed; record it again")
            self._hand_over()

    def _hand_over(self) -> None:
        """The oldest queued record leads next (under `_cond`); none queued: no leader."""
        if self._queue:
            self._queue[0].leads = True
            if self._queue[0].awaited:
                self._start_lead(self._queue[0])
            _resume(self._queue[:1])
        else:
            self._leading = False
        self._cond.notify_all()

    def _alone(self, pending: Pending) -> List[int]:
        """Commit `pending` in a group of its own; its failure is its caller's."""
        pending.alone = False
        pending.tentative = None
        with self.lock:
            self._commit_group([pending])
        if pending.error is not None:
            error, pending.error = pending.error, None
            raise error
        assert pending.seqs is not None
        return pending.seqs

    def _commit_group(self, group: List[Pending]) -> None:
        """Commit `group` in one durable transaction (under the write lock) and settle each record."""
        lead: List[Any] = [[], []]  # the seqs the lead events took, and their bodies
        try:
            self._tell("taken", len(group))
            with self._inside():
                self._commit(group, lead)
        except BaseException as exc:
            self._settle(group, lead, exc)
            if not isinstance(exc, Exception) or all(p.seqs is not None for p in group):
                raise  # an interrupt, or a failure after the commit: the leader's caller's, the others settled
        finally:
            with self._cond:
                _resume(group)
                self._cond.notify_all()

    def _commit(self, group: List[Pending], lead_seqs: List[Any]) -> None:
        store = self.store
        events = [e for p in group for e in p.events]
        lead, lead_bodies = self._lead(events)
        bodies = lead_bodies + [b for p in group for b in p.bodies]
        items = [item for p in group for item in p.payloads]
        needed = sum(p.needed for p in group) + sum(len(b) for b in lead_bodies)
        lead_seqs[1] = lead_bodies

        def write_events(in_txn: Optional[Callable[[Any], None]]) -> None:
            def fn(txn: lmdb.Transaction[Any]) -> None:
                for p in group:
                    p.tentative = None
                if in_txn is not None:
                    in_txn(txn)
                seqs = self._project(txn, lead + events, bodies)
                lead_seqs[0] = seqs[: len(lead)]
                at = len(lead)
                for p in group:
                    p.tentative = seqs[at: at + len(p.events)]
                    at += len(p.events)

            # buffers: checking a stored duplicate payload hashes it in place instead of copying it.
            store.write(fn, needed=needed, buffers=True)
            for p in group:  # durable: the outcome is kept before anything else can happen
                p.seqs = p.tentative
            if lead:
                self._opened()
            self._tell("committed", len(group))

        self._payloads.commit(items, write_events)
        if self._after is not None:
            self._after()

    def _settle(self, group: List[Pending], lead_seqs: List[Any], exc: BaseException) -> None:
        """After a failed commit of `group`: which records did commit (found in the log), which did not."""
        open_ = [p for p in group if p.seqs is None]
        try:
            if lead_seqs[0] and self._committed(lead_seqs[0][0], lead_seqs[1][0]):
                self._opened()
            for p in open_:
                if p.tentative and self._committed(p.tentative[0], p.bodies[0]):
                    p.seqs = p.tentative
        except Exception:  # the log cannot be read (closed): what is not known committed is not acknowledged
            pass
        for p in open_:
            if p.seqs is not None:
                continue
            if len(group) == 1:
                p.error = exc
            else:
                p.alone = True

    def _committed(self, seq: int, body: bytes) -> bool:
        """Whether the log holds `body` at `seq`: what a commit that raised wrote (an event's bytes name its
        session and time: no other record's are the same)."""
        store = self.store
        with store.read() as txn:
            found = txn.get(seq_key(seq), db=store.db("events"))
        return found is not None and bytes(found) == bytes(body)

    def _tell(self, point: str, count: int) -> None:
        if self.observe is not None:
            self.observe(point, count)


def _resume(records: List[Pending]) -> None:
    """Wake the coroutines awaiting `records` (under the appender's `_cond`): one call into each of their loops."""
    by_loop: dict = {}
    for p in records:
        if p.future is not None:
            by_loop.setdefault(p.future.get_loop(), []).append(p.future)
            p.future = None  # resolved once; a caller that waits again makes a new one
    for loop, futures in by_loop.items():
        try:
            loop.call_soon_threadsafe(_set_all, futures)
        except RuntimeError:  # the loop is closed: nobody awaits these any more
            pass


def _set_all(futures: List["asyncio.Future[None]"]) -> None:
    for future in futures:
        if not future.done():  # a cancelled caller's future is done already
            future.set_result(None)


# The appender of each open journal handle (`own_appender`), for `appender_of`.
# Weak both ways: the journal holds its appender, whose methods hold the journal.
_APPENDERS: "weakref.WeakKeyDictionary[Any, weakref.ref[Appender]]" = weakref.WeakKeyDictionary()


def own_appender(journal: Any, appender: Appender) -> None:
    """Make `appender` (which `journal` holds) the write path of `journal` (its `Journal` does, as it opens)."""
    _APPENDERS[journal] = weakref.ref(appender)


def appender_of(journal: Any) -> Appender:
    """The write path of `journal`, with its store (`Appender.store`) and own payloads (`Appender.local`):
    the seam of the modules that work inside its transactions.

    Raises:
        JournalError: `journal` is not a `Journal`.
    """
    ref = _APPENDERS.get(journal)
    appender = ref() if ref is not None else None
    if appender is None:
        raise JournalError(f"{journal!r} is not a Journal; open one with stepjournal.Journal(path)")
    return appender

