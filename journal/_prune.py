"""Carrying out retention: each release is a `PayloadsReleased` event, committed with the deletion.

With the default payload store everything happens in one LMDB write transaction: the events are
appended, the payload bytes deleted, and the projections updated (`lookup` stops serving the
records); a crash leaves all of it or none. With another store the events commit first and the
objects are deleted after: a crash in between leaves bytes that an event already released, which
`verify` reports and the next prune deletes (`RetentionPlan.leftover`).

Two ways in: `prune` (the CLI's and Python's, one plan over the whole journal) and `Retainer` (a
journal opened with ``retention=``: planned inside the transaction of each record, so retention
costs no extra commit).
"""

from __future__ import annotations

import time
from typing import Any, List, Optional, Sequence, Set, Tuple, Union

import attrs

from ._convert import decode_event
from ._events import Event, GenerationRecorded, PayloadsReleased
from ._keys import seq_key, seq_of
from ._log import get_logger
from ._payload_store import LmdbPayloadStore, PayloadStore
from ._projections import Projections
from ._retention import Retention, RetentionConflictError, RetentionError, RetentionPlan, RetentionState, group_of
from ._store import Store

__all__ = ["prune", "find_release", "Retainer", "catch_up_in"]

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


def _release_in(
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


def _stored(txn: Any, payloads: PayloadStore, digest: str) -> bool:
    if isinstance(payloads, LmdbPayloadStore):
        return payloads.has_in(txn, bytes.fromhex(digest))
    return payloads.has(bytes.fromhex(digest))


def prune(journal: Any, rules: Optional[Rules], *, dry_run: bool = False) -> RetentionPlan:
    """Apply retention `rules` to a journal opened for writing; return the plan (carried out unless `dry_run`).

    One write transaction reads the log, plans and releases, so a record another process commits
    meanwhile is either planned with or recorded after. With `rules` None nothing new is released:
    only the bytes earlier releases named that no live record uses are deleted (what an interrupted
    prune with an object store left behind, `RetentionPlan.leftover`).

    Raises:
        RetentionError: a rule would release every step of a group (see `Retention.allow_release_all`).
        RetentionConflictError: two rule sets select one group, or the steps that must stay exceed
            ``max_bytes``; nothing was changed.
    """
    store = journal.lmdb_store()
    payloads = journal.payload_store

    def plan_in(txn: Any) -> RetentionPlan:
        state = RetentionState()
        catch_up_in(txn, store, state)
        plan = state.plan(rules) if rules is not None else state.leftover_plan()
        if plan.warnings:
            raise RetentionConflictError("; ".join(plan.warnings))
        # Only what is really still stored is left over (a release deletes in its own transaction).
        return attrs.evolve(plan, leftover=tuple(d for d in plan.leftover if _stored(txn, payloads, d)))

    if dry_run:
        with store.read() as txn:
            return plan_in(txn)
    remote: List[bytes] = []

    def fn(txn: Any) -> RetentionPlan:
        plan = plan_in(txn)
        if not plan.empty:
            _, keys = _release_in(txn, store, payloads, plan, ranks=False)
            remote[:] = keys
        return plan

    with journal.write_lock:
        plan = store.write(fn)
    for key in remote:
        payloads.delete(key)
    log.info("payloads_pruned", path=journal.path, records=len(plan.releases), bytes=plan.released_bytes,
             leftover=len(plan.leftover), rule=plan.rule)
    return plan


def find_release(
    journal: Any, step: int, gen_index: int = 0, *, mode: str = "train", run: Optional[str] = None,
    stage: str = "generate",
) -> Optional[Tuple[int, PayloadsReleased]]:
    """The release of the call's record when it is what `lookup` no longer serves, else None.

    Reads the log (a replay refusal's cost, not a decision's): the latest `PayloadsReleased` of the
    call, unless the call was recorded again after it.
    """
    run = run or journal.run
    found: Optional[Tuple[int, PayloadsReleased]] = None
    for seq, event in journal.events(run=run, steps={step}, types=[PayloadsReleased, GenerationRecorded]):
        if (event.mode, event.gen_index, event.stage) != (mode, gen_index, stage):
            continue
        if isinstance(event, PayloadsReleased):
            found = (seq, event)
        elif event.output is not None and found is not None and seq > found[0]:
            found = None
    if found is not None:
        found = (found[0], journal.as_read_here(*found))  # a pulled release names its record by the seq here
    return found


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
            appended, self._remote = _release_in(txn, store, self._payloads, plan, ranks=True)
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
