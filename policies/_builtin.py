"""The built-in policies. Each is a frozen attrs class with a pure `decide`.

| policy        | recorded (hit)                   | not recorded (miss)                              |
|---------------|----------------------------------|--------------------------------------------------|
| `dump`        | generate and store               | generate and store                               |
| `replay`      | serve the same (step, index)     | raise `ReplayMissError` (or generate and store)  |
| `cache`       | serve the same (step, index)     | generate and store                               |
| `repeat`      | serve step S[(s-1) mod len(S)]   | nothing recorded: generate and store             |
| `repeat_last` | serve the last recorded step     | nothing recorded: generate and store             |
| `nearest`     | exact, else largest earlier, else smallest later step | nothing recorded: generate and store |
| `passthrough` | generate, store nothing (journaled)| generate, store nothing (journaled)            |
| `bypass`      | generate outside the journal (journaled as bypassed) | same                         |

In a `Schedule`, `repeat`, `repeat_last` and `nearest` get a view restricted to the steps earlier
recording clauses cover (``dump@1-5;repeat`` cycles through 1-5 only); their reasons name that scope.
"""

from __future__ import annotations

from typing import Literal, Optional

import attrs

from ._base import BypassCall, CallContext, Decision, GenerateCall, JournalView, RefuseCall, ServeRecorded, one_of

__all__ = [
    "Dump",
    "Replay",
    "Cache",
    "Repeat",
    "RepeatLast",
    "Nearest",
    "Passthrough",
    "Bypass",
    "BUILTIN_POLICIES",
]


def _where(ctx: CallContext) -> str:
    return f"step {ctx.step} index {ctx.gen_index}"


def _within(view: JournalView) -> str:
    """How a reason names the steps a restricted view shows (see `Schedule`)."""
    scope = getattr(view, "scope", None)
    return "" if scope is None else f" in steps {scope}"


@attrs.frozen
class Dump:
    """Generate every call and store its output."""

    name: str = attrs.field(default="dump", init=False)

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        return GenerateCall(reason="dump: generate and store")


@attrs.frozen
class Replay:
    """Serve the generation recorded at the same (step, index).

    Args:
        on_missing: ``"error"`` (default) refuses a call that was never recorded; ``"generate"``
            generates and stores it instead.
    """

    on_missing: Literal["error", "generate"] = attrs.field(
        default="error", validator=one_of(("error", "generate"))
    )
    name: str = attrs.field(default="replay", init=False)

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        found = view.lookup(ctx.step, ctx.gen_index)
        if found is not None:
            return ServeRecorded(found, reason=f"replay: recorded at {_where(ctx)}")
        if self.on_missing == "generate":
            return GenerateCall(reason=f"replay: nothing recorded at {_where(ctx)}, on_missing=generate")
        pruned = view.released(ctx.step, ctx.gen_index) if hasattr(view, "released") else None
        if pruned is not None:
            return RefuseCall(
                reason=f"replay: nothing to replay at {_where(ctx)} (mode {ctx.mode!r}, run {ctx.run!r}): {pruned}; "
                "keep the step (pin it) next time, or use cache to generate it again"
            )
        unstored = view.not_stored(ctx.step, ctx.gen_index) if hasattr(view, "not_stored") else None
        if unstored is not None:
            return RefuseCall(
                reason=f"replay: nothing to replay at {_where(ctx)} (mode {ctx.mode!r}, run {ctx.run!r}): {unstored}; "
                "make the output storable as that says and record the step again (dump or cache), "
                "or use cache or replay(on_missing=generate) to generate it now"
            )
        return RefuseCall(
            reason=f"replay: nothing recorded at {_where(ctx)} (mode {ctx.mode!r}, run {ctx.run!r}); "
            "record it first, or use replay(on_missing=generate) or cache"
        )


@attrs.frozen
class Cache:
    """Serve the generation recorded at the same (step, index); otherwise generate and store it."""

    name: str = attrs.field(default="cache", init=False)

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        found = view.lookup(ctx.step, ctx.gen_index)
        if found is not None:
            return ServeRecorded(found, reason=f"cache: hit at {_where(ctx)}")
        return GenerateCall(reason=f"cache: miss at {_where(ctx)}, generate and store")


@attrs.frozen
class Repeat:
    """Cycle through the recorded steps in ascending order: step s is served by S[(s-1) mod len(S)].

    This is verl's RolloutSkip v2 `repeat` for steps after `max_dump_step`. With nothing recorded yet
    the call is generated and stored (verl raised IndexError).
    """

    name: str = attrs.field(default="repeat", init=False)

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        count = view.step_count()
        if count == 0:
            return GenerateCall(reason=f"repeat: nothing recorded{_within(view)} yet, generate and store")
        source_step = view.nth_step((ctx.step - 1) % count)
        found = view.serve_from(source_step, ctx.gen_index)
        assert found is not None  # a step in the projection has at least one record
        return ServeRecorded(
            found, reason=f"repeat: step {ctx.step} -> recorded step {source_step} of {count}{_within(view)}"
        )


@attrs.frozen
class RepeatLast:
    """Serve the last (largest) recorded step; with nothing recorded yet, generate and store."""

    name: str = attrs.field(default="repeat_last", init=False)

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        if view.step_count() == 0:
            return GenerateCall(reason=f"repeat_last: nothing recorded{_within(view)} yet, generate and store")
        source_step = view.nth_step(-1)
        found = view.serve_from(source_step, ctx.gen_index)
        assert found is not None
        return ServeRecorded(found, reason=f"repeat_last: recorded step {source_step}{_within(view)}")


@attrs.frozen
class Nearest:
    """Serve the same step if recorded, else the largest earlier recorded step, else the smallest later.

    This is verl SkipManager's `repeat`. With nothing recorded at all, generate and store.
    """

    name: str = attrs.field(default="nearest", init=False)

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        exact = view.lookup(ctx.step, ctx.gen_index)
        if exact is not None:
            return ServeRecorded(exact, reason=f"nearest: exact {_where(ctx)}")
        source_step: Optional[int]
        if view.recorded_indices(ctx.step):
            source_step = ctx.step
        else:
            source_step = view.nearest_below(ctx.step)
            if source_step is None:
                source_step = view.nearest_above(ctx.step)
        if source_step is None:
            return GenerateCall(reason=f"nearest: nothing recorded{_within(view)} yet, generate and store")
        found = view.serve_from(source_step, ctx.gen_index)
        assert found is not None
        return ServeRecorded(found, reason=f"nearest: step {ctx.step} -> recorded step {source_step}{_within(view)}")


@attrs.frozen
class Passthrough:
    """Generate every call and store nothing; the call is still journaled."""

    name: str = attrs.field(default="passthrough", init=False)

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        return GenerateCall(reason="passthrough: generate, store nothing", store=False)


@attrs.frozen
class Bypass:
    """Run every call outside record and replay; journaled as bypassed."""

    name: str = attrs.field(default="bypass", init=False)

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        return BypassCall(reason="bypass")


# Names usable in spec strings and configs, mapped to their classes.
BUILTIN_POLICIES = {
    "dump": Dump,
    "replay": Replay,
    "cache": Cache,
    "repeat": Repeat,
    "repeat_last": RepeatLast,
    "nearest": Nearest,
    "passthrough": Passthrough,
    "bypass": Bypass,
}
