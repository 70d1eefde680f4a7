"""Releasing payloads inside a write transaction: each release a `PayloadsReleased` event, committed
with the deletion of its bytes.

With the default payload store everything happens in one LMDB write transaction: the events are
appended, the payload bytes deleted (its payload files once the transaction commits), and the
projections updated (`lookup` stops serving the records); a crash leaves all of it or none. With
another store the events commit first and the objects are deleted after: a crash in between leaves
bytes that an event already released, which `verify` reports and the next prune deletes
(`RetentionPlan.leftover`).

`release_in` carries out a plan (`_prune.prune`'s, over the whole journal); `Retainer` is a journal
opened with ``retention=``: planned inside the transaction of each record, so retention costs no
extra commit.
"""

from __future__ import annotations

import time
from typing import Any, List, Optional, Sequence, Set, Tuple, Union

from ..events._convert import decode_event
from ..events._events import Event, GenerationRecorded, PayloadsReleased
from ..events._keys import seq_key, seq_of
from ..base._log import get_logger
from ..payloads._payload_store import LmdbPayloadStore, PayloadStore
from ..index._projections import Projections
from ._retention import Retention, RetentionError, RetentionPlan, RetentionState, group_of
from ..storage._store import Store

__all__ = ["Retainer", "Rules", "catch_up_in", "release_in"]

log = get_logger("stepjournal._journal")

Rules = Union[Retention, Sequence[Retention]]


def catch_up_in(txn: Any, store: Store, state: RetentionState, before: Optional[int] = None) -> None:
    """Fold every event after ``state.last_seq`` (and before seq `before`) into `state`, as `txn` sees the log."""
    cur = txn.cursor(db=store.db("events"))
    if not cur.set_range(seq_key(state.last_seq + 1)):
        return
    for key, body in cur:
        seq = seq_of(key)
        if before is not None and seq >= before:
            return
        state.apply(seq, decode_event(body, seq=seq))


def release_in(
    txn: Any, store: Store, payloads: PayloadStore, plan: RetentionPlan, *, ranks: bool
) -> Tuple[List[Tuple[int, Event]], List[bytes]]:
    """Append the plan's events and project them in `txn`; delete what the LMDB table holds.

    Returns:
        The appended ``(seq, event)`` pairs, and the digests that must be deleted once `txn` commits:
        a remote store's, or the journal's payload files.
    """
    now = time.time()
    events = [
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
        self._remote: List[bytes] = []
        self._warned: Set[str] = set()

    def in_txn(self, txn: Any, store: Store, seqs: Sequence[int], events: Sequence[Event]) -> None:
        """Plan and release inside the write transaction that just appended `events` as `seqs`."""
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
            appended, self._remote = release_in(txn, store, self._payloads, plan, ranks=True)
            for seq, event in appended:
                self._state.apply(seq, event)
        self._state.released.clear()  # deleted now (or after the commit): no longer left over

    def committed(self) -> None:
        """The transaction committed: the state is the log's; delete what a remote store still holds."""
        self._dirty = False
        remote, self._remote = self._remote, []
        for key in remote:
            self._payloads.delete(key)

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("retention_not_applied", reason=message,
                        hint="recording goes on; run `stepjournal prune` with rules that can be met")
