"""The journal's one cattrs converter and the event codec built on it (msgpack bytes).

An event is stored as a msgpack map ``{"type": <stable tag>, "v": <schema version>, **fields,
"crc32": <checksum>}``. The checksum is the CRC-32 of the map packed without it: LMDB checks nothing
of what it stores, and a flipped byte in a timestamp, a reason or a digest would otherwise decode
into a valid but false event. It detects damage, not tampering. An event without a ``crc32`` (the
format allows none) is read unchecked.
Unknown tags, newer versions and malformed bodies raise typed errors; older versions are lifted to
the current one by the functions in `_UPGRADES` before structuring, so old journals stay readable.
"""

from __future__ import annotations

import typing
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import attrs
import cattrs
from cattrs.v import format_exception
import msgpack
from cattrs.preconf.msgpack import make_converter

from ..base._errors import (EventDecodeError, InvalidKeyError, StepJournalError, UnknownEventTypeError,
                            UnsupportedSchemaVersionError)
from ._events import EVENT_TYPES, Event, PayloadRef

__all__ = ["converter", "encode_event", "decode_event", "event_of", "event_tag", "checked_body", "checksum_holds",
           "MAX_EVENT_BYTES"]

# An event body is small (no payload bytes); anything larger is not an event.
MAX_EVENT_BYTES = 1 << 20
_CHECKSUM_KEY = "crc32"

_TAG_TO_TYPE: Dict[str, Tuple[type, int]] = {tag: (cls, ver) for cls, (tag, ver) in EVENT_TYPES.items()}



def _stage_generate(body: Dict[str, Any]) -> Dict[str, Any]:
    """A v1 call event (it has no stage) as v2: its call is of the ``"generate"`` stage."""
    if "stage" in body:
        raise ValueError("a v1 body has no 'stage' field; this one has, so it was not written by stepjournal")
    return {**body, "stage": "generate"}


# (tag, old version) -> function lifting a body dict by one version.
def _no_renames(body: Dict[str, Any]) -> Dict[str, Any]:
    if "runs" in body:
        raise ValueError(
            "a v1 events_imported body has no 'runs' field; this one has, so it was not written by stepjournal"
        )
    return {**body, "runs": {}}


def _why_unknown(body: Dict[str, Any]) -> Dict[str, Any]:
    """A v2 generation_recorded body as v3: written before `not_stored` existed, it says nothing of why (None).
    A v2 body holding the key was written while the field was new and the version not yet raised: kept."""
    return {"not_stored": None, **body}


_UPGRADES: Dict[Tuple[str, int], Callable[[Dict[str, Any]], Dict[str, Any]]] = {
    **{(tag, 1): _stage_generate for tag in ("generation_recorded", "replay_served", "call_bypassed", "call_refused")},
    ("generation_recorded", 2): _why_unknown,
    ("events_imported", 1): _no_renames,
}


def _make_converter() -> cattrs.Converter:
    """Build the converter: strict about unknown keys so a damaged body is noticed, not half-read."""
    conv = make_converter(forbid_extra_keys=True)

    # cattrs would coerce ("yes" -> True, "3" -> 3); a journal or a config holding the wrong type is
    # damaged or mistyped, and saying so beats guessing.
    def strict(kind, accept, convert=lambda v: v):
        def hook(value, _type):
            if not accept(value):
                raise TypeError(f"expected {kind}, got {type(value).__name__} {value!r}")
            return convert(value)

        return hook

    conv.register_structure_hook(bool, strict("a bool", lambda v: isinstance(v, bool)))
    conv.register_structure_hook(
        int, strict("an int", lambda v: isinstance(v, int) and not isinstance(v, bool))
    )
    conv.register_structure_hook(
        float, strict("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), float)
    )
    conv.register_structure_hook(str, strict("a string", lambda v: isinstance(v, str)))
    return conv


converter: cattrs.Converter = _make_converter()

# cattrs writes each class's hooks as Python source and compiles it on first use. Build them all now,
# at import: decoding a journal (someone else's, perhaps) then compiles nothing, and the first event
# read costs what the others cost.
# A mapping's hook is made and registered on first use, which clears the dispatch cache: those first.
converter.get_structure_hook(Dict[str, str])
converter.get_unstructure_hook(Dict[str, str])
for _cls in (*EVENT_TYPES, PayloadRef):
    converter.get_structure_hook(_cls)
    converter.get_unstructure_hook(_cls)
    converter.get_structure_hook(Optional[_cls])


def _describe_field_error(exc: BaseException, type_: Any) -> str:
    # The event classes' validators say which field and what range (see _events); keep their words.
    if isinstance(exc, StepJournalError):
        return str(exc)
    return format_exception(exc, type_)


def event_tag(event: Event) -> str:
    """Return the stable tag name of an event instance."""
    return EVENT_TYPES[type(event)][0]


def encode_event(event: Event) -> bytes:
    """Turn an event into its stored bytes."""
    tag, version = EVENT_TYPES[type(event)]
    body = {"type": tag, "v": version, **converter.unstructure(event)}
    body[_CHECKSUM_KEY] = zlib.crc32(msgpack.packb(body, use_bin_type=True))
    raw = msgpack.packb(body, use_bin_type=True)
    if len(raw) > MAX_EVENT_BYTES:  # every reader refuses one as damage: never write it
        largest = max(body, key=lambda name: len(msgpack.packb(body[name], use_bin_type=True)))
        raise InvalidKeyError(
            f"a {tag} event of {len(raw)} bytes is larger than an event may be ({MAX_EVENT_BYTES}); its largest "
            f"field is {largest}={_shown(body[largest])}: shorten it (a large value belongs in the payload)")
    return raw


def _shown(value: Any) -> str:
    """`value`'s repr, cut to a line."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}… ({len(text)} characters)"


# -- the fast path of `decode_event` -------------------------------------------------------------------
# A field's plan: (name, kind, optional, required). Kinds are the exact types msgpack hands back.
_Plan = List[Tuple[str, Any, bool, bool]]
_CHECKSUM_TAIL = msgpack.packb(_CHECKSUM_KEY)


def _map_header(count: int) -> bytes:
    """msgpack's header of a map of `count` entries (fixmap or map 16: an event has no more)."""
    return bytes([0x80 | count]) if count < 16 else b"\xde" + count.to_bytes(2, "big")


_HEADER_CRC = [zlib.crc32(_map_header(count)) for count in range(64)]  # the counts events have


def checksum_holds(raw: bytes, checksum: int, entries: int, *, counted: bool = False) -> bool:
    """Whether the stored event `raw` (a msgpack map, fixmap or map 16) ends with ``crc32: checksum`` in
    msgpack's shortest form, and `checksum` is the CRC-32 of the map without that entry: its header
    rewritten for `entries` entries, every other byte as stored (the bytes the writer checksummed,
    without packing the body again). The one checksum rule of every reader. With `counted`, the
    header must also count `entries` + 1 entries: a key twice, which a decoder keeping the last value
    reads once, is not passed."""
    if not 0 <= checksum <= 0xFFFFFFFF:  # a CRC-32 is neither negative nor wider
        return False
    first = raw[0]
    if 0x80 <= first <= 0x8F:
        start, count = 1, first & 0x0F
    elif first == 0xDE:
        start, count = 3, (raw[1] << 8) | raw[2]
    else:
        return False
    if counted and count != entries + 1:
        return False
    if checksum < 0x80:
        packed = bytes([checksum])
    elif checksum < 0x100:
        packed = b"\xcc" + bytes([checksum])
    elif checksum < 0x10000:
        packed = b"\xcd" + checksum.to_bytes(2, "big")
    else:
        packed = b"\xce" + checksum.to_bytes(4, "big")
    end = len(raw) - len(_CHECKSUM_TAIL) - len(packed)
    if end < start or raw[end:] != _CHECKSUM_TAIL + packed:
        return False
    header = _HEADER_CRC[entries] if 0 <= entries < 64 else zlib.crc32(_map_header(entries))
    return zlib.crc32(raw[start:end], header) == checksum


def _plan_of(cls: type) -> Optional[_Plan]:
    """How to build `cls` straight from a msgpack map, or None when a field needs the converter."""
    hints = typing.get_type_hints(cls)
    plan: _Plan = []
    for field in attrs.fields(cls):
        kind, optional = hints[field.name], False
        args = typing.get_args(kind)
        if typing.get_origin(kind) is typing.Union and len(args) == 2 and type(None) in args:
            kind, optional = next(a for a in args if a is not type(None)), True
        if kind not in (str, int, float, bool, PayloadRef):
            return None
        plan.append((field.name, kind, optional, field.default is attrs.NOTHING))
    return plan


_PLANS: Dict[type, Optional[_Plan]] = {cls: _plan_of(cls) for cls in (*EVENT_TYPES, PayloadRef)}


def _build(body: Dict[str, Any], cls: type) -> Any:
    """`cls` from `body` when every value already has its field's exact type, else None.

    This is what the converter's strict hooks would do for these plain types (no coercion; an int
    where a float is due becomes a float); the classes' own validators run in `cls(...)`. Anything
    else (an extra key, a nested map, a value of another type) returns None: the converter decides.
    """
    plan = _PLANS[cls]
    if plan is None:
        return None
    kwargs: Dict[str, Any] = {}
    for name, kind, optional, required in plan:
        if name not in body:
            if required:
                return None
            continue
        value = body[name]
        vtype = type(value)
        if value is None:
            if not optional:
                return None
        elif kind is PayloadRef:
            if vtype is not dict:
                return None
            value = _build(value, PayloadRef)
            if value is None:
                return None
        elif vtype is not kind:
            if kind is float and vtype is int:
                value = float(value)
            else:
                return None
        kwargs[name] = value
    if len(kwargs) != len(body):
        return None
    return cls(**kwargs)


def _built(found: Optional[Tuple[type, Dict[str, Any]]]) -> Optional[Event]:
    """The event of a `checked_body` result when `_build` builds it and the class's validators pass, else None."""
    if found is None:
        return None
    try:
        return _build(found[1], found[0])
    except Exception:  # a validator refused a value: the checked path names it
        return None


def _decode_fast(raw: bytes) -> Optional[Event]:
    """The event in `raw` when it is a well-formed, checksummed event of a known version; else None.

    Whatever is unusual returns None, and `decode_event` takes the checked path, which says what is wrong.
    """
    return _built(checked_body(raw))


def event_of(raw: bytes, found: Optional[Tuple[type, Dict[str, Any]]], *, seq: int | None = None) -> Event:
    """`decode_event` of `raw` for a reader that already has ``found = checked_body(raw)``: the map is
    built without being unpacked and checksummed again; anything it does not build takes the checked
    path, which raises the same typed errors."""
    event = _built(found)
    return event if event is not None else decode_event(raw, seq=seq)


def checked_body(raw: bytes) -> Optional[Tuple[type, Dict[str, Any]]]:
    """The event class and field map of `raw` (checksum verified, lifted to the current version), or None.

    Not yet validated: building the class (or a reader checking the same rules) does that. The
    checksum is computed over the stored bytes themselves (the map header rewritten for one entry
    fewer, the trailing ``crc32`` entry cut off): the bytes the writer checksummed, without packing
    the body again. Anything unusual (no checksum, another map layout, an unknown tag or version)
    returns None: `decode_event` then says what is wrong.
    """
    if len(raw) > MAX_EVENT_BYTES:
        return None
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        if type(body) is not dict:
            return None
        checksum = body.pop(_CHECKSUM_KEY)
        if type(checksum) is not int or not checksum_holds(raw, checksum, len(body)):
            return None
        tag = body.pop("type")
        found = _TAG_TO_TYPE.get(tag)
        version = body.pop("v")
        if found is None or type(version) is not int or not 1 <= version <= found[1]:
            return None
        while version < found[1]:  # an older schema version: lifted, then built the same way
            body = _UPGRADES[(tag, version)](body)
            version += 1
        return found[0], body
    except Exception:  # anything odd: the checked path names it
        return None


def decode_event(data: Any, *, seq: int | None = None) -> Event:
    """Turn stored bytes back into an event.

    A well-formed current event is built straight from its msgpack map (`_decode_fast`); anything
    else goes through the checks and the converter, which raise the typed errors below.

    Args:
        data: the stored bytes (bytes or a buffer).
        seq: the event's sequence number, used in error messages.

    Raises:
        UnknownEventTypeError: the tag is not one this version knows.
        UnsupportedSchemaVersionError: the body is newer than this version reads.
        EventDecodeError: the bytes are not a well-formed event.
    """
    raw = bytes(data)
    if len(raw) <= MAX_EVENT_BYTES:
        event = _decode_fast(raw)
        if event is not None:
            return event
    where = f"event #{seq}" if seq is not None else "event"
    if len(raw) > MAX_EVENT_BYTES:
        raise EventDecodeError(f"{where} is {len(raw)} bytes, larger than any event; the journal is damaged")
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise EventDecodeError(f"{where} is not valid msgpack ({exc}); the journal is damaged") from None
    if not isinstance(body, dict) or not all(isinstance(key, str) for key in body):
        raise EventDecodeError(f"{where} is not a map of named fields; the journal is damaged")
    checksum = body.pop(_CHECKSUM_KEY, None)
    # Packing what was unpacked gives back the bytes the writer checksummed: one packer, no choices.
    computed = zlib.crc32(msgpack.packb(body, use_bin_type=True)) if checksum is not None else None
    tag = body.pop("type", None)
    version = body.pop("v", None)
    if not isinstance(tag, str) or tag not in _TAG_TO_TYPE:  # a damaged tag may be any value, unhashable too
        raise UnknownEventTypeError(
            f"{where} has unknown type {repr(tag)[:80]}; it was written by another program or a newer stepjournal"
        )
    cls, current = _TAG_TO_TYPE[tag]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise EventDecodeError(f"{where} ({tag}) has no valid schema version ({repr(version)[:80]})")
    if version > current:
        raise UnsupportedSchemaVersionError(
            f"{where} ({tag}) has schema version {version}, this stepjournal reads up to {current}; upgrade stepjournal"
        )
    try:
        while version < current:
            body = _UPGRADES[(tag, version)](body)
            version += 1
    except ValueError as exc:
        raise EventDecodeError(f"{where} ({tag}) has a broken body: {exc}") from None
    try:
        event = converter.structure(body, cls)
    except Exception as exc:  # cattrs wraps field errors in exception groups
        try:
            detail = (
                "; ".join(cattrs.transform_error(exc, format_exception=_describe_field_error))
                if isinstance(exc, cattrs.BaseValidationError)
                else str(exc)
            )
        except Exception:  # describing hostile values may fail in its own ways
            detail = type(exc).__name__
        raise EventDecodeError(f"{where} ({tag}) has a broken body: {detail}") from None
    if checksum != computed:
        raise EventDecodeError(
            f"{where} ({tag}) does not match its checksum: a byte of it changed; the journal is damaged"
        )
    return event
