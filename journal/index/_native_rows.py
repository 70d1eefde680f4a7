"""Audit rows of call events decoded natively (msgspec): ``audit --json`` and ``reindex`` at scale.

`row_of` decodes a stored call event with msgspec's msgpack decoder into a typed `Struct` whose
types and ranges are the event classes' (exact types, no coercion but an int where a float is due;
the digest's 64 hex digits; unknown and missing keys refused; the tag and the current schema
version), all checked in C; then, in Python, what msgspec cannot say: no key twice, the CRC-32 over
the stored bytes (`_convert.checksum_holds`, the rule `checked_body` applies), and the run / mode /
stage key rule (`_call_rows.KeyRuleCache`, once per distinct value). It returns the `Row` that
`_call_rows.call_row` would build from the same bytes, or None for anything else: then the caller
takes the existing checked path (`checked_body`, `call_row`, `decode_event`), which builds the same
row or raises the same typed error. That is no silent fallback: every value this module does not
accept exactly is decided by the code that decided it before, so output and errors stay the event
path's, byte for byte (`tests/unit/test_call_rows.py` compares them, hostile events included).
`index_fields_of` is the same decode for `reindex`: the fields the indexes need, no row.

`encode_rows` writes a batch of rows as the indented JSON `print_json` writes, through msgspec's
JSON encoder: its text of strings and ints is Python's; of floats too except under 1e-4 (Python
writes ``1e-05``), so such a float is carried as Python's own text (`msgspec.Raw`).

msgspec is imported with this module, which the verbs that need it import when they run, not
``import stepjournal``.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

import msgspec
from msgspec import UNSET, Meta, Raw, UnsetType

from ._audit import AUDIT_FIELDS
from ..events._convert import MAX_EVENT_BYTES, checksum_holds
from ..events._events import (AUDIT_SCHEMA_VERSION, CALL_ACTIONS, EVENT_TYPES, MAX_TS, CallBypassed, CallRefused, GenerationRecorded,
                      ReplayServed, iso_time,
                      field_names)
from ..events._keys import DEFAULT_STAGE, MAX_GEN_INDEX, MAX_STEP

__all__ = ["Row", "row_of", "index_fields_of", "index_fields", "encode_rows", "encode_row", "encode_lines", "as_row",
           "as_dicts"]

_Step = Annotated[int, Meta(ge=0, le=MAX_STEP)]
_GenIndex = Annotated[int, Meta(ge=0, le=MAX_GEN_INDEX)]
_Seconds = Annotated[float, Meta(ge=0.0, le=MAX_TS)]  # NaN and infinities fail these bounds
_Bytes = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]
_Checksum = Annotated[int, Meta(ge=0, le=(1 << 32) - 1)]
_Digest = Annotated[str, Meta(pattern="^[0-9a-fA-F]{64}\\Z")]


class _Ref(msgspec.Struct, forbid_unknown_fields=True):
    digest: _Digest
    nbytes: _Bytes
    stored_nbytes: _Bytes
    compression: Union[Literal["zstd"], None, UnsetType] = UNSET


class _Call(msgspec.Struct, forbid_unknown_fields=True, tag_field="type"):
    v: Literal[2]
    crc32: _Checksum
    session: str
    run: str
    step: _Step
    gen_index: _GenIndex
    mode: str
    policy: str
    reason: str
    ts: _Seconds


class _Generated(_Call, tag=EVENT_TYPES[GenerationRecorded][0]):
    input_digest: Optional[str]
    output: Optional[_Ref]
    input: Optional[_Ref]
    duration_s: _Seconds
    imported_from: Union[str, None, UnsetType] = UNSET
    stage: Union[str, UnsetType] = UNSET


class _Replayed(_Call, tag=EVENT_TYPES[ReplayServed][0]):
    input_digest: Optional[str]
    source_seq: Annotated[int, Meta(ge=1)]  # msgpack holds no int past 2**64 - 1, the rule's top
    source_run: str
    source_step: _Step
    source_gen_index: _GenIndex
    output: _Ref
    duration_s: Union[_Seconds, UnsetType] = UNSET
    stage: Union[str, UnsetType] = UNSET


class _Bypassed(_Call, tag=EVENT_TYPES[CallBypassed][0]):
    duration_s: Union[_Seconds, UnsetType] = UNSET
    stage: Union[str, UnsetType] = UNSET


class _Refused(_Call, tag=EVENT_TYPES[CallRefused][0]):
    stage: Union[str, UnsetType] = UNSET


# The event class each struct decodes (by its tag); `tests/unit/test_event_schema.py` checks that the struct's
# fields, defaults, types and version are the class's.
_CLASS_OF_TAG = {tag: cls for cls, (tag, _version) in EVENT_TYPES.items()}
_EVENT_OF = {struct: _CLASS_OF_TAG[struct.__struct_config__.tag] for struct in (_Generated, _Replayed, _Bypassed, _Refused)}
# Keys every map of the class has: its fields without a default, plus type, v and crc32.
_KEYS = {struct: len(field_names(cls)[1]) + 3 for struct, cls in _EVENT_OF.items()}
_ACTION = {struct: CALL_ACTIONS[cls] for struct, cls in _EVENT_OF.items()}
_DECODER = msgspec.msgpack.Decoder(Union[_Generated, _Replayed, _Bypassed, _Refused])


class Row(msgspec.Struct):
    """An audit JSON row (keys in `AUDIT_FIELDS` order); ``row[key]`` reads a field as for a dict row."""

    schema_version: int
    seq: int
    session: str
    run: str
    mode: str
    stage: str
    step: int
    gen_index: int
    action: str
    stored: bool
    source_run: Any
    source_step: Any
    source_gen_index: Any
    source_seq: Any
    policy: str
    reason: str
    nbytes: Any
    stored_nbytes: Any
    digest: Any
    input_digest: Any
    ts: Any
    time: Any
    duration_s: Any
    imported_from: Any
    released_by: Any
    origin_journal: Any
    origin_seq: Any

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)


assert Row.__struct_fields__ == AUDIT_FIELDS


def _float(value: float) -> Any:
    """`value` as msgspec should write it: itself, or Python's text of it under 1e-4 (``1e-05``)."""
    return Raw(float.__repr__(value).encode()) if value and value < 1e-4 else value


def _unraw(value: Any) -> Any:
    return float(bytes(value)) if isinstance(value, Raw) else value


_SECONDS: Dict[int, str] = {}  # whole second -> its ISO text up to the seconds


def clock_text(ts: float) -> str:
    """`iso_time` (``2026-01-31T12:00:00.123Z``) of a time in ``0 .. MAX_TS``, its date and clock text kept
    per second. The microseconds are what `datetime.fromtimestamp` takes (the fraction times 1e6,
    rounded half to even, carried into the second), then cut to milliseconds as `isoformat` does."""
    frac, whole = math.modf(ts)
    micros = round(frac * 1e6)
    if micros >= 1_000_000:
        whole, micros = whole + 1.0, micros - 1_000_000
    second = int(whole)
    head = _SECONDS.get(second)
    if head is None:
        if len(_SECONDS) > 65536:
            _SECONDS.clear()
        head = _SECONDS[second] = iso_time(float(second))[:19]
    return f"{head}.{micros // 1000:03d}Z"


def _checked(raw: bytes, keys: Any) -> Optional[tuple]:
    """``(event, stage, duration_s, imported_from)`` of the call event stored as `raw` when this decoder accepts
    it exactly (the defaults filled in; duration None for a refusal), else None."""
    if len(raw) > MAX_EVENT_BYTES:
        return None
    try:
        event = _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    cls = type(event)
    present = _KEYS[cls]
    stage = event.stage
    if stage is UNSET:
        stage = DEFAULT_STAGE
    else:
        present += 1
    duration: Any = None
    imported_from = None
    if cls is _Generated:
        duration, imported_from = event.duration_s, event.imported_from
        if imported_from is UNSET:
            imported_from = None
        else:
            present += 1
    elif cls is not _Refused:
        duration = event.duration_s
        if duration is UNSET:
            duration = 0.0
        else:
            present += 1
        if cls is _Replayed and (event.source_run,) not in keys.passed and not keys.ok(event.source_run):
            return None
    if not checksum_holds(raw, event.crc32, present - 1, counted=True):  # a key twice is not passed
        return None
    if (event.run, event.mode, stage) not in keys.passed and not keys.ok(event.run, event.mode, stage):
        return None
    return event, stage, duration, imported_from


def row_of(seq: int, raw: bytes, keys: Any, *, timed: bool = True, plain: bool = False) -> Any:
    """The audit row of the call event stored as `raw`, or None when it is not one this decoder accepts exactly
    (`keys`: an `_call_rows.KeyRuleCache`; `timed`: with the row's ``time``, else None there). A `Row` for
    `encode_rows` (a small float carried as Python's text of it); with `plain`, the dict row the event
    path yields, for a reader that computes with its fields."""
    found = _checked(raw, keys)
    if found is None:
        return None
    event, stage, duration, imported_from = found
    cls = type(event)
    source_run = source_step = source_gen_index = source_seq = out = input_digest = None
    if cls is _Generated:
        out, input_digest = event.output, event.input_digest
    elif cls is _Replayed:
        out, input_digest, source_run = event.output, event.input_digest, event.source_run
        source_step, source_gen_index, source_seq = event.source_step, event.source_gen_index, event.source_seq
    if out is None:
        nbytes = stored_nbytes = digest = None
    else:
        nbytes, stored_nbytes, digest = out.nbytes, out.stored_nbytes, out.digest
    ts = event.ts
    if not plain:
        if duration is not None and duration and duration < 1e-4:
            duration = _float(duration)
        ts = ts if ts >= 1e-4 or not ts else _float(ts)
    values = (
        AUDIT_SCHEMA_VERSION, seq, event.session, event.run, event.mode, stage, event.step, event.gen_index,
        _ACTION[cls], cls is _Generated and out is not None, source_run, source_step, source_gen_index, source_seq,
        event.policy, event.reason, nbytes, stored_nbytes, digest, input_digest,
        ts, clock_text(event.ts) if timed else None, duration, imported_from, None, None, None,
    )
    return dict(zip(AUDIT_FIELDS, values)) if plain else Row(*values)


def index_fields_of(raw: bytes, keys: Any) -> Optional[tuple]:
    """What `reindex` projects of the call event stored as `raw` (its row's run, mode, stage, step, gen_index,
    action, and stored output bytes or None when no output is stored), or None as `row_of`."""
    found = _checked(raw, keys)
    if found is None:
        return None
    event = found[0]
    cls = type(event)
    out = event.output if cls is _Generated else None
    return (event.run, event.mode, found[1], event.step, event.gen_index, _ACTION[cls],
            None if out is None else out.nbytes)


def index_fields(row: Any) -> tuple:
    """`index_fields_of` of a row: a `Row` (read by attribute) or a dict row (the checked map path's)."""
    if type(row) is Row:
        return (row.run, row.mode, row.stage, row.step, row.gen_index, row.action, row.nbytes if row.stored else None)
    return (row["run"], row["mode"], row["stage"], row["step"], row["gen_index"], row["action"],
            row["nbytes"] if row["stored"] else None)


def as_row(row: Dict[str, Any]) -> Row:
    """A dict row (the event path's) as a `Row`, its small floats carried as Python writes them."""
    values = [row[key] for key in AUDIT_FIELDS]
    for at in (20, 22):  # ts, duration_s
        if type(values[at]) is float and not math.isnan(values[at]):
            values[at] = _float(values[at])
    return Row(*values)


_ENCODER = msgspec.json.Encoder()


def encode_rows(rows: List[Row]) -> Optional[bytes]:
    """The rows as the body of ``json.dumps(rows, indent=2)`` without its brackets (``  {...},\\n  {...}``),
    UTF-8, or None when msgspec cannot write one of them as Python would (an int past 64 bits, a lone
    surrogate)."""
    try:
        data = msgspec.json.format(_ENCODER.encode(rows), indent=2)
    except (TypeError, ValueError, OverflowError, UnicodeError, msgspec.EncodeError):
        return None
    return data[2:-2]


def encode_row(row: Row) -> Optional[bytes]:
    """The row as compact JSON (no layout), UTF-8, or None as `encode_rows`."""
    try:
        return _ENCODER.encode(row)
    except (TypeError, ValueError, OverflowError, UnicodeError, msgspec.EncodeError):
        return None


def encode_lines(rows: List[Row]) -> Optional[bytes]:
    """The rows as compact JSON, each followed by a newline, UTF-8, or None as `encode_rows`."""
    try:
        return _ENCODER.encode_lines(rows)
    except (TypeError, ValueError, OverflowError, UnicodeError, msgspec.EncodeError):
        return None


def as_dicts(rows: List[Row]) -> List[Dict[str, Any]]:
    """`Row` s back to the dict rows the event path yields."""
    return [{key: _unraw(getattr(row, key)) for key in AUDIT_FIELDS} for row in rows]

