"""Errors of the verl adapter, under stepjournal's one base class."""

from __future__ import annotations

from stepjournal.errors import StepJournalError

__all__ = ["VerlAdapterError", "VerlStepError", "MissingInputError", "NoOutcomeError", "PickleRefusedError",
           "VerlDumpError", "RecordedToolError"]


class VerlAdapterError(StepJournalError):
    """Base of the verl adapter's errors."""


class VerlStepError(VerlAdapterError, ValueError):
    """The train step of a generate call could not be found (no ``global_steps``, malformed uid ...)."""


class MissingInputError(VerlAdapterError):
    """A call was served from a record that stored no input batch, so the matching batch is unknown.

    Records imported from verl's SkipManager dumps have no input; pass ``missing="keep"`` to
    `JournaledRollout.matching_batch` to keep the current batch anyway.
    """


class NoOutcomeError(VerlAdapterError):
    """`matching_batch` / `matching_input` cannot know whether the latest call was replayed.

    No generate call went through the journaled rollout in the calling thread or asyncio task, or
    the latest one has not finished. Rather than return the batch unchanged (right only when the
    call ran), it raises: call it after the generate call returns, where it was made, or pass the
    call's `Outcome` as ``outcome=``.
    """


class PickleRefusedError(VerlAdapterError):
    """verl's ``.dp`` dump files are Python pickles; importing them needs an explicit ``trust_pickle=True``."""


class VerlDumpError(VerlAdapterError):
    """A verl dump folder is not laid out as any verl version writes it, or a dump file is unreadable."""


class RecordedToolError(VerlAdapterError):
    """A journaled verl tool call raised when it was recorded; its replay raises this, with the same message.

    verl shows the model ``Error executing tool '<name>': <message>`` as it did when recording, so a replayed
    conversation reads the same text, and the tool does not run.
    """


# Tracebacks and reprs name each class by the public module users import it from, not this private one.
for _name in __all__:
    globals()[_name].__module__ = "stepjournal.adapters.verl"
del _name
