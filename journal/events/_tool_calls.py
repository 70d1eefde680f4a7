"""The words of a journaled tool call, shared by every room: its stage, key, request and response.

A tool (or environment) call is a call event of its own, in the stage ``tool.<name>``. Its key is
(sample, turn, call index within the turn), laid into the call index of the journal's key
(`ToolCallKey.gen_index`), so the journal's own index finds a sample's calls by a range. Its input is
the request (`ToolRequest`: the tool's name and its arguments as canonical JSON), so the input digest
names the request; its output is the response (`ToolResponse`: text, tool reward, metrics, images).
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Mapping, Optional, Tuple

import attrs

from ..base._errors import ToolCallError
from ._keys import check_stage

__all__ = [
    "TOOL_STAGE_PREFIX",
    "EVERY_TOOL",
    "SERVING_RULES",
    "CATCH_UP_POLICY",
    "MAX_SAMPLE",
    "MAX_TURN",
    "MAX_CALL",
    "ToolCallError",
    "ToolCallKey",
    "ToolRequest",
    "ToolResponse",
    "canonical_arguments",
    "tool_stage",
    "tool_of_stage",
]

# Every tool's calls are in a stage of its own, named with this prefix and the tool's (or environment's) name.
TOOL_STAGE_PREFIX = "tool."
# In a per-stage spec, the entry for every tool stage the spec does not name itself (``tools:replay``).
EVERY_TOOL = "tools"
# The rules that serve recorded responses: a call they record is a miss (the tool ran).
SERVING_RULES = ("cache", "replay")
# The policy name of a stateful tool's catch-up calls (journaled as bypassed): a served call run
# again on the live environment before the sample's first miss.
CATCH_UP_POLICY = "catch-up"
# The key's three fields share the journal's 32-bit call index: 16 bits of sample, 8 of turn, 8 of call.
_TURN_BITS, _CALL_BITS = 8, 8
MAX_SAMPLE = (1 << 16) - 1
MAX_TURN = (1 << _TURN_BITS) - 1
MAX_CALL = (1 << _CALL_BITS) - 1




def tool_stage(name: str) -> str:
    """The stage of a tool's (or a stateful environment's) calls: ``tool.<name>``.

    Raises:
        ToolCallError: `name` is empty or cannot be part of a stage (NUL, not UTF-8, too long).
    """
    if not isinstance(name, str) or not name:
        raise ToolCallError(f"tool name {name!r} is not valid: use a non-empty string (e.g. 'calculator')")
    stage = TOOL_STAGE_PREFIX + name
    try:
        check_stage(stage)
    except ValueError as exc:
        raise ToolCallError(f"tool name {name!r} is not valid: {exc}") from None
    return stage


def tool_of_stage(stage: str) -> Optional[str]:
    """The tool a stage journals (``"tool.calculator"`` -> ``"calculator"``), or None for another stage."""
    if stage.startswith(TOOL_STAGE_PREFIX) and len(stage) > len(TOOL_STAGE_PREFIX):
        return stage[len(TOOL_STAGE_PREFIX):]
    return None


def _refuse_constant(name: str) -> Any:
    raise ToolCallError(f"tool arguments hold {name}, which JSON cannot carry: pass a finite number or a string")


def _checked(value: Any, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolCallError(f"tool argument {path} is {value!r}: JSON holds finite numbers only; pass a string")
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ToolCallError(f"tool argument {path} has the key {key!r}: JSON object keys are strings")
            _checked(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _checked(item, f"{path}[{i}]")


def canonical_arguments(arguments: Any) -> str:
    """A tool call's arguments as canonical JSON: sorted keys, no whitespace, UTF-8 text kept as it is.

    Two calls with the same arguments give the same text (so the same request digest), whatever the
    order their keys came in. A JSON text is parsed first (a model's tool call carries its arguments so).

    Raises:
        ToolCallError: the arguments are not a JSON object (a mapping, or text of one), or hold NaN or
            an infinity, a non-string key, or a value JSON has no form for, or nest too deeply (a value
            that holds itself too).
    """
    try:
        return _canonical(arguments)
    except RecursionError:  # a model's runaway nesting, or a value that holds itself
        raise ToolCallError(
            "tool arguments nest too deeply for JSON (or hold themselves): pass a flatter object") from None


def _canonical(arguments: Any) -> str:
    if isinstance(arguments, (str, bytes)):
        try:
            arguments = json.loads(arguments, parse_constant=_refuse_constant)
        except ValueError as exc:
            if isinstance(exc, ToolCallError):
                raise
            raise ToolCallError(
                f"tool arguments {str(arguments)[:80]!r} are not JSON ({exc}); pass a JSON object") from None
    if not isinstance(arguments, Mapping):
        raise ToolCallError(
            f"tool arguments must be a JSON object (a mapping of names to values), not {type(arguments).__name__}"
        )
    _checked(arguments, "arguments")
    try:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ToolCallError(f"tool arguments cannot be written as JSON: {exc}; pass JSON values only") from None


@attrs.frozen(order=True)
class ToolCallKey:
    """Where a tool call sits in its step: which sample, which turn of it, which call within the turn.

    Attributes:
        sample: the sample's index within the step (0 to `MAX_SAMPLE`).
        turn: the turn of the sample's conversation (0 to `MAX_TURN`).
        call: the call's index within the turn (0 to `MAX_CALL`).
    """

    sample: int
    turn: int = 0
    call: int = 0

    def __attrs_post_init__(self) -> None:
        for label, value, top in (("sample", self.sample, MAX_SAMPLE), ("turn", self.turn, MAX_TURN),
                                  ("call", self.call, MAX_CALL)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
                raise ToolCallError(f"tool call {label} {value!r} is not valid: use an int from 0 to {top}")

    @property
    def gen_index(self) -> int:
        """The journal's call index this key is stored at (sample, turn and call, in that order of bits)."""
        return (self.sample << (_TURN_BITS + _CALL_BITS)) | (self.turn << _CALL_BITS) | self.call

    @classmethod
    def from_gen_index(cls, gen_index: int) -> "ToolCallKey":
        """The key a tool stage's call index holds."""
        return cls(gen_index >> (_TURN_BITS + _CALL_BITS), (gen_index >> _CALL_BITS) & MAX_TURN, gen_index & MAX_CALL)

    @staticmethod
    def sample_span(sample: int) -> Tuple[int, int]:
        """The call indices of one sample's calls: ``lo <= gen_index < hi``."""
        lo = ToolCallKey(sample).gen_index
        return lo, lo + (1 << (_TURN_BITS + _CALL_BITS))

    def __str__(self) -> str:
        return f"s{self.sample}.t{self.turn}.c{self.call}"


@attrs.frozen
class ToolRequest:
    """What a tool call asked for: the tool's name and its arguments as canonical JSON.

    It is the call's stored input, so the call's input digest names it: a recorded response is served
    only to a request with the same digest. Build one with `ToolRequest.of`.

    Attributes:
        tool: the tool's name (``"calculator"``, ``"sandbox.execute"``).
        arguments: the arguments as `canonical_arguments` writes them.
    """

    tool: str
    arguments: str

    @classmethod
    def of(cls, tool: str, arguments: Any) -> "ToolRequest":
        """The request of a call of `tool` with `arguments` (a mapping, or JSON text of an object)."""
        if not isinstance(tool, str) or not tool:
            raise ToolCallError(f"tool name {tool!r} is not valid: use a non-empty string")
        return cls(tool, canonical_arguments(arguments))

    def parsed_arguments(self) -> Dict[str, Any]:
        """The arguments as Python values (a dict)."""
        return json.loads(self.arguments)

    def to_payload(self) -> Dict[str, str]:
        """The stored form (the call's input)."""
        return {"tool": self.tool, "arguments": self.arguments}

    @classmethod
    def from_payload(cls, payload: Any) -> "ToolRequest":
        """The request a stored input holds.

        Raises:
            ToolCallError: the payload is not a stored request.
        """
        if not isinstance(payload, Mapping) or set(payload) != {"tool", "arguments"}:
            raise ToolCallError(f"stored value {str(payload)[:80]!r} is not a tool request")
        return cls.of(payload["tool"], payload["arguments"])

    def __str__(self) -> str:
        return f"{self.tool}({self.arguments})"


@attrs.frozen
class ToolResponse:
    """What a tool call answered.

    Attributes:
        text: the text the model reads next.
        reward: the tool's reward for the call, when it gives one.
        metrics: the tool's own figures (JSON values).
        images: images it returned, as tensors (or numpy arrays).
    """

    text: str = ""
    reward: Optional[float] = None
    metrics: Mapping[str, Any] = attrs.field(factory=dict)
    images: Tuple[Any, ...] = attrs.field(default=(), converter=tuple)

    def to_payload(self) -> Dict[str, Any]:
        """The stored form (a plain dict the journal's codec encodes, tensors included)."""
        return {"text": self.text, "reward": self.reward, "metrics": dict(self.metrics), "images": list(self.images)}

    @classmethod
    def from_payload(cls, payload: Any) -> "ToolResponse":
        """The response a stored output holds (keys an adapter stores beside the four are left out).

        Raises:
            ToolCallError: the payload is not a stored response.
        """
        if not isinstance(payload, Mapping) or not {"text", "reward", "metrics", "images"} <= set(payload):
            raise ToolCallError(f"stored value {str(payload)[:80]!r} is not a tool response")
        return cls(payload["text"], payload["reward"], payload["metrics"], payload["images"])
