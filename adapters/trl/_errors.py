"""Errors of the TRL adapter, under stepjournal's one base class (no TRL needed to import them)."""

from __future__ import annotations

from stepjournal.errors import StepJournalError

__all__ = ["TrlAdapterError", "TrlSignatureError", "RecordedToolError"]


class TrlAdapterError(StepJournalError):
    """The TRL adapter cannot do what was asked; the message says what to change."""


class TrlSignatureError(TrlAdapterError):
    """The installed TRL (or a trainer subclass) no longer matches what the adapter intercepts."""


class RecordedToolError(TrlAdapterError):
    """A journaled TRL tool call raised when it was recorded; its replay raises this, with the same message.

    TRL shows the model ``{"error": str(error)}`` and counts a tool failure, as it did when recording: a
    replayed conversation reads the same text, and ``tools/failure_frequency`` is the recording's.
    """


# Tracebacks and reprs name each class by the public module users import it from, not this private one.
for _name in __all__:
    globals()[_name].__module__ = "stepjournal.adapters.trl"
del _name
