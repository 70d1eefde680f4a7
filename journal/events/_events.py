"""The event types of the journal: frozen attrs classes, the single source of truth.

Every journaled call (of the ``"generate"`` stage or of another stage: ``"reward"`` ...) leaves exactly one call event (`GenerationRecorded`, `ReplayServed`,
`CallBypassed` or `CallRefused`); a process that opens a journal for writing leaves one
`SessionOpened`. Everything else the journal knows (which steps are recorded, the nearest recorded
step, resume positions) is a projection of these events.
"""

from __future__ import annotations

import datetime
import math
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Tuple, Union

import attrs

from ..base._errors import InvalidKeyError
from ._keys import DEFAULT_STAGE, MAX_GEN_INDEX, MAX_STEP, check_key

__all__ = [
    "AUDIT_SCHEMA_VERSION",
    "iso_time",
    "call_refs",
    "PayloadRef",
    "SessionOpened",
    "GenerationRecorded",
    "ReplayServed",
    "CallBypassed",
    "CallRefused",
    "PayloadsReleased",
    "EventsImported",
    "Event",
    "EVENT_TYPES",
    "CALL_ACTIONS",
    "CALL_EVENT_TYPES",
    "ACTIONS",
    "field_names",
    "check_fingerprint",
]

# Values a fingerprint may hold: JSON scalars, so that a journal can be read anywhere.
FingerprintValue = Union[str, int, float, bool, None]

# -- field validators --------------------------------------------------------------------------------
# They run whenever an event is built: when a call is recorded (the caller gets `InvalidKeyError`, a
# ValueError) and when stored bytes are decoded (cattrs builds the event; `decode_event` turns the
# error into an `EventDecodeError` naming the event's seq). A CRC only proves the bytes are the ones
# written, not that a sane program wrote them: a step of -1, a NaN time or an index of 2**32 would
# otherwise reach the index keys, the clock formatting and the JSON printers as raw tracebacks.

# The latest time `datetime` can show (the end of year 9999), and msgpack's integer range.
MAX_TS = 253402300799.0
_MIN_INT, _MAX_INT = -(1 << 63), (1 << 64) - 1
_MAX_U64 = (1 << 64) - 1
_MAX_NBYTES = (1 << 63) - 1
_DIGEST_HEX = 64
_HEX = frozenset("0123456789abcdefABCDEF")


def _show(value: Any) -> str:
    try:
        return repr(value)[:80]
    except Exception:  # a hostile value may not even have a repr
        return type(value).__name__


def _refuse(name: str, value: Any, expected: str) -> None:
    raise InvalidKeyError(f"{name}={_show(value)} is not valid: {expected}")


def _int_field(low: int, high: int, text: str):
    def check(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            _refuse(attribute.name, value, f"use an int from {text}")

    return check


def _number_field(low: float, high: float, text: str):
    def check(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            _refuse(attribute.name, value, f"use a finite number from {text}")

    return check


def _check_text(name: str, value: Any) -> None:
    if not isinstance(value, str):
        _refuse(name, value, "use a string")
    try:
        value.encode()
    except UnicodeEncodeError:
        _refuse(name, value, "it holds a lone surrogate, not UTF-8 text")


def _text(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    _check_text(attribute.name, value)


def _optional_text(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _text(instance, attribute, value)


def _run_key(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_key(value, "train")


def _mode(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_key(instance.run, value)  # validators run once every field is set


def _stage(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_key(instance.run, instance.mode, value)


def _digest(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str) or len(value) != _DIGEST_HEX or not _HEX.issuperset(value):
        _refuse(attribute.name, value, f"use the {_DIGEST_HEX} hex digits of a BLAKE3 digest")


def _compression(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value not in (None, "zstd"):
        _refuse(attribute.name, value, "use None or 'zstd'")


def _payload_ref(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, PayloadRef):
        _refuse(attribute.name, value, "use a PayloadRef")


def _optional_payload_ref(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _payload_ref(instance, attribute, value)


def check_fingerprint(fingerprint: Mapping[str, Any]) -> None:
    """Refuse a fingerprint that is not a map of names to JSON scalars (finite numbers, 64-bit ints).

    Raises:
        InvalidKeyError: naming the first bad key or value.
    """
    if not isinstance(fingerprint, Mapping):
        _refuse("fingerprint", fingerprint, "use a dict of names to str, int, float, bool or None")
    for key, value in fingerprint.items():
        _check_text("fingerprint key", key)
        where = f"fingerprint value {key[:40]}"
        if isinstance(value, str):
            _check_text(where, value)
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not _MIN_INT <= value <= _MAX_INT:
                _refuse(where, value, "use an int that fits in 64 bits (or a string)")
        elif isinstance(value, float):
            if not math.isfinite(value):
                _refuse(where, value, "use a finite number (NaN never equals itself, so it would never match)")
        else:
            _refuse(where, value, f"it is a {type(value).__name__}; use str, int, float, bool or None")


def _fingerprint(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_fingerprint(value)


_STEP = _int_field(0, MAX_STEP, "0 to 2**63-1")
_GEN_INDEX = _int_field(0, MAX_GEN_INDEX, "0 to 2**32-1")
_SEQ = _int_field(1, _MAX_U64, "1 to 2**64-1")
_NBYTES = _int_field(0, _MAX_NBYTES, "0 to 2**63-1")
_PID = _int_field(0, _MAX_NBYTES, "0 to 2**63-1")
_TS = _number_field(0.0, MAX_TS, f"0 to {MAX_TS:.0f} (a Unix time before the year 10000)")
_DURATION = _number_field(0.0, float(MAX_TS), "0 up (seconds)")


@attrs.frozen
class PayloadRef:
    """Where a payload is stored: its content digest and sizes.

    Attributes:
        digest: hex BLAKE3 digest of the encoded (uncompressed) payload; the key in `payloads`.
        nbytes: size of the encoded payload.
        stored_nbytes: size as stored (smaller when compressed).
        compression: ``"zstd"`` or ``None``.
    """

    digest: str = attrs.field(validator=_digest)
    nbytes: int = attrs.field(validator=_NBYTES)
    stored_nbytes: int = attrs.field(validator=_NBYTES)
    compression: Optional[str] = attrs.field(default=None, validator=_compression)


@attrs.frozen
class SessionOpened:
    """A process opened the journal for writing under a run key and fingerprint."""

    session: str = attrs.field(validator=_text)
    run: str = attrs.field(validator=_run_key)
    fingerprint: Dict[str, FingerprintValue] = attrs.field(validator=_fingerprint)
    library_version: str = attrs.field(validator=_text)
    host: str = attrs.field(validator=_text)
    pid: int = attrs.field(validator=_PID)
    ts: float = attrs.field(validator=_TS)


@attrs.frozen
class GenerationRecorded:
    """A call ran for real (or was imported); its output is stored unless `output` is None."""

    session: str = attrs.field(validator=_text)
    run: str = attrs.field(validator=_run_key)
    step: int = attrs.field(validator=_STEP)
    gen_index: int = attrs.field(validator=_GEN_INDEX)
    mode: str = attrs.field(validator=_mode)
    input_digest: Optional[str] = attrs.field(validator=_optional_text)
    output: Optional[PayloadRef] = attrs.field(validator=_optional_payload_ref)
    input: Optional[PayloadRef] = attrs.field(validator=_optional_payload_ref)
    duration_s: float = attrs.field(validator=_DURATION)
    policy: str = attrs.field(validator=_text)
    reason: str = attrs.field(validator=_text)
    ts: float = attrs.field(validator=_TS)
    imported_from: Optional[str] = attrs.field(default=None, validator=_optional_text)
    stage: str = attrs.field(default=DEFAULT_STAGE, validator=_stage)


@attrs.frozen
class ReplayServed:
    """A call was answered from a recorded one (of the same stage) instead of running."""

    session: str = attrs.field(validator=_text)
    run: str = attrs.field(validator=_run_key)
    step: int = attrs.field(validator=_STEP)
    gen_index: int = attrs.field(validator=_GEN_INDEX)
    mode: str = attrs.field(validator=_mode)
    input_digest: Optional[str] = attrs.field(validator=_optional_text)
    source_seq: int = attrs.field(validator=_SEQ)
    source_run: str = attrs.field(validator=_run_key)
    source_step: int = attrs.field(validator=_STEP)
    source_gen_index: int = attrs.field(validator=_GEN_INDEX)
    output: PayloadRef = attrs.field(validator=_payload_ref)
    policy: str = attrs.field(validator=_text)
    reason: str = attrs.field(validator=_text)
    ts: float = attrs.field(validator=_TS)
    duration_s: float = attrs.field(default=0.0, validator=_DURATION)
    stage: str = attrs.field(default=DEFAULT_STAGE, validator=_stage)


@attrs.frozen
class CallBypassed:
    """A call ran without the journal's involvement (e.g. validation); nothing stored."""

    session: str = attrs.field(validator=_text)
    run: str = attrs.field(validator=_run_key)
    step: int = attrs.field(validator=_STEP)
    gen_index: int = attrs.field(validator=_GEN_INDEX)
    mode: str = attrs.field(validator=_mode)
    policy: str = attrs.field(validator=_text)
    reason: str = attrs.field(validator=_text)
    ts: float = attrs.field(validator=_TS)
    duration_s: float = attrs.field(default=0.0, validator=_DURATION)
    stage: str = attrs.field(default=DEFAULT_STAGE, validator=_stage)


@attrs.frozen
class CallRefused:
    """A call was refused (replay miss, fingerprint or input mismatch): an error was raised."""

    session: str = attrs.field(validator=_text)
    run: str = attrs.field(validator=_run_key)
    step: int = attrs.field(validator=_STEP)
    gen_index: int = attrs.field(validator=_GEN_INDEX)
    mode: str = attrs.field(validator=_mode)
    policy: str = attrs.field(validator=_text)
    reason: str = attrs.field(validator=_text)
    ts: float = attrs.field(validator=_TS)
    stage: str = attrs.field(default=DEFAULT_STAGE, validator=_stage)


def _digests(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, list):
        _refuse(attribute.name, value, "use a list of hex digests")
    for item in value:
        _digest(_instance, attribute, item)


@attrs.frozen
class PayloadsReleased:
    """Retention released the payloads of one recorded generation (see `stepjournal.upkeep.Retention`).

    The record's event stays in the log; from here on `lookup` no longer serves it. `released` are
    the digests whose bytes were deleted; `retained` those of the record that a kept record still
    uses (content addressing), left in place.
    """

    run: str = attrs.field(validator=_run_key)
    step: int = attrs.field(validator=_STEP)
    gen_index: int = attrs.field(validator=_GEN_INDEX)
    mode: str = attrs.field(validator=_mode)
    record_seq: int = attrs.field(validator=_SEQ)
    released: List[str] = attrs.field(validator=_digests)
    retained: List[str] = attrs.field(validator=_digests)
    rule: str = attrs.field(validator=_text)
    reason: str = attrs.field(validator=_text)
    ts: float = attrs.field(validator=_TS)
    stage: str = attrs.field(default=DEFAULT_STAGE, validator=_stage)


def _renames(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, dict):
        _refuse(attribute.name, value, "use a dict of run keys to run keys")
    for old, new in value.items():
        check_key(old, "train")
        check_key(new, "train")


@attrs.frozen
class EventsImported:
    """The next ``source_last - source_first + 1`` events were pulled from another journal, unchanged.

    Written by `stepjournal.sharing.pull` in the write transaction that appends them: the event right after
    this one is event `source_first` of journal `source`, the next one `source_first + 1`, and so on.
    It is their provenance (the audit shows it); the imported events keep their own bytes, so a
    `ReplayServed` among them names its source by the source journal's seq. `runs` names the run keys
    the import renamed (``{"exp": "exp-alice"}``, an import ``--as``): those events were stored with
    the new key, every other field as the source wrote it.
    """

    source: str = attrs.field(validator=_text)
    origin: str = attrs.field(validator=_text)
    source_first: int = attrs.field(validator=_SEQ)
    source_last: int = attrs.field(validator=_SEQ)
    ts: float = attrs.field(validator=_TS)
    runs: Dict[str, str] = attrs.field(factory=dict, validator=_renames)

    def __attrs_post_init__(self) -> None:
        if self.source_last < self.source_first:
            _refuse("source_last", self.source_last, f"use a seq from source_first ({self.source_first}) up")


Event = Union[SessionOpened, GenerationRecorded, ReplayServed, CallBypassed, CallRefused, PayloadsReleased, EventsImported]

# Stable tag names and current schema versions. A tag, once written to a journal, is never renamed.
EVENT_TYPES: Dict[type, tuple[str, int]] = {
    SessionOpened: ("session_opened", 1),
    # v2: the call's `stage`; a v1 body (no stage) is a ``"generate"`` call (see `_convert._UPGRADES`).
    GenerationRecorded: ("generation_recorded", 2),
    ReplayServed: ("replay_served", 2),
    CallBypassed: ("call_bypassed", 2),
    CallRefused: ("call_refused", 2),
    PayloadsReleased: ("payloads_released", 1),
    # v2: `runs`, the run keys an import renamed; a v1 body renamed none (see `_convert._UPGRADES`).
    EventsImported: ("events_imported", 2),
}

# The call events (one per journaled call) and the action each is named by: in the audit's rows, the
# runs index's counts and the CLI. Every other map of a call event to its action is derived from this one.
CALL_ACTIONS: Dict[type, str] = {
    GenerationRecorded: "generated",
    ReplayServed: "replayed",
    CallBypassed: "bypassed",
    CallRefused: "refused",
}
# The call event classes and their actions, in that order (the audit's rows, the runs index's counts).
CALL_EVENT_TYPES: Tuple[type, ...] = tuple(CALL_ACTIONS)
ACTIONS: Tuple[str, ...] = tuple(CALL_ACTIONS.values())


def field_names(cls: type) -> Tuple[FrozenSet[str], FrozenSet[str]]:
    """The names of an attrs class's fields, and of those a stored body must hold (the fields without a default)."""
    fields = attrs.fields(cls)
    return (frozenset(f.name for f in fields), frozenset(f.name for f in fields if f.default is attrs.NOTHING))


def call_refs(event: Any) -> List[PayloadRef]:
    """The payloads an event names (its output, and a recorded call's stored input)."""
    if isinstance(event, GenerationRecorded):
        return [r for r in (event.output, event.input) if r is not None]
    if isinstance(event, ReplayServed):
        return [event.output]
    return []


# Bump when a key of an audit row (`AuditRecord.to_json`) or a `RunSummary.to_json` changes meaning or disappears; adding keys keeps the version.
AUDIT_SCHEMA_VERSION = 1


def iso_time(ts: Optional[float]) -> Optional[str]:
    """A Unix time as ISO-8601 UTC with milliseconds (``2026-01-31T12:00:00.123Z``)."""
    if ts is None:
        return None
    moment = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
