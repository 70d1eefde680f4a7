"""The audit: one typed record per generate call, and one summary per run, projected from the event log.

Nothing here reads or writes storage: `audit` and `summarize_runs` fold an iterable of ``(seq, event)``
pairs (``journal.events()``, or a `Journal` itself, whose filtered read is then used). So the audit
imports nothing of the journal beyond the events, and any event source can be audited.
`AuditRecord.to_json` is the row format of ``stepjournal audit --json`` and ``--csv``; its keys are
versioned by `AUDIT_SCHEMA_VERSION` and documented in docs/audit.md.
"""

from __future__ import annotations

from typing import Any, Container, Dict, Iterable, List, Optional, Tuple, Union

import attrs

from ._import_map import ImportMap
from ..events._events import (ACTIONS, AUDIT_SCHEMA_VERSION, CALL_ACTIONS, CALL_EVENT_TYPES, CallRefused, Event, EventsImported,
                      GenerationRecorded, PayloadsReleased, ReplayServed, SessionOpened, iso_time)
from ._runs_index import RunSummary

__all__ = [
    "AUDIT_FIELDS",
    "ACTIONS",
    "AuditRecord",
    "CALL_EVENT_TYPES",
    "AUDIT_EVENT_TYPES",
    "RELEASED",
    "call_records",
    "audit",
    "summarize_runs",
    "session_names",
]


# What the audit reads (`CALL_EVENT_TYPES` and `ACTIONS` are `_events`'s, re-exported here): every call, every release of a record's payloads by retention (action
# "released"), and the provenance of pulled events.
AUDIT_EVENT_TYPES: Tuple[type, ...] = CALL_EVENT_TYPES + (PayloadsReleased, EventsImported)
RELEASED = "released"
# `Journal` or ``journal.events()``: anything with an ``events(**filters)`` method, or (seq, event) pairs.
EventSource = Union[Any, Iterable[Tuple[int, Event]]]


def _pairs(source: EventSource, **filters: Any) -> Iterable[Tuple[int, Event]]:
    read = getattr(source, "events", None)
    if callable(read):
        return read(**filters)  # a journal filters while it reads (fewer events decoded into records)
    return source


def session_names(opened: Iterable[str]) -> Dict[str, str]:
    """Each session's short name, ``s1``, ``s2`` ...: its place among the sessions opened in the journal,
    in log order (`opened`: the session ids of its `SessionOpened` events, in order).

    A journal only appends, so a name never changes; every command that shows or takes a session
    uses it (a full id or a unique prefix of one is taken too).
    """
    return {session: f"s{n}" for n, session in enumerate(dict.fromkeys(opened), start=1)}


@attrs.frozen
class AuditRecord:
    """One generate call as the audit shows it.

    Attributes:
        seq: the call event's sequence number in the log.
        session: the session (process) that made the call.
        run: the run key.
        step, gen_index, mode: which call it was.
        action: ``"generated"``, ``"replayed"``, ``"bypassed"`` or ``"refused"``; ``"released"`` for
            a row that says retention released a record's payloads (its source_* fields name the
            record, its reason says why and under which rule; it is no call).
        stored: whether this call stored an output payload (only generated calls do).
        source_run, source_step, source_gen_index, source_seq: where a replay was served from (None
            unless replayed); `source_seq` is this journal's seq of that record, also for a pulled
            replay (None when the record itself was not pulled).
        policy, reason: which policy decided, and why.
        nbytes, stored_nbytes, digest: the output payload this call produced or was served (None
            when there is none).
        input_digest: what identifies the call's input, when known.
        ts: when the call was journaled (Unix time).
        duration_s: how long the call took.
        imported_from: where an imported record came from.
        stage: the call's stage (``"generate"``, ``"reward"`` ...).
        released_by: the seq of the `PayloadsReleased` that released this record's payloads (set by
            `audit`; None while the record is served).
        origin_journal, origin_seq: for a call pulled from another journal (`stepjournal pull`), that
            journal's id and the call's seq there.
    """

    seq: int
    session: str
    run: str
    step: int
    gen_index: int
    mode: str
    action: str
    stored: bool
    policy: str
    reason: str
    ts: float
    duration_s: Optional[float] = None
    nbytes: Optional[int] = None
    stored_nbytes: Optional[int] = None
    digest: Optional[str] = None
    input_digest: Optional[str] = None
    source_run: Optional[str] = None
    source_step: Optional[int] = None
    source_gen_index: Optional[int] = None
    source_seq: Optional[int] = None
    imported_from: Optional[str] = None
    stage: str = "generate"
    released_by: Optional[int] = None
    origin_journal: Optional[str] = None
    origin_seq: Optional[int] = None

    @classmethod
    def from_event(cls, seq: int, event: Any) -> "AuditRecord":
        """The record of one call event, or of a `PayloadsReleased` (any event but `SessionOpened`)."""
        if isinstance(event, PayloadsReleased):
            return cls(
                seq=seq, session="", run=event.run, step=event.step, gen_index=event.gen_index, mode=event.mode,
                action=RELEASED, stored=False, policy="retention", reason=f"{event.reason} (rule: {event.rule})",
                ts=event.ts, source_run=event.run, source_step=event.step, source_gen_index=event.gen_index,
                source_seq=event.record_seq,
            )
        action = CALL_ACTIONS[type(event)]
        common = dict(
            seq=seq,
            session=event.session,
            run=event.run,
            step=event.step,
            gen_index=event.gen_index,
            mode=event.mode,
            stage=event.stage,
            action=action,
            policy=event.policy,
            reason=event.reason,
            ts=event.ts,
            duration_s=getattr(event, "duration_s", None),
        )
        if isinstance(event, GenerationRecorded):
            out = event.output
            return cls(
                **common,
                stored=out is not None,
                nbytes=out.nbytes if out else None,
                stored_nbytes=out.stored_nbytes if out else None,
                digest=out.digest if out else None,
                input_digest=event.input_digest,
                imported_from=event.imported_from,
            )
        if isinstance(event, ReplayServed):
            return cls(
                **common,
                stored=False,
                nbytes=event.output.nbytes,
                stored_nbytes=event.output.stored_nbytes,
                digest=event.output.digest,
                input_digest=event.input_digest,
                source_run=event.source_run,
                source_step=event.source_step,
                source_gen_index=event.source_gen_index,
                source_seq=event.source_seq,
            )
        return cls(**common, stored=False)

    def to_json(self) -> Dict[str, Any]:
        """This record as a JSON object of schema `AUDIT_SCHEMA_VERSION` (keys in `AUDIT_FIELDS`)."""
        return {  # in `AUDIT_FIELDS` order (tests/unit/test_call_rows.py checks the keys)
            "schema_version": AUDIT_SCHEMA_VERSION, "seq": self.seq, "session": self.session, "run": self.run,
            "mode": self.mode, "stage": self.stage, "step": self.step, "gen_index": self.gen_index,
            "action": self.action, "stored": self.stored, "source_run": self.source_run,
            "source_step": self.source_step, "source_gen_index": self.source_gen_index,
            "source_seq": self.source_seq, "policy": self.policy, "reason": self.reason, "nbytes": self.nbytes,
            "stored_nbytes": self.stored_nbytes, "digest": self.digest, "input_digest": self.input_digest,
            "ts": self.ts, "time": iso_time(self.ts), "duration_s": self.duration_s,
            "imported_from": self.imported_from, "released_by": self.released_by,
            "origin_journal": self.origin_journal, "origin_seq": self.origin_seq,
        }


# The keys of a JSON audit row, in order (also the CSV columns).
AUDIT_FIELDS: Tuple[str, ...] = (
    "schema_version",
    "seq",
    "session",
    "run",
    "mode",
    "stage",
    "step",
    "gen_index",
    "action",
    "stored",
    "source_run",
    "source_step",
    "source_gen_index",
    "source_seq",
    "policy",
    "reason",
    "nbytes",
    "stored_nbytes",
    "digest",
    "input_digest",
    "ts",
    "time",
    "duration_s",
    "imported_from",
    "released_by",
    "origin_journal",
    "origin_seq",
)


def audit(
    source: EventSource,
    *,
    run: Optional[str] = None,
    steps: Optional[Container[int]] = None,
    mode: Optional[str] = None,
    actions: Optional[Container[str]] = None,
    stage: Optional[str] = None,
) -> List[AuditRecord]:
    """One `AuditRecord` per generate call, in log order.

    Args:
        source: ``(seq, event)`` pairs in log order, or an open journal (read-only is enough).
        run: only calls of this run key (None: every run).
        steps: only calls whose step is in this container (a set, range or `StepRanges`).
        mode: only calls of this mode (``"train"``, ``"validate"`` ...).
        actions: only these actions (``{"replayed"}`` ...).
        stage: only calls of this stage (``"generate"``, ``"reward"`` ...; None: every stage).

    Raises:
        EventDecodeError: an event cannot be decoded; run ``stepjournal verify`` to see what is broken.
    """
    records = []
    released: Dict[int, int] = {}
    for record in call_records(_pairs(source, types=AUDIT_EVENT_TYPES)):
        if record.action == RELEASED and record.source_seq is not None:
            released[record.source_seq] = record.seq
        if (run is not None and record.run != run) or (steps is not None and record.step not in steps):
            continue
        if (mode is not None and record.mode != mode) or (stage is not None and record.stage != stage):
            continue
        if actions is None or record.action in actions:
            records.append(record)
    if released:
        records = [attrs.evolve(r, released_by=released[r.seq]) if r.seq in released and r.action == "generated"
                   else r for r in records]
    return records


class Provenance:
    """Where pulled rows came from, folded from the `EventsImported` markers met in log order.

    A pulled event keeps its bytes, so a pulled replay or release names its record by the seq it had
    where it was recorded; a row says that journal and seq as ``origin_journal`` / ``origin_seq``,
    and its ``source_seq`` is this journal's seq of that record (None when it was not pulled).
    """

    def __init__(self, imports: Optional[ImportMap] = None) -> None:
        self._imports = imports if imports is not None else ImportMap()

    def marker(self, seq: int, event: EventsImported) -> None:
        """Fold the marker at `seq` (a map given at construction is folded into)."""
        self._imports.marker(seq, event)

    def __len__(self) -> int:
        """How many pulled blocks are folded in (none: every row is this journal's own)."""
        return len(self._imports)

    def of(self, seq: int, source_seq: Optional[int]) -> Optional[Tuple[str, int, Optional[int]]]:
        """(origin journal, origin seq, `source_seq` as this journal's seq) of the row at `seq`, or
        None for a row this journal recorded."""
        origin = self._imports.origin(seq)
        if origin is None:
            return None
        return origin[0], origin[1], self._imports.local(origin[0], source_seq) if source_seq is not None else None


def call_records(pairs: Iterable[Tuple[int, Event]]) -> Iterable[AuditRecord]:
    """An `AuditRecord` per call event and per `PayloadsReleased` of `pairs` (log order), with the
    provenance of pulled calls.

    An `EventsImported` says which source seqs the events right after it carry; read with it (types
    `AUDIT_EVENT_TYPES`), each pulled call's record names its origin journal and seq (`Provenance`).
    """
    provenance = Provenance()
    for seq, event in pairs:
        if isinstance(event, EventsImported):
            provenance.marker(seq, event)
            continue
        if type(event) not in CALL_ACTIONS and not isinstance(event, PayloadsReleased):
            continue
        record = AuditRecord.from_event(seq, event)
        found = provenance.of(seq, record.source_seq)
        if found is not None:
            record = attrs.evolve(record, origin_journal=found[0], origin_seq=found[1], source_seq=found[2])
        yield record


def summarize_runs(source: EventSource) -> List[RunSummary]:
    """One `RunSummary` per run key, in order of each run's first event.

    Args:
        source: ``(seq, event)`` pairs in log order, or an open journal (whose runs index answers:
            `Journal.run_summaries`).

    Raises:
        EventDecodeError: an event cannot be decoded; run ``stepjournal verify`` to see what is broken.
    """
    indexed = getattr(source, "run_summaries", None)
    if callable(indexed):
        return indexed()
    acc: Dict[str, Dict[str, Any]] = {}
    for seq, event in _pairs(source):
        if isinstance(event, EventsImported):
            continue  # provenance, not a call of any run
        entry = acc.setdefault(
            event.run,
            {"sessions": [], "counts": dict.fromkeys(ACTIONS, 0), "modes": {}, "stages": {}, "steps": [], "bytes": 0},
        )
        if isinstance(event, SessionOpened):
            entry["sessions"].append((seq, event))
            continue
        if isinstance(event, PayloadsReleased):
            continue  # no call
        entry["counts"][CALL_ACTIONS[type(event)]] += 1
        entry["modes"][event.mode] = entry["modes"].get(event.mode, 0) + 1
        entry["stages"][event.stage] = entry["stages"].get(event.stage, 0) + 1
        if not isinstance(event, CallRefused):
            # A refused call (a replay miss at step 9 of a run recorded through step 4) did not
            # happen at its step: it stays in the counts, not in the step span.
            entry["steps"].append(event.step)
        if isinstance(event, GenerationRecorded) and event.output is not None:
            entry["bytes"] += event.output.nbytes
    return [
        RunSummary(
            run=run,
            sessions=tuple(entry["sessions"]),
            counts=entry["counts"],
            modes=entry["modes"],
            first_step=min(entry["steps"]) if entry["steps"] else None,
            last_step=max(entry["steps"]) if entry["steps"] else None,
            stored_bytes=entry["bytes"],
            stages=entry["stages"],
        )
        for run, entry in acc.items()
    ]
