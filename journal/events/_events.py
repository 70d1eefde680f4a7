"""The event types of the journal: frozen attrs classes, the single source of truth.

Every journaled call (of the ``"generate"`` stage or of another stage: ``"reward"`` ...) leaves exactly one
call event (`GenerationRecorded`, `ReplayServed`, `CallBypassed` or `CallRefused`); a process that opens a
journal for writing leaves one `SessionOpened`. Everything else the journal knows (which steps are recorded,
the nearest recorded step, resume positions) is a projection of these events.
"""

from __future__ import annotations

import datetime
import math
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Tuple, Union

import attrs

from ._keys import DEFAULT_STAGE, check_key
from ._schema import (DIGEST, COMPRESSION, DURATION, GEN_INDEX, MODE, NBYTES, RUN, SEQ, SOURCE_RUN, STAGE, STEP,
                      TEXT, TIME, check_text, event_field, ref_kind, refuse)

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

# The validators of the fields that are not a call's (see `_schema` for why every field is checked).
_MIN_INT, _MAX_INT = -(1 << 63), (1 << 64) - 1
_refuse = refuse


def _text(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_text(attribute.name, value)


def _run_key(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_key(value, "train")


def check_fingerprint(fingerprint: Mapping[str, Any]) -> None:
    """Refuse a fingerprint that is not a map of names to JSON scalars (finite numbers, 64-bit ints).

    Raises:
        InvalidKeyError: naming the first bad key or value.
    """
    if not isinstance(fingerprint, Mapping):
        _refuse("fingerprint", fingerprint, "use a dict of names to str, int, float, bool or None")
    for key, value in fingerprint.items():
        check_text("fingerprint key", key)
        where = f"fingerprint value {key[:40]}"
        if isinstance(value, str):
            check_text(where, value)
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


_SEQ = SEQ.validator
_TS = TIME.validator


@attrs.frozen
class PayloadRef:
    """Where a payload is stored: its content digest and sizes.

    Attributes:
        digest: hex BLAKE3 digest of the encoded (uncompressed) payload; the key in `payloads`.
        nbytes: size of the encoded payload.
        stored_nbytes: size as stored (smaller when compressed).
        compression: ``"zstd"`` or ``None``.
    """

    digest: str = event_field(DIGEST)
    nbytes: int = event_field(NBYTES)
    stored_nbytes: int = event_field(NBYTES)
    compression: Optional[str] = event_field(COMPRESSION, default=None, optional=True)


@attrs.frozen
class SessionOpened:
    """A process opened the journal for writing under a run key and fingerprint."""

    session: str = attrs.field(validator=_text)
    run: str = attrs.field(validator=_run_key)
    fingerprint: Dict[str, FingerprintValue] = attrs.field(validator=_fingerprint)
    library_version: str = attrs.field(validator=_text)
    host: str = attrs.field(validator=_text)
    pid: int = event_field(NBYTES)
    ts: float = event_field(TIME)


REF = ref_kind(PayloadRef)

# The call events. Each field is declared once, here, with its kind (limits) and its audit columns
# (`_schema.event_field`): the fast decoder, the map reader and the audit row derive theirs from these
# classes. A payload's audit columns are its sizes and digest.
_OUTPUT = (("nbytes", "nbytes"), ("stored_nbytes", "stored_nbytes"), ("digest", "digest"))


@attrs.frozen
class _Call:
    """What every call event starts with: who made which call (its fields come first in each one's map)."""

    session: str = event_field(TEXT, audit=True)
    run: str = event_field(RUN, audit=True)
    step: int = event_field(STEP, audit=True)
    gen_index: int = event_field(GEN_INDEX, audit=True)
    mode: str = event_field(MODE, audit=True)


@attrs.frozen
class GenerationRecorded(_Call):
    """A call ran for real (or was imported); its output is stored unless `output` is None."""

    input_digest: Optional[str] = event_field(TEXT, optional=True, audit=True)
    output: Optional[PayloadRef] = event_field(REF, optional=True, audit=_OUTPUT)
    input: Optional[PayloadRef] = event_field(REF, optional=True)
    duration_s: float = event_field(DURATION, audit=True)
    policy: str = event_field(TEXT, audit=True)
    reason: str = event_field(TEXT, audit=True)
    ts: float = event_field(TIME, audit=True)
    imported_from: Optional[str] = event_field(TEXT, default=None, optional=True, audit=True)
    # Why a part of the call was left out (the output, the input), in words, for code to read without
    # parsing `reason`; None when nothing was, and in events written before the field existed.
    not_stored: Optional[str] = event_field(TEXT, default=None, optional=True, audit=True)
    stage: str = event_field(STAGE, default=DEFAULT_STAGE, audit=True)


@attrs.frozen
class ReplayServed(_Call):
    """A call was answered from a recorded one (of the same stage) instead of running."""

    input_digest: Optional[str] = event_field(TEXT, optional=True, audit=True)
    source_seq: int = event_field(SEQ, audit=True)
    source_run: str = event_field(SOURCE_RUN, audit=True)
    source_step: int = event_field(STEP, audit=True)
    source_gen_index: int = event_field(GEN_INDEX, audit=True)
    output: PayloadRef = event_field(REF, audit=_OUTPUT)
    policy: str = event_field(TEXT, audit=True)
    reason: str = event_field(TEXT, audit=True)
    ts: float = event_field(TIME, audit=True)
    duration_s: float = event_field(DURATION, default=0.0, audit=True)
    stage: str = event_field(STAGE, default=DEFAULT_STAGE, audit=True)


@attrs.frozen
class CallBypassed(_Call):
    """A call ran without the journal's involvement (e.g. validation); nothing stored."""

    policy: str = event_field(TEXT, audit=True)
    reason: str = event_field(TEXT, audit=True)
    ts: float = event_field(TIME, audit=True)
    duration_s: float = event_field(DURATION, default=0.0, audit=True)
    stage: str = event_field(STAGE, default=DEFAULT_STAGE, audit=True)


@attrs.frozen
class CallRefused(_Call):
    """A call was refused (replay miss, fingerprint or input mismatch): an error was raised."""

    policy: str = event_field(TEXT, audit=True)
    reason: str = event_field(TEXT, audit=True)
    ts: float = event_field(TIME, audit=True)
    stage: str = event_field(STAGE, default=DEFAULT_STAGE, audit=True)


def _digests(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, list):
        _refuse(attribute.name, value, "use a list of hex digests")
    for item in value:
        DIGEST.validator(_instance, attribute, item)


@attrs.frozen
class PayloadsReleased:
    """Retention released the payloads of one recorded generation (see `stepjournal.upkeep.Retention`).

    The record's event stays in the log; from here on `lookup` no longer serves it. `released` are
    the digests whose bytes were deleted; `retained` those of the record that a kept record still
    uses (content addressing), left in place.
    """

    run: str = event_field(RUN)
    step: int = event_field(STEP)
    gen_index: int = event_field(GEN_INDEX)
    mode: str = event_field(MODE)
    record_seq: int = event_field(SEQ)
    # mypy's attrs plugin reads every `event_field(...)` above as a field with a default (it knows only
    # attrs.field's own `default=`); these fields, like those above, have none.
    released: List[str] = attrs.field(validator=_digests)  # type: ignore[misc]
    retained: List[str] = attrs.field(validator=_digests)  # type: ignore[misc]
    rule: str = event_field(TEXT)
    reason: str = event_field(TEXT)
    ts: float = event_field(TIME)
    stage: str = event_field(STAGE, default=DEFAULT_STAGE)


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


Event = Union[
    SessionOpened, GenerationRecorded, ReplayServed, CallBypassed, CallRefused, PayloadsReleased, EventsImported
]
# The events of one journaled call: the keys of `CALL_ACTIONS` (a test checks they are the same classes).
CallEvent = Union[GenerationRecorded, ReplayServed, CallBypassed, CallRefused]

# Stable tag names and current schema versions. A tag, once written to a journal, is never renamed.
EVENT_TYPES: Dict[type, tuple[str, int]] = {
    SessionOpened: ("session_opened", 1),
    # v2: the call's `stage`; a v1 body (no stage) is a ``"generate"`` call (see `_convert._UPGRADES`).
    # v3: `not_stored`; a v2 body (none) reads it as None. A new key needs a new version: every reader refuses a
    # key it does not know, so without one an older stepjournal calls the event damaged instead of "upgrade".
    GenerationRecorded: ("generation_recorded", 3),
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


def call_refs(event: Event) -> List[PayloadRef]:
    """The payloads an event names (its output, and a recorded call's stored input)."""
    if isinstance(event, GenerationRecorded):
        return [r for r in (event.output, event.input) if r is not None]
    if isinstance(event, ReplayServed):
        return [event.output]
    return []


# Bump when a key of an audit row (`AuditRecord.to_json`) or a `RunSummary.to_json` changes meaning or disappears;
# adding keys keeps the version.
AUDIT_SCHEMA_VERSION = 1


def iso_time(ts: Optional[float]) -> Optional[str]:
    """A Unix time as ISO-8601 UTC with milliseconds (``2026-01-31T12:00:00.123Z``)."""
    if ts is None:
        return None
    moment = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
