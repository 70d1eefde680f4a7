"""`journaled_tool`: put any tool function (sync or async) of a hand-written agent loop under a journal.

The call's place (step, sample, turn) is given explicitly (``wrapped.at(step=, sample=, turn=)``) or by
`tool_turn`, a context that follows asyncio tasks (contextvars). The decisions are the `ToolEngine`'s.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from typing import Any, Callable, Iterator, Mapping, Optional, TypeVar, Union

import attrs

from stepjournal import Journal
from stepjournal.events import ToolResponse
from stepjournal.policies import EngineOptions, Policy, ToolEngine

__all__ = ["journaled_tool", "tool_turn", "ToolTurn", "current_tool_turn"]

F = TypeVar("F", bound=Callable[..., Any])


@attrs.frozen
class ToolTurn:
    """Where the tool calls made now belong: the train step, the sample within it, its turn, the mode."""

    step: int
    sample: int
    turn: int = 0
    mode: str = "train"


_TURN: contextvars.ContextVar[Optional[ToolTurn]] = contextvars.ContextVar("stepjournal_tool_turn", default=None)


@contextlib.contextmanager
def tool_turn(step: int, sample: int, turn: int = 0, mode: str = "train") -> Iterator[ToolTurn]:
    """Within this block (and the asyncio tasks it starts), journaled tools' calls are of this turn.

    Each asyncio task has its own copy of the context, so concurrent samples each set their own.
    """
    token = _TURN.set(ToolTurn(step, sample, turn, mode))
    try:
        yield _TURN.get()  # type: ignore[misc]
    finally:
        _TURN.reset(token)


def current_tool_turn() -> Optional[ToolTurn]:
    """The `ToolTurn` that `tool_turn` set for this context, or None."""
    return _TURN.get()


def _to_stored(result: Any) -> dict:
    """What the journal stores for a tool's return value: the response's four fields, what the tool
    returned (``"response"``, ``"text"`` or ``"value"``), and the value itself for a ``"value"``."""
    if isinstance(result, ToolResponse):
        return {**result.to_payload(), "returned": "response", "value": None}
    if isinstance(result, str):
        return {**ToolResponse(result).to_payload(), "returned": "text", "value": None}
    return {**ToolResponse(str(result)).to_payload(), "returned": "value", "value": result}


def _from_stored(stored: Mapping[str, Any]) -> Any:
    returned = stored["returned"]
    if returned == "text":
        return stored["text"]
    if returned == "value":
        return stored["value"]
    return ToolResponse.from_payload(stored)


def journaled_tool(
    fn: F,
    journal: Union[Journal, ToolEngine],
    name: Optional[str] = None,
    policy: Union[Policy, str, Mapping[str, Any], None] = None,
    *,
    environment: Optional[str] = None,
    options: Optional[EngineOptions] = None,
    **option_keywords: Any,
) -> F:
    """Wrap a tool so each call is recorded, replayed by its request, or a miss under the rule.

    The wrapped tool is called with keyword arguments only (a tool call's arguments are a JSON
    object): ``calc(expression="2+3")`` inside a `tool_turn` block, or
    ``calc.at(step=1, sample=0, turn=2)(expression="2+3")``. It returns what `fn` returns (a `str`,
    a `ToolResponse`, or any value the journal stores), recorded or replayed alike.

    Args:
        fn: the tool (``def`` or ``async def``), called as ``fn(**arguments)``.
        journal: an open, writable `Journal`, or a `ToolEngine` to share with other tools (tools of
            one stateful environment must share one, so their calls are one sequence per sample: with
            `environment`, a `Journal` is refused).
        name: the tool's name in its requests (default: `fn`'s name; a lambda's, ``<lambda>``, names
            no tool apart from the others, so a lambda needs one).
        policy: with a `Journal`: the rule (``"cache"`` by default, ``"replay"``, ``"dump"``,
            ``"passthrough"``, ``"bypass"``) or a per-stage spec naming ``tool.<name>`` stages. Not with a
            `ToolEngine` (it has its policy).
        environment: the stateful environment the tool belongs to (e.g. ``"sandbox"`` for its
            create/execute/release): its calls are in the stage ``tool.<environment>`` and are one
            sequence per sample. None: a stateless tool, stage ``tool.<name>``.
        options, **option_keywords: the engine's options, as `journaled` takes them (with a `Journal`).

    Raises:
        TypeError: `environment` with a `Journal` (not a shared `ToolEngine`), a policy with a `ToolEngine`.

    Returns:
        The wrapper, with ``at(step, sample, turn=0, mode="train", call=None)``, the `ToolEngine` as
        ``engine`` and the last call's `Outcome` as ``last_outcome``.
    """
    if isinstance(journal, ToolEngine):
        if policy is not None or options is not None or option_keywords:
            raise TypeError("journaled_tool got a ToolEngine: its policy and options are the engine's; pass neither")
        engine = journal
    elif environment is not None:
        # An engine of its own would follow this method's calls alone, not the environment's one sequence per sample.
        raise TypeError(f"journaled_tool(environment={environment!r}): the tools of a stateful environment share one "
                        "ToolEngine: pass ToolEngine(journal, policy) as `journal` to each of them")
    else:
        engine = ToolEngine(journal, "cache" if policy is None else policy, options=options, **option_keywords)
    tool = name or getattr(fn, "__name__", None)
    if not tool or (name is None and tool.startswith("<")):
        # '<lambda>' is every lambda's name: two such tools would be one tool, served each other's responses.
        raise TypeError(f"journaled_tool cannot name {fn!r} apart from other tools: pass name=")
    is_async = inspect.iscoroutinefunction(fn)

    def place(turn: Optional[ToolTurn]) -> ToolTurn:
        if turn is None:
            raise TypeError(
                f"tool {tool!r} is journaled: call it inside `with tool_turn(step=, sample=, turn=):`, or as "
                f"{tool}.at(step=..., sample=..., turn=...)(**arguments)"
            )
        return turn

    def refuse_positional(args: tuple) -> None:
        if args:
            raise TypeError(f"journaled tool {tool!r} takes keyword arguments only (its call's JSON arguments)")

    def bound(turn: Optional[ToolTurn], call: Optional[int]) -> Callable[..., Any]:
        if is_async:
            async def run_async(*args: Any, **arguments: Any) -> Any:
                refuse_positional(args)
                where = place(turn or _TURN.get())
                outcome = await engine.acall(
                    tool, arguments, lambda: fn(**arguments), step=where.step, sample=where.sample, turn=where.turn,
                    call=call, mode=where.mode, environment=environment, to_stored=_to_stored,
                    from_stored=_from_stored,
                )
                wrapper.last_outcome = outcome  # type: ignore[attr-defined]
                return outcome.value

            return run_async

        def run(*args: Any, **arguments: Any) -> Any:
            refuse_positional(args)
            where = place(turn or _TURN.get())
            outcome = engine.call(
                tool, arguments, lambda: fn(**arguments), step=where.step, sample=where.sample, turn=where.turn,
                call=call, mode=where.mode, environment=environment, to_stored=_to_stored, from_stored=_from_stored,
            )
            wrapper.last_outcome = outcome  # type: ignore[attr-defined]
            return outcome.value

        return run

    wrapper = functools.wraps(fn)(bound(None, None))

    def at(step: int, sample: int, turn: int = 0, mode: str = "train",
           call: Optional[int] = None) -> Callable[..., Any]:
        """The tool, bound to an explicit place (and call index within the turn, when given)."""
        return bound(ToolTurn(step, sample, turn, mode), call)

    wrapper.at = at  # type: ignore[attr-defined]
    wrapper.engine = engine  # type: ignore[attr-defined]
    wrapper.last_outcome = None  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
