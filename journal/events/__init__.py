"""The events, the one source of the schema; the one converter and checksum rule; every key layout.

Public here: the event types a reader of `Journal.events()` meets, and the tool-call types (docs/agents.md).
The converter, the keys and the codecs of the events stay private to the journal.
"""

from typing import TYPE_CHECKING

from ..base._face import lazy_face

if TYPE_CHECKING:
    from ._events import (AUDIT_SCHEMA_VERSION, CallBypassed, CallRefused, EventsImported, GenerationRecorded,
                          PayloadRef, PayloadsReleased, ReplayServed, SessionOpened)
    from ._tool_calls import (CATCH_UP_POLICY, EVERY_TOOL, MAX_CALL, MAX_SAMPLE, MAX_TURN, SERVING_RULES,
                              TOOL_STAGE_PREFIX, ToolCallKey, ToolRequest, ToolResponse, canonical_arguments,
                              tool_of_stage, tool_stage)

__all__ = [
    "AUDIT_SCHEMA_VERSION",
    "CallBypassed",
    "CallRefused",
    "EventsImported",
    "GenerationRecorded",
    "PayloadRef",
    "PayloadsReleased",
    "ReplayServed",
    "SessionOpened",
    "CATCH_UP_POLICY",
    "EVERY_TOOL",
    "MAX_CALL",
    "MAX_SAMPLE",
    "MAX_TURN",
    "SERVING_RULES",
    "TOOL_STAGE_PREFIX",
    "ToolCallKey",
    "ToolRequest",
    "ToolResponse",
    "canonical_arguments",
    "tool_of_stage",
    "tool_stage",
]

__getattr__, __dir__ = lazy_face(globals())
