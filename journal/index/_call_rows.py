"""The checked call-row decoder: a call event's audit row straight from its stored bytes, for
``stepjournal audit --json`` / ``--csv`` at scale, `verify` and `reindex`.

`json_rows` yields what ``AuditRecord.from_event(seq, decode_event(raw)).to_json()`` would, row for
row (with `call_records`' provenance and the filters of ``stepjournal audit``), without building an
event or a record per call: a call event whose checksum holds (`checked_body`) is checked against
its class's rules here (exact types, the validators' ranges; the run / mode / stage key rule once
per distinct value) and turned into its row from the map. Anything else, and any value these checks
do not pass, takes the event path (`decode_event`), which builds the same row or raises the same
error, so the output is the event path's (`tests/unit/test_call_rows.py` compares them byte for byte).
"""

from __future__ import annotations

from typing import Any, Container, Dict, FrozenSet, Iterable, Iterator, Optional, Tuple

from ._audit import AUDIT_EVENT_TYPES, AUDIT_FIELDS, CALL_COLUMNS, RELEASED, AuditRecord, Provenance
from ..events._convert import checked_body, event_of
from ..base._errors import InvalidKeyError
from ..events._events import AUDIT_SCHEMA_VERSION, CALL_ACTIONS, EventsImported, GenerationRecorded, iso_time
from ..events._keys import check_key
from ..events._schema import BAD, fields_of
from ..events._words import Action

__all__ = ["json_rows", "call_row", "checked_row", "KeyRuleCache", "MARKER_TAG", "releases_of"]

# Per call class: its fields as the map reader checks them ((name, check, optional, default) each), the
# keys its map may and must hold, and its run keys checked alone (a replay's source run); all derived
# from the class's declared fields (`_schema.fields_of`).
_Plan = Tuple[Tuple[Tuple[str, Any, bool, Any], ...], FrozenSet[str], FrozenSet[str], Tuple[str, ...]]


def _plan_of(cls: type) -> _Plan:
    fields = fields_of(cls)
    return (tuple((f.name, f.kind.check, f.optional, f.default) for f in fields),
            frozenset(f.name for f in fields), frozenset(f.name for f in fields if f.required),
            tuple(f.name for f in fields if f.kind.key == "lone_run"))


_PLANS: Dict[type, _Plan] = {cls: _plan_of(cls) for cls in CALL_ACTIONS}


class KeyRuleCache:
    """The run / mode / stage rule (`check_key` as the events' validators apply it), once per distinct value."""

    def __init__(self) -> None:
        self.passed: set = set()  # the keys `ok` passed (a reader may test membership before calling it)

    def ok(self, *key: str) -> bool:
        """`run` alone (a source run: its validator's rule), or (run, mode, stage): all three validators' rules."""
        if key in self.passed:
            return True
        try:
            check_key(key[0], "train")
            if len(key) == 3:
                check_key(key[0], key[1])
                check_key(*key)
        except InvalidKeyError:
            return False
        if len(self.passed) > 65536:  # hostile variety: keep memory bounded
            self.passed.clear()
        self.passed.add(key)
        return True


def call_row(seq: int, cls: type, body: Dict[str, Any], keys: KeyRuleCache, *,
             timed: bool = True) -> Optional[Dict[str, Any]]:
    """The JSON row of a call event's map when every field passes its class's rules, else None
    (`timed`: with its ``time``; without, None there, for a reader that needs no clock text)."""
    plan = _PLANS.get(cls)
    if plan is None:
        return None
    fields, allowed, required, lone_runs = plan
    if not required <= body.keys() or not body.keys() <= allowed:
        return None
    values: Dict[str, Any] = {}
    for name, check, optional, default in fields:
        value = body.get(name, default)
        if value is None and optional:
            values[name] = None
            continue
        value = check(value)
        if value is BAD:
            return None
        values[name] = value
    if not keys.ok(values["run"], values["mode"], values["stage"]):
        return None
    for name in lone_runs:
        if not keys.ok(values[name]):
            return None
    row = dict.fromkeys(AUDIT_FIELDS)
    for column in CALL_COLUMNS[cls]:
        value = values[column.field]
        row[column.name] = value if column.part is None or value is None else value[column.part]
    ts = values["ts"]
    row["schema_version"], row["seq"], row["action"] = AUDIT_SCHEMA_VERSION, seq, CALL_ACTIONS[cls]
    row["stored"] = cls is GenerationRecorded and values["output"] is not None  # only a recorded call stores
    row["time"] = iso_time(ts) if timed else None
    return row


def _native() -> Any:
    """`_native_rows` (msgspec), imported by the first reader that decodes natively, not at import."""
    global _NATIVE
    if _NATIVE is None:
        from . import _native_rows

        _NATIVE = _native_rows
    return _NATIVE


_NATIVE: Any = None


def checked_row(seq: int, raw: bytes, keys: KeyRuleCache) -> Tuple[Any, Optional[tuple]]:
    """(row, checked map) of the event stored as `raw`: a call's row decoded natively (`_native_rows.row_of`,
    a `Row`) or from its checked map (`call_row`, a dict), else None and the map `checked_body` found, for
    `event_of` to decode without unpacking again (the map is None when the native decode answered)."""
    row = _native().row_of(seq, raw, keys)
    if row is not None:
        return row, None
    found = checked_body(raw)
    return (call_row(seq, found[0], found[1], keys) if found is not None else None), found


def json_rows(
    raw_pairs: Iterable[Tuple[int, bytes]],
    *,
    run: Optional[str] = None,
    steps: Optional[Container[int]] = None,
    mode: Optional[str] = None,
    actions: Optional[Container[str]] = None,
    stage: Optional[str] = None,
    timed: bool = True,
    native: bool = False,
    plain: bool = False,
    released_by: Optional[Dict[int, int]] = None,
) -> Iterator[Any]:
    """The ``audit --json`` rows (``AuditRecord.to_json()``, keys `AUDIT_FIELDS`) of ``(seq, stored bytes)``
    pairs in log order, filtered as `audit` filters (`actions`: empty or None keeps every action).
    Without `timed`, a call row's ``time`` (the clock text) may be None: for a reader that never shows it.
    With `native`, a call event msgspec decodes exactly comes as a `_native_rows.Row` (``row[key]`` as for
    a dict; `_native_rows.encode_rows` writes it): the same row, decoded in C; with `plain` too, as the
    dict row, for a reader that computes with the fields rather than writing JSON. `released_by`
    (`releases_of` of the same log) fills each released record's ``released_by``, as `audit` does; the
    rows stream, so the releases, which come after their records, are read first.

    Raises:
        EventDecodeError: an event cannot be decoded; run ``stepjournal verify`` to see what is broken.
    """
    keys = KeyRuleCache()
    provenance = Provenance()
    pulled = False
    row_of = _native().row_of if native else None
    for seq, raw in raw_pairs:
        row = row_of(seq, raw, keys, timed=timed, plain=plain) if row_of is not None else None
        if row is None:
            found = checked_body(raw)
            row = call_row(seq, found[0], found[1], keys, timed=timed) if found is not None else None
            if row is None:
                event = event_of(raw, found, seq=seq)  # the event path: the same row, or the error
                if isinstance(event, EventsImported):
                    provenance.marker(seq, event)
                    pulled = True
                    continue
                if not isinstance(event, AUDIT_EVENT_TYPES):
                    continue
                row = AuditRecord.from_event(seq, event).to_json()
        origin = provenance.of(seq, row["source_seq"]) if pulled else None
        if origin is not None:
            row["origin_journal"], row["origin_seq"], row["source_seq"] = origin
        if (run is not None and row["run"] != run) or (steps is not None and row["step"] not in steps):
            continue
        if (mode is not None and row["mode"] != mode) or (stage is not None and row["stage"] != stage):
            continue
        if released_by and row["action"] == Action.GENERATED and row["seq"] in released_by:
            row["released_by"] = released_by[row["seq"]]
        if not actions or row["action"] in actions:
            yield row


# What a release or an import marker holds in its stored bytes (the type tag): a byte search for
# these picks a superset of those events, and only the picked ones are decoded.
MARKER_TAG = b"events_imported"  # an import marker's type tag, in its stored bytes
_RELEASE_TAGS = (b"payloads_released", MARKER_TAG)


def releases_of(raw_pairs: Iterable[Tuple[int, bytes]]) -> Dict[int, int]:
    """Record seq -> seq of the latest `PayloadsReleased` of its payloads (what `audit` sets as
    ``released_by``), from ``(seq, stored bytes)`` pairs in log order. Pulled releases name their record
    by its seq here. Only the events whose bytes hold a release's or an import marker's tag are decoded."""
    picked = ((seq, raw) for seq, raw in raw_pairs if any(tag in raw for tag in _RELEASE_TAGS))
    return {row["source_seq"]: row["seq"] for row in json_rows(picked, actions={RELEASED}, timed=False)
            if row["source_seq"] is not None}

