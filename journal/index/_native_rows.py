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
import operator
from typing import Annotated, Any, Dict, List, Literal, Optional, Tuple, Union

import attrs
import msgspec
from msgspec import UNSET, Meta, Raw, UnsetType

from ._audit import AUDIT_FIELDS, CALL_COLUMNS
from ..events._convert import MAX_EVENT_BYTES, checksum_holds
from ..events._events import (AUDIT_SCHEMA_VERSION, CALL_ACTIONS, EVENT_TYPES, CallEvent, GenerationRecorded,
                              PayloadRef, field_names, iso_time)
from ..events._schema import Field, fields_of

__all__ = ["Row", "row_of", "index_fields_of", "index_fields", "encode_rows", "encode_row", "encode_lines", "as_row",
           "as_dicts"]

_Checksum = Annotated[int, Meta(ge=0, le=(1 << 32) - 1)]
_STRUCT_FIELD = {"v", "crc32"}  # the stored envelope: the version and the checksum (the tag is the struct's)


def _native(field: Field, ref: Any) -> Any:
    """The msgspec type of an event field: its kind's type and bounds, None-able when the field is, UNSET-able
    when a stored map may lack it (a reader tells a missing key from a stored default)."""
    base, bounds = field.kind.native
    kind = ref if field.kind.native[0] is PayloadRef else (Annotated[base, Meta(**bounds)] if bounds else base)
    kinds = [kind] + ([type(None)] if field.optional else []) + ([] if field.required else [UnsetType])
    return Union[tuple(kinds)] if len(kinds) > 1 else kind


def _struct_of(cls: type, ref: Any = None, tag: Optional[str] = None, version: Optional[int] = None) -> Any:
    """The msgspec struct that decodes `cls`'s stored map, derived from the class's declared fields."""
    fields = fields_of(cls)
    spec: List[Any] = [] if tag is None else [("v", Literal[version]), ("crc32", _Checksum)]
    spec += [(f.name, _native(f, ref)) for f in fields if f.required]
    spec += [(f.name, _native(f, ref), UNSET) for f in fields if not f.required]
    options: Dict[str, Any] = {} if tag is None else {"tag": tag, "tag_field": "type"}
    return msgspec.defstruct(f"_{cls.__name__}", spec, forbid_unknown_fields=True, module=__name__, **options)


_Ref = _struct_of(PayloadRef)
# The struct of each call event class (by its tag and current version); `tests/unit/test_event_schema.py`
# checks the derivation against the classes (fields, defaults, types, tag, version).
_EVENT_OF = {_struct_of(cls, _Ref, *EVENT_TYPES[cls]): cls for cls in CALL_ACTIONS}
_STRUCT_OF = {cls: struct for struct, cls in _EVENT_OF.items()}
_Generated = _STRUCT_OF[GenerationRecorded]
# Keys every map of the class has: its fields without a default, plus type, v and crc32.
_KEYS = {struct: len(field_names(cls)[1]) + 3 for struct, cls in _EVENT_OF.items()}
# The fields a stored map may lack, and the stage a call of each class has when its map holds none.
_OMISSIBLE = {struct: tuple(f.name for f in fields_of(cls) if not f.required) for struct, cls in _EVENT_OF.items()}
_DEFAULT_STAGE: Dict[Any, str] = {struct: field.default for struct, cls in _EVENT_OF.items()
                                  for field in fields_of(cls) if field.name == "stage"}
_LONE_RUNS = {struct: tuple(f.name for f in fields_of(cls) if f.kind.key == "lone_run")
              for struct, cls in _EVENT_OF.items()}
_ACTION = {struct: CALL_ACTIONS[cls] for struct, cls in _EVENT_OF.items()}
_DECODER = msgspec.msgpack.Decoder(Union[tuple(_EVENT_OF)])


_AT = {name: at for at, name in enumerate(AUDIT_FIELDS)}


def _row_plan(struct: Any) -> Tuple[Any, Tuple[Any, ...], Tuple[Tuple[str, Any, Tuple[None, ...]], ...],
                                    Tuple[Tuple[int, Any], ...], Tuple[int, ...]]:
    """How `row_of` reads the row of a struct's event, in `AUDIT_FIELDS` order, mostly in C: the struct's
    values (`msgspec.structs.astuple`), then each payload's parts, then the values every row of the struct
    shares (the schema version, the action, None) are one tuple, which one `itemgetter` (`place`) lays out
    as the row (with the seq, ``stored`` and ``time`` of the event between them). Returns
    ``(place, shared, parts, defaults, floats)``: `parts` ``(field, attrgetter of its
    parts, Nones for a payload that is None)``; `defaults` the ``(place, default)`` of a column whose field
    a stored map may lack; `floats` the places of float columns (a small float is carried as Python's text)."""
    cls = _EVENT_OF[struct]
    source = {name: at for at, name in enumerate(struct.__struct_fields__)}
    columns = CALL_COLUMNS[cls]
    parts: Dict[str, List[Any]] = {}
    for column in columns:
        if column.part is not None:
            parts.setdefault(column.field, []).append(column)
    for field, of in parts.items():
        for column in of:
            source[f"{field}.{column.part}"] = len(source)
    # Then the values `row_of` knows per event, and those every row of the struct shares.
    at_seq, at_stored, at_time = len(source), len(source) + 1, len(source) + 2
    shared = (AUDIT_SCHEMA_VERSION, CALL_ACTIONS[cls], None)
    at_version, at_action, at_none = len(source) + 3, len(source) + 4, len(source) + 5
    taken = {c.name: source[c.field if c.part is None else f"{c.field}.{c.part}"] for c in columns}
    taken.update(schema_version=at_version, action=at_action, seq=at_seq, stored=at_stored, time=at_time)
    place = operator.itemgetter(*(taken.get(name, at_none) for name in AUDIT_FIELDS))
    return (place, shared,
            tuple((field, operator.attrgetter(*(c.part for c in of)), (None,) * len(of))
                  for field, of in parts.items()),
            tuple((_AT[c.name], c.default) for c in columns if c.part is None and c.default is not attrs.NOTHING),
            tuple(_AT[c.name] for c in columns if c.part is None and c.kind.native[0] is float))


_ROW_PLANS = {struct: _row_plan(struct) for struct in _EVENT_OF}
_astuple = msgspec.structs.astuple
_FLOATS = tuple(sorted({at for plan in _ROW_PLANS.values() for at in plan[4]}))


class _RowMethods(msgspec.Struct):
    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)


# An audit JSON row (keys in `AUDIT_FIELDS` order); ``row[key]`` reads a field as for a dict row. Built from
# `AUDIT_FIELDS` at import; a type checker sees it as Any.
Row: Any = msgspec.defstruct("Row", [(name, Any) for name in AUDIT_FIELDS], bases=(_RowMethods,), module=__name__)


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
        text = iso_time(float(second))
        assert text is not None  # only a time of None has no text
        head = _SECONDS[second] = text[:19]
    return f"{head}.{micros // 1000:03d}Z"


def _checked(raw: bytes, keys: Any) -> Any:
    """``(event, whole)`` of the call event stored as `raw` when this decoder accepts it exactly (a field its map
    lacks is UNSET; `whole`: it lacks none), else None."""
    if len(raw) > MAX_EVENT_BYTES:
        return None
    try:
        event = _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    cls = type(event)
    omissible = _OMISSIBLE[cls]
    present = _KEYS[cls] + len(omissible)
    for name in omissible:
        if getattr(event, name) is UNSET:
            present -= 1
    for name in _LONE_RUNS[cls]:
        value = getattr(event, name)
        if (value,) not in keys.passed and not keys.ok(value):
            return None
    if not checksum_holds(raw, event.crc32, present - 1, counted=True):  # a key twice is not passed
        return None
    stage = event.stage
    key = (event.run, event.mode, _DEFAULT_STAGE[cls] if stage is UNSET else stage)
    if key not in keys.passed and not keys.ok(*key):
        return None
    return event, present == _KEYS[cls] + len(omissible)


def _call_key(event: CallEvent) -> Tuple[str, str, str]:
    """(run, mode, stage) of a decoded call event, the stage's default filled in."""
    stage = event.stage
    return event.run, event.mode, _DEFAULT_STAGE[type(event)] if stage is UNSET else stage


def row_of(seq: int, raw: bytes, keys: Any, *, timed: bool = True, plain: bool = False) -> Any:
    """The audit row of the call event stored as `raw`, or None when it is not one this decoder accepts exactly
    (`keys`: an `_call_rows.KeyRuleCache`; `timed`: with the row's ``time``, else None there). A `Row` for
    `encode_rows` (a small float carried as Python's text of it); with `plain`, the dict row the event
    path yields, for a reader that computes with its fields."""
    found = _checked(raw, keys)
    if found is None:
        return None
    event, whole = found
    place, shared, parts, defaults, floats = _ROW_PLANS[type(event)]
    read = _astuple(event)
    for field, get, nones in parts:
        value = getattr(event, field)
        read += nones if value is None else get(value)
    stored = type(event) is _Generated and event.output is not None  # only a recorded call stores its output
    values: Any = place(read + (seq, stored, clock_text(event.ts) if timed else None) + shared)
    if not whole:
        values = list(values)
        for at, default in defaults:
            if values[at] is UNSET:
                values[at] = default
    if not plain:
        for at in floats:
            value = values[at]
            if value and value < 1e-4:
                values = list(values)
                values[at] = _float(value)
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
    run, mode, stage = _call_key(event)
    return run, mode, stage, event.step, event.gen_index, _ACTION[cls], None if out is None else out.nbytes


def index_fields(row: Any) -> tuple:
    """`index_fields_of` of a row: a `Row` (read by attribute) or a dict row (the checked map path's)."""
    if type(row) is Row:
        return (row.run, row.mode, row.stage, row.step, row.gen_index, row.action, row.nbytes if row.stored else None)
    return (row["run"], row["mode"], row["stage"], row["step"], row["gen_index"], row["action"],
            row["nbytes"] if row["stored"] else None)


def as_row(row: Dict[str, Any]) -> Row:
    """A dict row (the event path's) as a `Row`, its small floats carried as Python writes them."""
    values = [row[key] for key in AUDIT_FIELDS]
    for at in _FLOATS:
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

