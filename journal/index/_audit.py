"""The audit: one typed record per generate call, and one summary per run, projected from the event log.

Nothing here reads or writes storage: `audit` and `summarize_runs` fold an iterable of ``(seq, event)``
pairs (``journal.events()``, or a `Journal` itself, whose filtered read is then used). So the audit
imports nothing of the journal beyond the events, and any event source can be audited.
`AuditRecord.to_json` is the row format of ``stepjournal audit --json`` and ``--csv``; its keys are
versioned by `AUDIT_SCHEMA_VERSION` and documented in docs/audit.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Container, Dict, Iterable, List, Optional, Tuple, Union

import attrs

from ._import_map import ImportMap
from ..events._events import (ACTIONS, AUDIT_SCHEMA_VERSION, CALL_ACTIONS, CALL_EVENT_TYPES, CallRefused, Event,
                              EventsImported, GenerationRecorded, PayloadRef, PayloadsReleased, SessionOpened, iso_time)
from ..events._schema import fields_of
from ..events._words import Action
from ._runs_index import RunSummary

__all__ = [
    "AUDIT_FIELDS",
    "ACTIONS",
    "AuditRecord",
    "CALL_COLUMNS",
    "Column",
    "ROW_COLUMNS",
    "CALL_EVENT_TYPES",
    "AUDIT_EVENT_TYPES",
    "RELEASED",
    "call_records",
    "audit",
    "summarize_runs",
    "session_names",
]


# What the audit reads (`CALL_EVENT_TYPES` and `ACTIONS` are `_events`'s, re-exported here): every call, every
# release of a record's payloads by retention (action "released"), and the provenance of pulled events.
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


# The audit row's own columns (every other column is a call field's, declared in its event class):
# the row's schema version, the event's seq, the call's action, whether it stored an output, the clock
# text of its ``ts``, the release of its payloads and where a pulled call came from.
ROW_COLUMNS: Dict[str, Any] = {
    "schema_version": int, "seq": int, "action": str, "stored": bool, "time": Optional[str],
    "released_by": Optional[int], "origin_journal": Optional[str], "origin_seq": Optional[int],
}
# The order of the row's keys (a published layout: docs/audit.md). A call field's column not placed here
# comes after these, in the order the event classes declare them (adding keys keeps the schema version).
_ORDER = ("schema_version", "seq", "session", "run", "mode", "stage", "step", "gen_index", "action", "stored",
          "source_run", "source_step", "source_gen_index", "source_seq", "policy", "reason", "nbytes",
          "stored_nbytes", "digest", "input_digest", "ts", "time", "duration_s", "imported_from", "released_by",
          "origin_journal", "origin_seq")


@attrs.frozen
class Column:
    """An audit column a call event's field fills.

    Attributes:
        name: the column (its key in the JSON row).
        field: the event's field.
        part: for a payload, which of its fields (``"nbytes"``); None: the field's value itself.
        default: the value of a stored map that lacks the field (`attrs.NOTHING`: it never does).
        kind: what the value holds (`_schema.Kind`).
        hint: the column's type (of the field, or of the payload's part).
    """

    name: str
    field: str
    part: Optional[str]
    default: Any
    kind: Any
    hint: Any


def _columns_of(cls: type) -> Tuple[Column, ...]:
    ref_fields = {f.name: f for f in fields_of(PayloadRef)}
    columns = []
    for field in fields_of(cls):
        for name, part in field.audit:
            if part is None:
                columns.append(Column(name, field.name, None, field.default, field.kind, field.hint))
            else:
                of = ref_fields[part]
                columns.append(Column(name, field.name, part, field.default, of.kind, of.hint))
    return tuple(columns)


# Per call event class, the columns its fields fill; a column a class has no field for is None in its rows.
CALL_COLUMNS: Dict[type, Tuple[Column, ...]] = {cls: _columns_of(cls) for cls in CALL_EVENT_TYPES}


def _audit_fields() -> Tuple[str, ...]:
    named = dict.fromkeys(column.name for columns in CALL_COLUMNS.values() for column in columns)
    unknown = [name for name in _ORDER if name not in named and name not in ROW_COLUMNS]
    if unknown:  # a field left its class: drop its column here too, and bump AUDIT_SCHEMA_VERSION
        raise TypeError(f"audit columns {unknown} are placed in _audit._ORDER but no call event field fills them")
    return _ORDER + tuple(name for name in named if name not in _ORDER)


# The keys of a JSON audit row, in order (also the CSV columns).
AUDIT_FIELDS: Tuple[str, ...] = _audit_fields()


def _record_field(name: str) -> Any:
    """`AuditRecord`'s field for column `name`: required when every call event holds it, else None by default."""
    if name in ROW_COLUMNS:
        kind = ROW_COLUMNS[name]
        return attrs.field(type=kind) if name in ("seq", "action", "stored") else attrs.field(type=kind, default=None)
    found = [column for columns in CALL_COLUMNS.values() for column in columns if column.name == name]
    hint = found[0].hint
    if len(found) == len(CALL_COLUMNS) and all(c.part is None and c.default is attrs.NOTHING for c in found):
        return attrs.field(type=hint)
    defaults = {repr(c.default) for c in found}
    if len(found) == len(CALL_COLUMNS) and len(defaults) == 1 and found[0].default is not attrs.NOTHING:
        return attrs.field(type=hint, default=found[0].default)
    # attrs takes any annotation as `type` (it only stores it); its stub declares a class.
    return attrs.field(type=Optional[hint], default=None)  # type: ignore[call-overload]


def _from_event(cls: Any, seq: int, event: Any) -> Any:
    """The record of one call event, or of a `PayloadsReleased` (any event but `SessionOpened`)."""
    if isinstance(event, PayloadsReleased):
        return cls(
            seq=seq, session="", run=event.run, step=event.step, gen_index=event.gen_index, mode=event.mode,
            action=RELEASED, stored=False, policy="retention", reason=f"{event.reason} (rule: {event.rule})",
            ts=event.ts, source_run=event.run, source_step=event.step, source_gen_index=event.gen_index,
            source_seq=event.record_seq,
        )
    event_type = type(event)
    values: Dict[str, Any] = {"seq": seq, "action": CALL_ACTIONS[event_type],
                              # only a recorded call stores its output
                              "stored": event_type is GenerationRecorded and event.output is not None}
    for column in CALL_COLUMNS[event_type]:
        value = getattr(event, column.field)
        values[column.name] = value if column.part is None or value is None else getattr(value, column.part)
    return cls(**values)


def _to_json(self: Any) -> Dict[str, Any]:
    """This record as a JSON object of schema `AUDIT_SCHEMA_VERSION` (keys in `AUDIT_FIELDS` order)."""
    row = {name: getattr(self, name, None) for name in AUDIT_FIELDS}
    row["schema_version"], row["time"] = AUDIT_SCHEMA_VERSION, iso_time(self.ts)
    return row


_RECORD_DOC = """One call as the audit shows it (a `PayloadsReleased` too, as a row of action ``"released"``).

    Its fields are the audit row's keys (`AUDIT_FIELDS`) but ``schema_version`` and ``time``, derived from
    the call event classes (each field declared there with its audit column) and the row's own columns.

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


def _record_class() -> Any:
    names = [name for name in AUDIT_FIELDS if name not in ("schema_version", "time")]
    fields = {name: _record_field(name) for name in names}
    ordered = {name: f for name, f in fields.items() if f._default is attrs.NOTHING}  # required ones first
    ordered.update((name, f) for name, f in fields.items() if f._default is not attrs.NOTHING)
    return attrs.make_class("AuditRecord", ordered, frozen=True, slots=True, class_body={
        "__doc__": _RECORD_DOC, "__module__": __name__, "from_event": classmethod(_from_event), "to_json": _to_json})


# Built from the call event classes' fields at import; a type checker sees it as Any.
if TYPE_CHECKING:
    AuditRecord = Any
else:
    AuditRecord = _record_class()


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
        records = [attrs.evolve(r, released_by=released[r.seq]) if r.seq in released and r.action == Action.GENERATED
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
