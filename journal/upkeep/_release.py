"""Releasing payloads inside a write transaction: each release a `PayloadsReleased` event, committed
with the deletion of its bytes.

With the default payload store everything happens in one LMDB write transaction: the events are
appended, the payload bytes deleted (its payload files once the transaction commits), and the
projections updated (`lookup` stops serving the records); a crash leaves all of it or none.

A payload file is content-addressed: a record of another process can name a released digest anew
(its file placed before its event commits). So the files are deleted by `delete_released`, inside a
write transaction of their own, which deletes only those no event committed since the release names;
a writer checks, inside its own write transaction, that its files are there and places any that is
not again (`LmdbPayloadStore.commit`). LMDB lets one write transaction run at a time, in every
process: a deletion and a record's check-and-commit never overlap. An `ObjectPayloadStore`'s objects
are deleted and checked the same way (`ObjectPayloadStore.delete_in`, `.commit`). With
another store the events commit first and the objects are deleted after: a crash in between leaves
bytes that an event already released, which `verify` reports and the next prune deletes
(`RetentionPlan.leftover`).

`release_in` carries out a plan (`_prune.prune`'s, over the whole journal); `Retainer` is a journal
opened with ``retention=``: planned inside the transaction of each record, so retention costs no
extra commit.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Set, Tuple, Union

import lmdb

from ..events._convert import decode_event
from ..base._errors import StepJournalError
from ..events._events import Event, GenerationRecorded, PayloadsReleased, call_refs
from ..events._keys import seq_key, seq_of
from ..base._log import get_logger
from ..payloads._object_store import ObjectPayloadStore
from ..payloads._payload_store import LmdbPayloadStore, PayloadStore
from ..index._projections import Projections
from ._retention import Retention, RetentionError, RetentionPlan, RetentionState, group_of
from ..storage._store import Store

__all__ = ["Retainer", "Rules", "catch_up_in", "delete_released", "release_in"]

log = get_logger("stepjournal._journal")

Rules = Union[Retention, Sequence[Retention]]


def catch_up_in(txn: lmdb.Transaction[Any], store: Store, state: RetentionState, before: Optional[int] = None) -> None:
    """Fold every event after ``state.last_seq`` (and before seq `before`) into `state`, as `txn` sees the log."""
    for seq, body in _bodies_after(txn, store, state.last_seq):
        if before is not None and seq >= before:
            return
        state.apply(seq, decode_event(body, seq=seq))


def release_in(
    txn: lmdb.Transaction[Any], store: Store, payloads: PayloadStore, plan: RetentionPlan, *, ranks: bool
) -> Tuple[List[Tuple[int, Event]], List[bytes]]:
    """Append the plan's events and project them in `txn`; delete what the LMDB table holds.

    Returns:
        The appended ``(seq, event)`` pairs, and the digests that must be deleted once `txn` commits:
        a remote store's, or the journal's payload files.
    """
    now = time.time()
    events: List[Event] = [
        PayloadsReleased(
            run=r.run, step=r.step, gen_index=r.gen_index, mode=r.mode, stage=r.stage, record_seq=r.record_seq,
            released=list(r.released), retained=list(r.retained), rule=plan.rule, reason=r.reason, ts=now,
        )
        for r in plan.releases
    ]
    appended = Projections.append_and_project_in(txn, store, events, ranks=ranks)
    if not ranks:
        Projections.build_ranks_in(txn, store)
    keys = [bytes.fromhex(d) for r in plan.releases for d in r.released] + [bytes.fromhex(d) for d in plan.leftover]
    if isinstance(payloads, LmdbPayloadStore):
        keys = payloads.delete_in(txn, keys)  # its payload files are deleted once the transaction commits
    return appended, keys


def delete_released(store: Store, payloads: PayloadStore, keys: Sequence[bytes], after: int) -> None:
    """Delete the released `keys` once their release committed, with seq `after` its last event.

    The journal's payload files, and an `ObjectPayloadStore`'s objects, go inside a write transaction
    that first reads the events committed after `after`: a digest one of them names (a record of another
    process stored the same bytes meanwhile) stays. A store of the user's deletes as it is.
    """
    if not keys:
        return
    delete_in: Callable[[Any, Sequence[bytes]], None]
    if isinstance(payloads, LmdbPayloadStore):
        files = payloads.files
        if files is None:  # no payload files: its LMDB table's keys went with the release (`release_in`)
            return

        def delete_files(txn: lmdb.Transaction[Any], gone: Sequence[bytes]) -> None:
            for key in gone:
                files.delete(key)

        delete_in = delete_files
    elif isinstance(payloads, ObjectPayloadStore):
        delete_in = payloads.delete_in
    else:
        for key in keys:
            payloads.delete(key)
        return

    def fn(txn: lmdb.Transaction[Any]) -> None:  # it holds LMDB's writer lock while it deletes
        named: Set[str] = set()
        for seq, body in _bodies_after(txn, store, after):
            try:
                named.update(ref.digest for ref in call_refs(decode_event(body, seq=seq)))
            except StepJournalError:  # it may name any of them: they stay, left over for a later prune
                log.warning("released_files_kept", seq=seq, reason="an event cannot be read; run `stepjournal verify`")
                return
        delete_in(txn, [key for key in keys if key.hex() not in named])

    store.write(fn)


def _bodies_after(txn: lmdb.Transaction[Any], store: Store, after: int) -> Iterator[Tuple[int, Any]]:
    """(seq, stored bytes) of each event after seq `after`, as `txn` sees the log."""
    cur = txn.cursor(db=store.db("events"))
    if cur.set_range(seq_key(after + 1)):
        for key, body in cur:
            yield seq_of(key), body


class Retainer:
    """Retention applied inside each record's write transaction (``Journal(..., retention=...)``).

    It keeps a `RetentionState` caught up from the log (other processes' events included), plans
    for the groups the transaction recorded into, and releases in the same transaction. A rule that
    cannot be met while recording (it would release everything, pins over the byte cap) is logged
    once and skipped: a training run is never stopped by retention.
    """

    def __init__(self, rules: Rules, payloads: PayloadStore) -> None:
        RetentionState().plan(rules, groups=())  # refuse malformed rules when the journal opens
        self.rules = rules
        self._payloads = payloads
        self._state: Optional[RetentionState] = None
        self._dirty = False  # a transaction folded into the state and has not committed yet
        self._released: List[bytes] = []  # deleted once the transaction commits (`delete_released`)
        self._after = 0  # the seq of the transaction's last release
        self._store: Optional[Store] = None
        self._warned: Set[str] = set()

    def in_txn(self, txn: lmdb.Transaction[Any], store: Store, seqs: Sequence[int], events: Sequence[Event]) -> None:
        """Plan and release inside the write transaction that just appended `events` as `seqs`."""
        self._released = []  # a transaction that did not commit released nothing
        groups = {group_of(e) for e in events
                  if isinstance(e, GenerationRecorded) and (e.output is not None or e.input is not None)}
        if not groups:
            return
        if self._state is None or self._dirty:
            self._state = RetentionState()  # an aborted transaction's folds are not the log's
        self._dirty = True
        catch_up_in(txn, store, self._state, before=seqs[0])  # what other processes appended
        for seq, event in zip(seqs, events):  # and these, without decoding them again
            self._state.apply(seq, event)
        try:
            plan = self._state.plan(self.rules, groups=groups)
        except RetentionError as exc:
            self._warn(str(exc))
            return
        for warning in plan.warnings:
            self._warn(warning)
        if not plan.empty:
            appended, self._released = release_in(txn, store, self._payloads, plan, ranks=True)
            self._after, self._store = (appended[-1][0] if appended else seqs[-1]), store
            for seq, event in appended:
                self._state.apply(seq, event)
        self._state.released.clear()  # deleted now (or after the commit): no longer left over

    def committed(self) -> None:
        """The transaction committed: the state is the log's; delete the files (or a remote store's objects)
        it released."""
        self._dirty = False
        released, self._released = self._released, []
        if released and self._store is not None:
            delete_released(self._store, self._payloads, released, self._after)

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("retention_not_applied", reason=message,
                        hint="recording goes on; run `stepjournal prune` with rules that can be met")
