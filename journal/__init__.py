"""stepjournal: record, replay and audit the rollouts of RL training, in an append-only LMDB journal.

The top-level package is the journal; policies live in `stepjournal.policies` and the adapters for
verl, TRL and raw loops in `stepjournal.adapters`.
"""

from ._audit import AUDIT_SCHEMA_VERSION, AuditRecord, RunSummary, summarize_runs
from ._codec import CodecRegistry, decode_payload, default_registry, describe_payload, encode_payload, register_codec
from ._errors import (
    EventDecodeError,
    IntegrityError,
    InvalidKeyError,
    JournalClosedError,
    JournalError,
    JournalFullError,
    JournalLockedError,
    PayloadDecodeError,
    StepJournalError,
    UnknownCodecError,
    UnknownEventTypeError,
    UnsafePathError,
    UnsupportedSchemaVersionError,
    UnsupportedValueError,
)
from ._export import EXPORT_FORMAT_VERSION, ExportError, OpaqueReader, OpaqueValue, export_payloads
from ._events import CallBypassed, CallRefused, GenerationRecorded, PayloadRef, ReplayServed, SessionOpened
from ._journal import DEFAULT_RUN, Journal, PreparedPayload, RecordedGeneration, VerifyProblem
from ._paths import resolve_journal_path
from ._version import __version__

__all__ = [
    "__version__",
    "Journal",
    "RecordedGeneration",
    "PreparedPayload",
    "VerifyProblem",
    "AuditRecord",
    "RunSummary",
    "AUDIT_SCHEMA_VERSION",
    "summarize_runs",
    "DEFAULT_RUN",
    "PayloadRef",
    "SessionOpened",
    "GenerationRecorded",
    "ReplayServed",
    "CallBypassed",
    "CallRefused",
    "CodecRegistry",
    "default_registry",
    "register_codec",
    "encode_payload",
    "decode_payload",
    "describe_payload",
    "StepJournalError",
    "JournalError",
    "JournalClosedError",
    "JournalFullError",
    "JournalLockedError",
    "InvalidKeyError",
    "UnsafePathError",
    "IntegrityError",
    "EventDecodeError",
    "UnknownEventTypeError",
    "UnsupportedSchemaVersionError",
    "PayloadDecodeError",
    "UnknownCodecError",
    "UnsupportedValueError",
    "journaled",
    "resolve_journal_path",
    "export_payloads",
    "EXPORT_FORMAT_VERSION",
    "ExportError",
    "OpaqueReader",
    "OpaqueValue",
]


def __getattr__(name: str):
    # `journaled` lives with the adapters (adapters -> policies -> journal); it is offered here,
    # imported on first use, because wrapping a function is the first thing most users do.
    if name == "journaled":
        from stepjournal.adapters import journaled

        return journaled
    raise AttributeError(f"module 'stepjournal' has no attribute {name!r}")
