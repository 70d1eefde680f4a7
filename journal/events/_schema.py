"""What an event's field holds, written once: its kind (type and limits) and its audit columns.

A call event's fields are declared in its attrs class (`_events`), each with `event_field(KIND, ...)`.
That line is the field's one definition: its name and type (the annotation), its limits (the `Kind`:
the validator the class runs, the msgspec type the fast decoder checks in C, the check the map reader
applies to a decoded value, all three from the same bounds), whether it is None-able, its default,
and the audit columns it fills (the keys of ``stepjournal audit --json``). The readers derive the rest
at import with `fields_of`: the fast decoder's structs (`index._native_rows`), the map reader's checks
(`index._call_rows`) and the audit row and `AuditRecord` (`index._audit`).

The validators run whenever an event is built: when a call is recorded (the caller gets
`InvalidKeyError`, a ValueError) and when stored bytes are decoded (cattrs builds the event;
`decode_event` turns the error into an `EventDecodeError` naming the event's seq). A CRC only proves
the bytes are the ones written, not that a sane program wrote them: a step of -1, a NaN time or an
index of 2**32 would otherwise reach the index keys, the clock formatting and the JSON printers as raw
tracebacks.
"""

from __future__ import annotations

import math
import typing
from typing import Any, Callable, Dict, Literal, Optional, Tuple, Union

import attrs

from ..base._errors import InvalidKeyError
from ._keys import MAX_GEN_INDEX, MAX_STEP, check_key

__all__ = ["Kind", "Field", "event_field", "fields_of", "BAD", "MAX_TS", "MAX_U64", "MAX_NBYTES",
           "TEXT", "RUN", "MODE", "STAGE", "SOURCE_RUN", "STEP", "GEN_INDEX", "SEQ", "NBYTES", "TIME", "DURATION",
           "DIGEST", "COMPRESSION", "ref_kind", "refuse", "check_text"]

# The latest time `datetime` can show (the end of year 9999), msgpack's unsigned range, and a size's.
MAX_TS = 253402300799.0
MAX_U64 = (1 << 64) - 1
MAX_NBYTES = (1 << 63) - 1
_DIGEST_HEX = 64
_HEX = frozenset("0123456789abcdefABCDEF")
_SCHEMA_KEY = "stepjournal.field"


class _Bad:
    def __repr__(self) -> str:
        return "BAD"


BAD: Any = _Bad()  # what a kind's `check` returns for a value its field refuses


def _show(value: Any) -> str:
    try:
        return repr(value)[:80]
    except Exception:  # a hostile value may not even have a repr
        return type(value).__name__


def refuse(name: str, value: Any, expected: str) -> None:
    """Raise the `InvalidKeyError` a field's validator raises: the field, its bad value, what to use."""
    raise InvalidKeyError(f"{name}={_show(value)} is not valid: {expected}")


def check_text(name: str, value: Any) -> None:
    """Refuse what is not a string of UTF-8 text (a lone surrogate is not)."""
    if not isinstance(value, str):
        refuse(name, value, "use a string")
    try:
        value.encode()
    except UnicodeEncodeError:
        refuse(name, value, "it holds a lone surrogate, not UTF-8 text")


Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


@attrs.frozen
class Kind:
    """What a field holds, as each reader checks it.

    Attributes:
        name: a name for messages and docs (``"step"``, ``"text"`` ...).
        validator: the attrs validator the event class runs (raises `InvalidKeyError`).
        native: the type the fast decoder declares and the bounds msgspec checks on it in C (``Meta``'s
            arguments; msgspec itself is imported by that decoder only, not with the events).
        check: a value decoded from msgpack as the field holds it (an int where a float is due becomes
            a float), or `BAD` when the validator would refuse it.
        key: the part of the key rule the value is checked under (`check_key`) beyond its type:
            ``"run"``, ``"mode"`` or ``"stage"`` (the call's key, checked together), ``"lone_run"``
            (a run key alone), or None.
    """

    name: str
    validator: Validator
    native: Tuple[Any, Dict[str, Any]]
    check: Callable[[Any], Any]
    key: Optional[str] = None


def _int_kind(name: str, low: int, high: int, text: str, native: Optional[Tuple[Any, Dict[str, Any]]] = None) -> Kind:
    def validator(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            refuse(attribute.name, value, f"use an int from {text}")

    def check(value: Any) -> Any:
        return value if type(value) is int and low <= value <= high else BAD

    return Kind(name, validator, native or (int, {"ge": low, "le": high}), check)


def _number_kind(name: str, high: float, text: str) -> Kind:
    def validator(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                or not 0.0 <= value <= high):
            refuse(attribute.name, value, f"use a finite number from {text}")

    def check(value: Any) -> Any:
        if type(value) is float:
            return value if math.isfinite(value) and 0.0 <= value <= high else BAD
        if type(value) is int:
            return float(value) if 0 <= value <= high else BAD
        return BAD

    return Kind(name, validator, (float, {"ge": 0.0, "le": high}), check)  # NaN fails these bounds


def _text_check(value: Any) -> Any:
    return value if type(value) is str else BAD  # msgpack's strict UTF-8 never hands back a lone surrogate


def _text_validator(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    check_text(attribute.name, value)


def _key_kind(name: str, key: str, rule: Validator) -> Kind:
    def validator(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        rule(instance, attribute, value)

    return Kind(name, validator, (str, {}), _text_check, key)


def _run_rule(_instance: Any, _attribute: "attrs.Attribute[Any]", value: Any) -> None:
    check_key(value, "train")


def _mode_rule(instance: Any, _attribute: "attrs.Attribute[Any]", value: Any) -> None:
    check_key(instance.run, value)  # validators run once every field is set


def _stage_rule(instance: Any, _attribute: "attrs.Attribute[Any]", value: Any) -> None:
    check_key(instance.run, instance.mode, value)


def _digest_validator(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if not isinstance(value, str) or len(value) != _DIGEST_HEX or not _HEX.issuperset(value):
        refuse(attribute.name, value, f"use the {_DIGEST_HEX} hex digits of a BLAKE3 digest")


def _digest_check(value: Any) -> Any:
    return value if type(value) is str and len(value) == _DIGEST_HEX and _HEX.issuperset(value) else BAD


def _compression_validator(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if value not in (None, "zstd"):
        refuse(attribute.name, value, "use None or 'zstd'")


TEXT = Kind("text", _text_validator, (str, {}), _text_check)
RUN = _key_kind("run key", "run", _run_rule)
MODE = _key_kind("mode", "mode", _mode_rule)
STAGE = _key_kind("stage", "stage", _stage_rule)
SOURCE_RUN = _key_kind("run key", "lone_run", _run_rule)
STEP = _int_kind("step", 0, MAX_STEP, "0 to 2**63-1")
GEN_INDEX = _int_kind("gen_index", 0, MAX_GEN_INDEX, "0 to 2**32-1")
# msgspec bounds an int within int64; msgpack holds no int past 2**64 - 1, the rule's top.
SEQ = _int_kind("seq", 1, MAX_U64, "1 to 2**64-1", native=(int, {"ge": 1}))
NBYTES = _int_kind("size", 0, MAX_NBYTES, "0 to 2**63-1")
TIME = _number_kind("time", MAX_TS, f"0 to {MAX_TS:.0f} (a Unix time before the year 10000)")
DURATION = _number_kind("duration", MAX_TS, "0 up (seconds)")
DIGEST = Kind("digest", _digest_validator, (str, {"pattern": "^[0-9a-fA-F]{64}\\Z"}), _digest_check)
COMPRESSION = Kind("compression", _compression_validator, (Literal["zstd"], {}),
                   lambda value: value if value == "zstd" and type(value) is str else BAD)


def ref_kind(cls: type) -> Kind:
    """The kind of a field holding a payload's place: an instance of `cls` (`PayloadRef`), whose own
    declared fields say what its stored map holds."""

    def validator(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if not isinstance(value, cls):
            refuse(attribute.name, value, f"use a {cls.__name__}")

    def check(value: Any) -> Any:
        """A stored map of `cls` whose fields pass their kinds, or BAD (the map is kept: a reader takes its keys)."""
        if type(value) is not dict:
            return BAD
        fields = fields_of(cls)
        if len(value) > len(fields):
            return BAD
        found = 0
        for field in fields:
            if field.name not in value:
                if field.required:
                    return BAD
                continue
            found += 1
            item = value[field.name]
            if not (item is None and field.optional) and field.kind.check(item) is BAD:
                return BAD
        return value if found == len(value) else BAD  # no key the class lacks

    # Its msgspec type is the struct the fast decoder derives from `cls`.
    return Kind("payload", validator, (cls, {}), check)


@attrs.frozen
class Field:
    """One field of an event class as the readers derive from it.

    Attributes:
        name: the field's name (its key in the stored map).
        kind: what it holds (`Kind`).
        optional: whether it may hold None.
        default: the value of a key the stored map may lack, or `attrs.NOTHING` (required).
        audit: the audit columns it fills, ``(column, part)`` each: the value itself (part None) or, for a
            payload, one of its fields (``("nbytes", "nbytes")``).
        hint: its annotation (the type), resolved.
    """

    name: str
    kind: Kind
    optional: bool
    default: Any
    audit: Tuple[Tuple[str, Optional[str]], ...]
    hint: Any

    @property
    def required(self) -> bool:
        """Whether every stored map of the event holds this key."""
        return self.default is attrs.NOTHING


def event_field(kind: Kind, *, default: Any = attrs.NOTHING, optional: bool = False,
                audit: Union[bool, str, Tuple[Tuple[str, Optional[str]], ...]] = False) -> Any:
    """An attrs field of an event class, declared by what it holds.

    Args:
        kind: its type's limits (`TEXT`, `STEP`, `ref_kind(PayloadRef)` ...).
        default: the value of a key an older (or leaner) stored map lacks; none: the key is required.
        optional: it may hold None (write the annotation as ``Optional[...]``; a test checks they agree).
        audit: its audit column: True (the field's name), a column name, or ``(column, part)`` pairs
            (a payload's parts); False: not in the audit row.
    """
    validator = attrs.validators.optional(kind.validator) if optional else kind.validator
    columns: Tuple[Tuple[str, Optional[str]], ...]
    if audit is True:
        columns = (("", None),)  # the field's own name, filled in by `fields_of`
    elif audit is False:
        columns = ()
    elif isinstance(audit, str):
        columns = ((audit, None),)
    else:
        columns = tuple(audit)
    return attrs.field(default=default, validator=validator,
                       metadata={_SCHEMA_KEY: (kind, optional, columns)})


_FIELDS: Dict[type, Tuple[Field, ...]] = {}


def fields_of(cls: type) -> Tuple[Field, ...]:
    """The fields of an event class declared with `event_field`, in the class's order (kept per class).

    Raises:
        TypeError: a field of `cls` was not declared with `event_field`.
    """
    found = _FIELDS.get(cls)
    if found is not None:
        return found
    hints = typing.get_type_hints(cls)
    fields = []
    for field in attrs.fields(cls):
        spec = field.metadata.get(_SCHEMA_KEY)
        if spec is None:
            raise TypeError(f"{cls.__name__}.{field.name} is not declared with event_field(KIND, ...)")
        kind, optional, columns = spec
        columns = tuple((column or field.name, part) for column, part in columns)
        fields.append(Field(field.name, kind, optional, field.default, columns, hints[field.name]))
    _FIELDS[cls] = result = tuple(fields)
    return result
