"""Matching a live tool call to a recorded one, and the rule for a miss: pure decisions.

A live call is served the recorded response of the same request (same tool, same canonical
arguments: the same input digest) in the same sample and step, never another request's. Request
matching comes first; among the records of the same request, position decides (the same key first,
then the first not yet served to this sample). A stateful tool's calls are one sequence per sample:
its n-th live call is served only by the n-th record of the sample's recorded history, and once a
sample has missed, every later call of it misses (a recorded state is never mixed with a live one).

What a call knows beyond its `CallContext` (its key, request, the sample's position and first miss)
travels as data in `ToolCallFacts`; the decision reads nothing else but the read-only view.
"""

from __future__ import annotations

from typing import FrozenSet, List, Optional, Sequence, Tuple

import attrs

from stepjournal.events import SERVING_RULES, ToolCallKey, ToolRequest
from stepjournal.index import RecordedGeneration

from ._base import BypassCall, CallContext, Decision, GenerateCall, JournalView, RefuseCall, ServeRecorded, one_of
from ._builtin import Bypass, Cache, Dump, Passthrough, Replay
from ._errors import SpecError, ToolReplayMissError

__all__ = [
    "TOOL_RULES",
    "ToolCallFacts",
    "RecordedToolCall",
    "ToolPolicy",
    "ToolReplayMissError",
    "recorded_tool_calls",
    "sample_history",
    "match_tool_call",
    "tool_rule",
]

# The rules a tool stage takes: `cache` and `replay` serve recorded responses (a miss calls the tool
# and records it, or is refused); `dump` calls and records every call; `passthrough` calls and stores
# nothing; `bypass` calls outside the journal.
TOOL_RULES = (*SERVING_RULES, "dump", "passthrough", "bypass")




def tool_rule(policy: object, stage: str) -> str:
    """The rule (one of `TOOL_RULES`) a stage's policy means for a tool stage.

    Raises:
        SpecError: the policy serves other steps' or positions' records (``repeat``, ``nearest``, a
            schedule, a plugin), which a tool call never is: a response belongs to its own request.
    """
    if isinstance(policy, Replay):
        return "cache" if policy.on_missing == "generate" else "replay"
    for cls, rule in ((Cache, "cache"), (Dump, "dump"), (Passthrough, "passthrough"), (Bypass, "bypass")):
        if isinstance(policy, cls):
            return rule
    name = getattr(policy, "name", policy)
    raise SpecError(
        f"stage {stage!r}: policy {name!r} cannot decide tool calls; a tool stage takes one of "
        f"{', '.join(TOOL_RULES)} (a recorded response is served only to its own request, in its own sample and step)"
    )


@attrs.frozen
class ToolCallFacts:
    """What a tool call's session knows about it, beyond its `CallContext`.

    Attributes:
        key: the call's key (sample, turn, call).
        request: the call's request.
        stateful: the tool keeps state across a sample's calls (a sandbox, an environment).
        ordinal: the call's place among its sample's calls of this stage in this session (0 first).
        left_at: a stateful sample's first missed call in this session, or None while it follows the recording.
        served: the seqs of the records already served to this sample in this session.
    """

    key: ToolCallKey
    request: ToolRequest
    stateful: bool = False
    ordinal: int = 0
    left_at: Optional[ToolCallKey] = None
    served: FrozenSet[int] = frozenset()


@attrs.frozen
class RecordedToolCall:
    """A recorded tool call of the view's stage: its key and its record (whose input digest is its request's)."""

    key: ToolCallKey
    source: RecordedGeneration

    @property
    def request_digest(self) -> Optional[str]:
        return self.source.event.input_digest


def recorded_tool_calls(view: JournalView, step: int, sample: int) -> List[RecordedToolCall]:
    """The recorded calls of one sample at `step` in the view's stage, in key order (turn, then call)."""
    lo, hi = ToolCallKey.sample_span(sample)
    found = []
    for gen_index in view.recorded_indices(step, lo, hi):  # the sample's range of the index, not the step's
        source = view.lookup(step, gen_index)
        if source is not None:
            found.append(RecordedToolCall(ToolCallKey.from_gen_index(gen_index), source))
    return found


def sample_history(recorded: Sequence[RecordedToolCall]) -> List[RecordedToolCall]:
    """The one recorded history of a stateful sample: its calls in key order, less those older than a call
    before them.

    A session that left the recording at some call recorded its own calls from there on, at its own
    keys; the older recording's calls after that point (lower seqs after a higher one) belong to
    another run of the environment, and are left out.
    """
    history: List[RecordedToolCall] = []
    for call in recorded:
        if not history or call.source.seq > history[-1].source.seq:
            history.append(call)
    return history


def match_tool_call(facts: ToolCallFacts, request_digest: Optional[str],
                    recorded: Sequence[RecordedToolCall]) -> Tuple[Optional[RecordedToolCall], str]:
    """The record that answers a live call, or None with why not (pure).

    Args:
        facts: the call's key, request and its sample's state in this session.
        request_digest: the digest of the call's request (its input digest).
        recorded: the sample's recorded calls in the call's stage and step, in key order.
    """
    if facts.stateful:
        if facts.left_at is not None:
            return None, (f"the sample left the recording at {facts.left_at}; a stateful tool's later calls are "
                          "never served from it")
        history = sample_history(recorded)
        if facts.ordinal >= len(history):
            return None, (f"the recording of this sample has {len(history)} call(s) of this tool; "
                          f"this is call #{facts.ordinal}")
        found = history[facts.ordinal]
        if found.request_digest != request_digest:
            return None, f"call #{facts.ordinal} of the recording ({found.key}) made another request"
        return found, f"call #{facts.ordinal} of the sample, the same request"
    same = [call for call in recorded if call.request_digest == request_digest]
    if not same:
        return None, f"no call of this sample made this request ({len(recorded)} recorded call(s) of the tool)"
    for call in same:
        if call.key == facts.key:
            return call, "the same request at the same position"
    unserved = [call for call in same if call.source.seq not in facts.served]
    found = (unserved or same)[0]
    return found, f"the same request, recorded at {found.key}"


@attrs.frozen
class ToolPolicy:
    """The decision about one tool call under its stage's rule; made per call, with the call's facts.

    Args:
        rule: one of `TOOL_RULES`.
        facts: the call's `ToolCallFacts`.
    """

    rule: str = attrs.field(validator=one_of(TOOL_RULES))
    facts: ToolCallFacts

    @property
    def name(self) -> str:
        return self.rule

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        request = self.facts.request
        if self.rule == "dump":
            return GenerateCall(reason=f"dump: call {request.tool} and record it")
        if self.rule == "passthrough":
            return GenerateCall(reason=f"passthrough: call {request.tool}, store nothing", store=False)
        if self.rule == "bypass":
            return BypassCall(reason="bypass")
        found, why = match_tool_call(self.facts, ctx.input_digest,
                                     recorded_tool_calls(view, ctx.step, self.facts.key.sample))
        where = f"{self.facts.key} of step {ctx.step}"
        if found is not None:
            return ServeRecorded(found.source, reason=f"{self.rule}: recorded response at {found.key} ({why})")
        if self.rule == "cache":
            return GenerateCall(reason=f"cache: miss at {where}: {why}; call the tool and record it")
        return RefuseCall(
            reason=f"replay: no recorded response to {request} at {where}: {why}; record it first (cache or dump), "
            "or use cache to call the tool on a miss"
        )
