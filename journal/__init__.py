"""stepjournal: record, replay and audit the rollouts of RL training, in an append-only LMDB journal.

The top-level package is the journal; policies live in `stepjournal.policies` and the adapters for
verl, TRL and raw loops in `stepjournal.adapters`.
"""

# Names are imported on first use (PEP 562), so `import stepjournal` stays light: the command
# line's --help and --version, and a verb that reads only events, never load torch or numpy.
from .base._version import __version__

_MODULE_OF_NAMES = {
    "index._samples": ("Sample",),
    "index._audit": ("AuditRecord", "session_names", "summarize_runs"),
    "payloads._codec": ("CodecRegistry", "decode_payload", "default_registry", "describe_payload", "encode_payload", "register_codec"),
    "tools._compare": ("Comparison", "Difference", "compare_values"),
    "tools._diff": ("diff_journals",),
    "tools._tool_rows": ("ToolCallRow", "ToolStepSummary", "first_tool_difference", "tool_call_rows",
                          "tool_step_summaries"),
    "tools._diff_report": ("DIFF_SCHEMA_VERSION", "DiffReport", "DiffSide", "PairDiff"),
    "base._errors": ("CodecPluginError", "DiffError", "EventDecodeError", "ImportClaimError", "ImportConflictError", "IntegrityError", "InvalidKeyError", "PayloadStoreError", "JournalClosedError", "JournalError", "JournalFormatError", "JournalFullError", "JournalLockedError", "PayloadDecodeError", "PayloadMissingError", "RemoteConfigError", "RemoteConflictError", "RemoteCredentialsError", "RemoteError", "RemoteFormatError", "RemoteMissingError", "RemotePlainHttpError", "RemoteRegionError", "RemoteUnreachableError", "RemoteUrlSecretError", "StepJournalError", "UnknownCodecError", "UnknownEventTypeError", "UnsafePathError", "UnsupportedSchemaVersionError", "UnsupportedValueError"),
    "events._events": ("AUDIT_SCHEMA_VERSION", "CallBypassed", "CallRefused", "EventsImported", "GenerationRecorded", "PayloadRef", "PayloadsReleased", "ReplayServed", "SessionOpened"),
    "index._runs_index": ("RunSummary",),
    "events._tool_calls": ("CATCH_UP_POLICY", "EVERY_TOOL", "SERVING_RULES", "MAX_CALL", "MAX_SAMPLE", "MAX_TURN", "TOOL_STAGE_PREFIX", "ToolCallError", "ToolCallKey",
                           "ToolRequest", "ToolResponse", "canonical_arguments", "tool_of_stage", "tool_stage"),
    "upkeep._retention": ("Retention", "RetentionConflictError", "RetentionError", "RetentionPlan", "PlannedRelease", "plan_retention"),
    "upkeep._prune": ("prune", "find_release"),
    "upkeep._compact": ("compact", "CompactError", "JournalBusyError"),
    "tools._export": ("EXPORT_FORMAT_VERSION", "ExportError", "OpaqueReader", "OpaqueValue", "export_payloads"),
    "_journal": ("DEFAULT_RUN", "Journal", "PreparedPayload", "RecordedGeneration", "VerifyProblem"),
    "base._paths": ("resolve_journal_path",),
    "payloads._object_store": ("ObjectPayloadStore", "open_payload_store"),
    "payloads._payload_store": ("LmdbPayloadStore",),
    "payloads._store_protocol": ("PayloadStore", "PayloadStoreBase"),
    "sharing._remote": ("PushReport", "push"),
    "sharing._pull": ("PullReport", "clone", "pull"),
    "sharing._remotes_config": ("NamedRemote", "PullWords", "add_remote", "list_remotes", "pull_words", "remove_remote",
                        "resolve_clone_source", "resolve_remote", "user_config_folder"),
    "sharing._status": ("RemoteStatus", "remote_status"),
    "sharing._bundle": ("BundleReport", "export_bundle", "import_bundle", "verify_bundle"),
    "base._secrets": ("redact",),
    "base._version": ("JOURNAL_FORMAT",),
    "tools._tolerance": ("DTYPE_TOLERANCES", "Tolerance", "Tolerances"),
}
_MODULE_OF = {name: module for module, names in _MODULE_OF_NAMES.items() for name in names}

# The public names are the map's (each once, where it lives), the version and the lazy `journaled`.
__all__ = ["__version__", *_MODULE_OF, "journaled"]


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is not None:
        import importlib

        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value
    # `journaled` lives with the adapters (adapters -> policies -> journal); it is offered here,
    # imported on first use, because wrapping a function is the first thing most users do.
    if name == "journaled":
        from stepjournal.adapters import journaled

        return journaled
    raise AttributeError(f"module 'stepjournal' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
