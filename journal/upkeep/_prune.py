"""`prune`: retention over the whole journal in one write transaction (the CLI's and Python's), and
`find_release`, the release that took a call's record.

The plan is carried out by `_release.release_in`, as a journal opened with ``retention=`` carries out
its own (`_release.Retainer`).
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import attrs
import lmdb

from ..events._events import GenerationRecorded, PayloadsReleased
from ..base._log import get_logger
from ..payloads._payload_store import LmdbPayloadStore, PayloadStore
from ..storage._appender import appender_of
from ._release import Rules, catch_up_in, delete_released, release_in
from ._retention import RetentionConflictError, RetentionPlan, RetentionState

__all__ = ["prune", "find_release"]

log = get_logger("stepjournal._journal")


def _stored(txn: lmdb.Transaction[Any], payloads: PayloadStore, digest: str) -> bool:
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
    appender = appender_of(journal)
    store, payloads = appender.store, journal.payload_store

    def plan_in(txn: lmdb.Transaction[Any]) -> Tuple[RetentionPlan, int]:
        """The plan, and the seq of the last event it read."""
        state = RetentionState()
        catch_up_in(txn, store, state)
        plan = state.plan(rules) if rules is not None else state.leftover_plan()
        if plan.warnings:
            raise RetentionConflictError("; ".join(plan.warnings))
        # Only what is really still stored is left over (a release deletes in its own transaction).
        return attrs.evolve(plan, leftover=tuple(d for d in plan.leftover if _stored(txn, payloads, d))), state.last_seq

    if dry_run:
        with store.read() as txn:
            return plan_in(txn)[0]
    released: List[bytes] = []
    after = [0]  # the seq of the transaction's last event: files named after it stay

    def fn(txn: lmdb.Transaction[Any]) -> RetentionPlan:
        plan, after[0] = plan_in(txn)
        released[:] = []
        if not plan.empty:
            appended, released[:] = release_in(txn, store, payloads, plan, ranks=False)
            after[0] = appended[-1][0] if appended else after[0]
        return plan

    plan = appender.write(fn, after=lambda: delete_released(store, payloads, released, after[0]))
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
