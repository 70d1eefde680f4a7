"""stepjournal: record, replay and audit the rollouts of RL training, in an append-only LMDB journal.

The top-level package is the journal; policies live in `stepjournal.policies` and the adapters for
verl, TRL and raw loops in `stepjournal.adapters`.
"""

from ._audit import AUDIT_SCHEMA_VERSION, AuditRecord, RunSummary, summarize_runs
from ._compare import Comparison, Difference, compare_values
from ._diff import diff_journals
from ._diff_report import DIFF_SCHEMA_VERSION, DiffReport, DiffSide, PairDiff
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
    PayloadMissingError,
    StepJournalError,
    UnknownCodecError,
    UnknownEventTypeError,
    UnsafePathError,
    UnsupportedSchemaVersionError,
    DiffError,
    UnsupportedValueError,
)
from ._export import EXPORT_FORMAT_VERSION, ExportError, OpaqueReader, OpaqueValue, export_payloads
from ._events import CallBypassed, CallRefused, GenerationRecorded, PayloadRef, ReplayServed, SessionOpened
from ._journal import DEFAULT_RUN, Journal, PreparedPayload, RecordedGeneration, VerifyProblem
from ._paths import resolve_journal_path
from ._payload_store import LmdbPayloadStore, PayloadStore
from ._tolerance import DTYPE_TOLERANCES, Tolerance, Tolerances
from ._version import __version__

__all__ = [
    "__version__",
    "Journal",
    "RecordedGeneration",
    "PreparedPayload",
    "VerifyProblem",
    "PayloadStore",
    "LmdbPayloadStore",
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
    "PayloadMissingError",
    "UnknownCodecError",
    "UnsupportedValueError",
    "journaled",
    "resolve_journal_path",
    "diff_journals",
    "DiffReport",
    "DiffSide",
    "PairDiff",
    "DIFF_SCHEMA_VERSION",
    "Tolerance",
    "Tolerances",
    "DTYPE_TOLERANCES",
    "Comparison",
    "Difference",
    "compare_values",
    "DiffError",
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
