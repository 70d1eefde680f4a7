"""What a policy sees (a call context and a read-only journal view) and what it returns (a decision)."""

from __future__ import annotations

import bisect
from typing import (
    Any, Callable, List, Optional, Protocol, Sequence, Tuple, TypedDict, TypeGuard, Union, runtime_checkable,
)

import attrs

from stepjournal import Journal
from stepjournal.errors import SpecError
from stepjournal.events import GenerationRecorded
from stepjournal.index import RecordedGeneration
from stepjournal.upkeep import find_release
from stepjournal.vocabulary import DEFAULT_MODE, DEFAULT_STAGE

from ._ranges import StepRanges

__all__ = [
    "CallContext",
    "JournalView",
    "GenerateCall",
    "ServeRecorded",
    "RefuseCall",
    "BypassCall",
    "Decision",
    "Policy",
    "is_policy",
]


@attrs.frozen
class CallContext:
    """One journaled call, as a policy sees it.

    Attributes:
        run: the run key the call belongs to.
        step: the train step.
        gen_index: which call within the step and stage (0 for the first; DAPO makes several).
        mode: ``"train"``, ``"validate"`` ...
        input_digest: digest of the call's input (with the weights version, when given), when the
            adapter computed one; always present for a stage other than ``"generate"``.
        stage: which stage of the step (``"generate"``, ``"reward"``, ``"ref_log_prob"`` ...).
    """

    run: str
    step: int
    gen_index: int = 0
    mode: str = DEFAULT_MODE
    input_digest: Optional[str] = None
    stage: str = DEFAULT_STAGE


@attrs.frozen
class GenerateCall:
    """Run the generator; store its output when `store` is true."""

    reason: str
    store: bool = True
    policy: Optional[str] = None


@attrs.frozen
class ServeRecorded:
    """Serve `source` (a recorded generation) instead of running the generator."""

    source: RecordedGeneration
    reason: str
    policy: Optional[str] = None


@attrs.frozen
class RefuseCall:
    """Neither run nor replay: raise an error that carries `reason`."""

    reason: str
    policy: Optional[str] = None


@attrs.frozen
class BypassCall:
    """Run the generator outside the journal's record/replay (journaled as bypassed, nothing stored)."""

    reason: str
    policy: Optional[str] = None


Decision = Union[GenerateCall, ServeRecorded, RefuseCall, BypassCall]


class _Where(TypedDict):
    """The keyword arguments that name a view's (run, mode, stage) in the journal's queries."""

    mode: str
    run: str
    stage: str


class JournalView:
    """A read-only view of one (run, mode, stage) of a journal: all a policy may look at.

    Args:
        journal: the journal to read.
        run: the run key to read (defaults to the journal's).
        mode: the mode whose recordings are visible.
        stage: the stage whose recordings are visible (default ``"generate"``).

    A view made by `restricted` shows only the recorded steps inside its `scope`; every method
    answers as if the other steps had never been recorded.
    """

    __slots__ = ("_journal", "run", "mode", "stage", "scope", "_visible_steps", "_where")

    def __init__(
        self, journal: Journal, *, run: Optional[str] = None, mode: str = DEFAULT_MODE, stage: str = DEFAULT_STAGE
    ) -> None:
        self._journal = journal
        self.run = run or journal.run
        self.mode = mode
        self.stage = stage
        self._where: _Where = {"mode": mode, "run": self.run, "stage": stage}
        self.scope: Optional[StepRanges] = None  # None: every recorded step is visible
        self._visible_steps: Optional[List[int]] = None

    def restricted(self, scope: StepRanges) -> "JournalView":
        """A view of the same run and mode that shows only recorded steps inside `scope`."""
        if self.scope is not None:
            raise ValueError(f"this view is already restricted to steps {self.scope}; restrict the full view")
        view = JournalView(self._journal, run=self.run, mode=self.mode, stage=self.stage)
        view.scope = StepRanges(scope)
        return view

    def _range(self) -> Optional[Tuple[int, Optional[int]]]:
        """(start, stop) when the scope is one range of stride 1, which the journal answers directly."""
        assert self.scope is not None
        ranges = self.scope.ranges
        if len(ranges) == 1 and ranges[0].stride == 1:
            return ranges[0].start, ranges[0].stop
        return None

    def _steps(self) -> List[int]:
        """The visible recorded steps, ascending, for a scope of several ranges or a stride.

        Read once per restricted view (one per call) with the journal's range query, so it costs the
        steps in scope, not the whole history.
        """
        if self._visible_steps is None:
            assert self.scope is not None
            parts = []
            for r in self.scope.ranges:
                part = self._journal.recorded_steps(**self._where, start=r.start, stop=r.stop)
                parts.append(part if r.stride == 1 else [s for s in part if (s - r.start) % r.stride == 0])
            self._visible_steps = parts[0] if len(parts) == 1 else sorted(set().union(*parts))
        return self._visible_steps

    def lookup(self, step: int, gen_index: int = 0) -> Optional[RecordedGeneration]:
        """The recorded generation at (step, gen_index), or None."""
        if self.scope is not None and step not in self.scope:
            return None
        return self._journal.lookup(step, gen_index, **self._where)

    def released(self, step: int, gen_index: int = 0) -> Optional[str]:
        """When retention released the call's record (so `lookup` no longer serves it): what, when and
        under which rule, in words; else None. Reads the log: for a refusal's message, not a decision."""
        found = find_release(self._journal, step, gen_index, mode=self.mode, run=self.run, stage=self.stage)
        if found is None:
            return None
        seq, event = found
        return (f"its record (event #{event.record_seq}) was pruned by event #{seq} at unix time {event.ts:.0f}: "
                f"{event.reason} (rule: {event.rule})")

    def not_stored(self, step: int, gen_index: int = 0) -> Optional[str]:
        """When the call was generated but its output not stored (the codec refused it, or the policy
        stores nothing), so `lookup` has nothing to serve: which event and why, in words; else None.
        Reads the log: for a refusal's message, not a decision. The why is the event's `not_stored`
        field; an event written before that field existed has it None and is quoted by its reason."""
        if self.scope is not None and step not in self.scope:
            return None
        found: Optional[Tuple[int, GenerationRecorded]] = None
        for seq, event in self._journal.events(run=self.run, steps={step}, types=[GenerationRecorded]):
            if isinstance(event, GenerationRecorded) and (event.mode, event.gen_index, event.stage) == (
                    self.mode, gen_index, self.stage):
                found = (seq, event) if event.output is None else None
        if found is None:
            return None
        seq, event = found
        if event.not_stored is None:  # written before the field existed: its reason ends with the why
            return f"it was generated (event #{seq}) but not stored; its reason: {event.reason}"
        return f"it was generated (event #{seq}) but not stored: {event.not_stored}"

    def recorded_steps(self) -> List[int]:
        """Every recorded step, ascending (a copy: prefer the methods below on long runs)."""
        if self.scope is None:
            return self._journal.recorded_steps(**self._where)
        return list(self._steps())

    def step_count(self) -> int:
        """How many distinct steps are recorded."""
        if self.scope is None:
            return self._journal.step_count(**self._where)
        span = self._range()
        if span is not None:
            return self._journal.step_count(**self._where, start=span[0], stop=span[1])
        return len(self._steps())

    def nth_step(self, n: int) -> int:
        """The n-th recorded step in ascending order (negative n counts from the end)."""
        if self.scope is None:
            return self._journal.nth_step(n, **self._where)
        span = self._range()
        if span is not None:
            return self._journal.nth_step(n, **self._where, start=span[0], stop=span[1])
        return self._steps()[n]

    def nearest_below(self, step: int) -> Optional[int]:
        """The largest recorded step smaller than `step`, or None."""
        if self.scope is None:
            return self._journal.nearest_below(step, **self._where)
        span = self._range()
        if span is not None:
            start, stop = span
            below = step if stop is None else min(step, stop + 1)
            found = self._journal.nearest_below(below, **self._where)
            return found if found is not None and found >= start else None
        steps = self._steps()
        i = bisect.bisect_left(steps, step)
        return steps[i - 1] if i > 0 else None

    def nearest_above(self, step: int) -> Optional[int]:
        """The smallest recorded step larger than `step`, or None."""
        if self.scope is None:
            return self._journal.nearest_above(step, **self._where)
        span = self._range()
        if span is not None:
            start, stop = span
            found = self._journal.nearest_above(max(step, start - 1), **self._where)
            return found if found is not None and (stop is None or found <= stop) else None
        steps = self._steps()
        i = bisect.bisect_right(steps, step)
        return steps[i] if i < len(steps) else None

    def recorded_indices(self, step: int, start: int = 0, stop: Optional[int] = None) -> List[int]:
        """The generation indices recorded at `step`, ascending (only ``start <= index < stop`` when given)."""
        if self.scope is not None and step not in self.scope:
            return []
        return self._journal.recorded_indices(step, **self._where, start=start, stop=stop)

    def serve_from(self, step: int, gen_index: int) -> Optional[RecordedGeneration]:
        """The record of `step` that answers call `gen_index` when serving from another step.

        The call with the same index is served when that step recorded it; a step recorded with fewer
        calls serves its calls again in order (index ``gen_index mod count``), so DAPO's extra calls
        still get data that was really generated.
        """
        indices = self.recorded_indices(step)
        if not indices:
            return None
        chosen = gen_index if gen_index in indices else indices[gen_index % len(indices)]
        return self.lookup(step, chosen)


@runtime_checkable
class Policy(Protocol):
    """A pure decision about one generate call: no I/O, no clocks, no globals.

    Attributes:
        name: how the audit names it (e.g. ``"cache"``, ``"dump@1-5"``); read only, so a property serves too.
    """

    @property
    def name(self) -> str:  # read-only: a frozen policy (a `StagePolicies`, an attrs class) is one too
        ...

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:  # pragma: no cover - protocol
        ...


def one_of(allowed: Sequence[Any]) -> Callable[[Any, "attrs.Attribute[Any]", Any], None]:
    """An attrs validator of a policy's option that takes only `allowed`: any other value is a `SpecError`
    naming the policy, the option, the value and the values it takes."""
    choices = tuple(allowed)

    def check(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if value not in choices:
            raise SpecError.not_one_of(type(instance).__name__, attribute.name, value, choices)

    return check


def is_policy(obj: object) -> TypeGuard[Policy]:
    """True when `obj` has a string `name` and a callable `decide`."""
    return isinstance(getattr(obj, "name", None), str) and callable(getattr(obj, "decide", None))

