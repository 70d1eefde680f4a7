"""Errors of the TRL adapter, under stepjournal's one base class (no TRL needed to import them)."""

from __future__ import annotations

from stepjournal.errors import StepJournalError

__all__ = ["TrlAdapterError", "TrlSignatureError"]


class TrlAdapterError(StepJournalError):
    """The TRL adapter cannot do what was asked; the message says what to change."""


class TrlSignatureError(TrlAdapterError):
    """The installed TRL (or a trainer subclass) no longer matches what the adapter intercepts."""


# Tracebacks and reprs name each class by the public module users import it from, not this private one.
for _name in __all__:
    globals()[_name].__module__ = "stepjournal.adapters.trl"
del _name
