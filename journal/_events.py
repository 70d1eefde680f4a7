"""The event types of the journal: frozen attrs classes, the single source of truth.

Every generate call leaves exactly one call event (`GenerationRecorded`, `ReplayServed`,
`CallBypassed` or `CallRefused`); a process that opens a journal for writing leaves one
`SessionOpened`. Everything else the journal knows (which steps are recorded, the nearest recorded
step, resume positions) is a projection of these events.
"""

from __future__ import annotations

from typing import Dict, Optional, Union

import attrs

__all__ = [
    "PayloadRef",
    "SessionOpened",
    "GenerationRecorded",
    "ReplayServed",
    "CallBypassed",
    "CallRefused",
    "Event",
    "CallEvent",
    "EVENT_TYPES",
]

# Values a fingerprint may hold: JSON scalars, so that a journal can be read anywhere.
FingerprintValue = Union[str, int, float, bool, None]


@attrs.frozen
class PayloadRef:
    """Where a payload is stored: its content digest and sizes.

    Attributes:
        digest: hex BLAKE3 digest of the encoded (uncompressed) payload; the key in `payloads`.
        nbytes: size of the encoded payload.
        stored_nbytes: size as stored (smaller when compressed).
        compression: ``"zstd"`` or ``None``.
    """

    digest: str
    nbytes: int
    stored_nbytes: int
    compression: Optional[str] = None


@attrs.frozen
class SessionOpened:
    """A process opened the journal for writing under a run key and fingerprint."""

    session: str
    run: str
    fingerprint: Dict[str, FingerprintValue]
    library_version: str
    host: str
    pid: int
    ts: float


@attrs.frozen
class GenerationRecorded:
    """A generate call ran for real (or was imported); its output is stored unless `output` is None."""

    session: str
    run: str
    step: int
    gen_index: int
    mode: str
    input_digest: Optional[str]
    output: Optional[PayloadRef]
    input: Optional[PayloadRef]
    duration_s: float
    policy: str
    reason: str
    ts: float
    imported_from: Optional[str] = None


@attrs.frozen
class ReplayServed:
    """A generate call was answered from a recorded generation instead of running."""

    session: str
    run: str
    step: int
    gen_index: int
    mode: str
    input_digest: Optional[str]
    source_seq: int
    source_run: str
    source_step: int
    source_gen_index: int
    output: PayloadRef
    policy: str
    reason: str
    ts: float
    duration_s: float = 0.0


@attrs.frozen
class CallBypassed:
    """A generate call ran without the journal's involvement (e.g. validation); nothing stored."""

    session: str
    run: str
    step: int
    gen_index: int
    mode: str
    policy: str
    reason: str
    ts: float
    duration_s: float = 0.0


@attrs.frozen
class CallRefused:
    """A generate call was refused (replay miss, fingerprint or input mismatch): an error was raised."""

    session: str
    run: str
    step: int
    gen_index: int
    mode: str
    policy: str
    reason: str
    ts: float


CallEvent = Union[GenerationRecorded, ReplayServed, CallBypassed, CallRefused]
Event = Union[SessionOpened, GenerationRecorded, ReplayServed, CallBypassed, CallRefused]

# Stable tag names and current schema versions. A tag, once written to a journal, is never renamed.
EVENT_TYPES: Dict[type, tuple[str, int]] = {
    SessionOpened: ("session_opened", 1),
    GenerationRecorded: ("generation_recorded", 1),
    ReplayServed: ("replay_served", 1),
    CallBypassed: ("call_bypassed", 1),
    CallRefused: ("call_refused", 1),
}
