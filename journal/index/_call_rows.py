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

import math
from typing import Any, Container, Dict, Iterable, Iterator, Optional, Tuple

from ._audit import AUDIT_EVENT_TYPES, RELEASED, AuditRecord, Provenance
from ..events._convert import checked_body, event_of
from ..base._errors import InvalidKeyError
from ..events._events import (AUDIT_SCHEMA_VERSION, CALL_ACTIONS, MAX_TS, CallRefused, EventsImported, GenerationRecorded, PayloadRef,
                      ReplayServed, iso_time,
                      field_names)
from ..events._keys import DEFAULT_STAGE, MAX_GEN_INDEX, MAX_STEP, check_key

__all__ = ["json_rows", "call_row", "checked_row", "KeyRuleCache", "MARKER_TAG", "releases_of"]

_MAX_U64 = (1 << 64) - 1
_MAX_NBYTES = (1 << 63) - 1
_HEX = frozenset("0123456789abcdefABCDEF")
# Per call class: the fields it has, those without a default (the attrs classes' own lists).
_CLASS_FIELDS = {cls: field_names(cls) for cls in CALL_ACTIONS}
_REF_FIELDS, _REF_REQUIRED = field_names(PayloadRef)


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


def _int(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _number(value: Any) -> Optional[float]:
    """`value` as the float a ``0 .. MAX_TS`` field holds (an int becomes a float), or None."""
    if type(value) is float:
        return value if math.isfinite(value) and 0.0 <= value <= MAX_TS else None
    if type(value) is int:
        return float(value) if 0 <= value <= MAX_TS else None
    return None


def _text(value: Any) -> bool:
    return type(value) is str  # msgpack's strict UTF-8 never hands back a lone surrogate


def _ref(value: Any) -> Optional[Dict[str, Any]]:
    """A `PayloadRef` map that passes the class's rules, or None."""
    if type(value) is not dict or not _REF_REQUIRED <= value.keys() or not value.keys() <= _REF_FIELDS:
        return None
    digest = value["digest"]
    if type(digest) is not str or len(digest) != 64 or not _HEX.issuperset(digest):
        return None
    if not _int(value["nbytes"], 0, _MAX_NBYTES) or not _int(value["stored_nbytes"], 0, _MAX_NBYTES):
        return None
    if value.get("compression") not in (None, "zstd"):
        return None
    return value


def call_row(seq: int, cls: type, body: Dict[str, Any], keys: KeyRuleCache, *,
             timed: bool = True) -> Optional[Dict[str, Any]]:
    """The JSON row of a call event's map when every field passes its class's rules, else None
    (`timed`: with its ``time``; without, None there, for a reader that needs no clock text)."""
    if cls not in CALL_ACTIONS:
        return None
    allowed, required = _CLASS_FIELDS[cls]
    if not required <= body.keys() or not body.keys() <= allowed:
        return None
    run, mode, stage = body["run"], body["mode"], body.get("stage", DEFAULT_STAGE)
    session, policy, reason = body["session"], body["policy"], body["reason"]
    step, gen_index = body["step"], body["gen_index"]
    ts = _number(body["ts"])
    if ts is None or not (_text(session) and _text(policy) and _text(reason) and _text(run) and _text(mode)
                          and _text(stage)):
        return None
    if not _int(step, 0, MAX_STEP) or not _int(gen_index, 0, MAX_GEN_INDEX):
        return None
    if not keys.ok(run, mode, stage):
        return None
    duration: Optional[float] = None
    if cls is not CallRefused:
        duration = _number(body.get("duration_s", 0.0))
        if duration is None:
            return None
    stored, out, input_digest, imported_from = False, None, None, None
    source: Tuple[Any, ...] = (None, None, None, None)
    if cls is GenerationRecorded or cls is ReplayServed:
        input_digest = body["input_digest"]
        if input_digest is not None and not _text(input_digest):
            return None
        out = _ref(body["output"]) if body["output"] is not None or cls is ReplayServed else None
        if out is None and (cls is ReplayServed or body["output"] is not None):
            return None
    if cls is GenerationRecorded:
        if body["input"] is not None and _ref(body["input"]) is None:
            return None
        imported_from = body.get("imported_from")
        if imported_from is not None and not _text(imported_from):
            return None
        stored = out is not None
    elif cls is ReplayServed:
        source = (body["source_run"], body["source_step"], body["source_gen_index"], body["source_seq"])
        if not (_text(source[0]) and keys.ok(source[0]) and _int(source[1], 0, MAX_STEP)
                and _int(source[2], 0, MAX_GEN_INDEX) and _int(source[3], 1, _MAX_U64)):
            return None
    return {
        "schema_version": AUDIT_SCHEMA_VERSION, "seq": seq, "session": session, "run": run, "mode": mode,
        "stage": stage, "step": step, "gen_index": gen_index, "action": CALL_ACTIONS[cls], "stored": stored,
        "source_run": source[0], "source_step": source[1], "source_gen_index": source[2], "source_seq": source[3],
        "policy": policy, "reason": reason,
        "nbytes": out["nbytes"] if out else None, "stored_nbytes": out["stored_nbytes"] if out else None,
        "digest": out["digest"] if out else None, "input_digest": input_digest, "ts": ts, "time": iso_time(ts) if timed else None,
        "duration_s": duration, "imported_from": imported_from, "released_by": None, "origin_journal": None,
        "origin_seq": None,
    }


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
        found = provenance.of(seq, row["source_seq"]) if pulled else None
        if found is not None:
            row["origin_journal"], row["origin_seq"], row["source_seq"] = found
        if (run is not None and row["run"] != run) or (steps is not None and row["step"] not in steps):
            continue
        if (mode is not None and row["mode"] != mode) or (stage is not None and row["stage"] != stage):
            continue
        if released_by and row["action"] == "generated" and row["seq"] in released_by:
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

