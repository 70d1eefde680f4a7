"""What a policy sees (a call context and a read-only journal view) and what it returns (a decision)."""

from __future__ import annotations

from typing import List, Optional, Protocol, Tuple, Union, runtime_checkable

import attrs

from stepjournal import Journal, RecordedGeneration

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
    """One generate call, as a policy sees it.

    Attributes:
        run: the run key the call belongs to.
        step: the train step.
        gen_index: which call within the step (0 for the first; DAPO makes several).
        mode: ``"train"``, ``"validate"`` ...
        input_digest: digest of the call's input, when the adapter computed one.
    """

    run: str
    step: int
    gen_index: int = 0
    mode: str = "train"
    input_digest: Optional[str] = None


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


class JournalView:
    """A read-only view of one (run, mode) of a journal: all a policy may look at.

    Args:
        journal: the journal to read.
        run: the run key to read (defaults to the journal's).
        mode: the mode whose recordings are visible.

    A view made by `restricted` shows only the recorded steps inside its `scope`; every method
    answers as if the other steps had never been recorded.
    """

    __slots__ = ("_journal", "run", "mode", "scope", "_spans", "_steps")

    def __init__(self, journal: Journal, *, run: Optional[str] = None, mode: str = "train") -> None:
        self._journal = journal
        self.run = run or journal.run
        self.mode = mode
        self.scope: Optional[StepRanges] = None  # None: every recorded step is visible
        self._spans: Optional[List[Tuple[int, Optional[int]]]] = None
        self._steps: Optional[List[int]] = None

    def restricted(self, scope: StepRanges) -> "JournalView":
        """A view of the same run and mode that shows only recorded steps inside `scope`."""
        if self.scope is not None:
            raise ValueError(f"this view is already restricted to steps {self.scope}; restrict the full view")
        view = JournalView(self._journal, run=self.run, mode=self.mode)
        view.scope = StepRanges(scope)
        view._spans = _spans(view.scope)
        return view

    def _visible(self, step: int) -> bool:
        return self.scope is None or step in self.scope

    def lookup(self, step: int, gen_index: int = 0) -> Optional[RecordedGeneration]:
        """The recorded generation at (step, gen_index), or None."""
        if not self._visible(step):
            return None
        return self._journal.lookup(step, gen_index, mode=self.mode, run=self.run)

    def recorded_steps(self) -> List[int]:
        """Every recorded step, ascending (a copy: prefer the methods below on long runs)."""
        steps = self._journal.recorded_steps(mode=self.mode, run=self.run)
        return steps if self.scope is None else [s for s in steps if s in self.scope]

    def step_count(self) -> int:
        """How many distinct steps are recorded."""
        if self.scope is None:
            return self._journal.step_count(mode=self.mode, run=self.run)
        if self._spans is None:
            return len(self._filtered())
        return sum(self._span_count(a, b) for a, b in self._spans)

    def nth_step(self, n: int) -> int:
        """The n-th recorded step in ascending order (negative n counts from the end)."""
        if self.scope is None:
            return self._journal.nth_step(n, mode=self.mode, run=self.run)
        if self._spans is None:
            return self._filtered()[n]
        count = self.step_count()
        index = n + count if n < 0 else n
        if not 0 <= index < count:
            raise IndexError(f"recorded step {n} of {count} in steps {self.scope}")
        for a, b in self._spans:
            here = self._span_count(a, b)
            if index < here:
                return self._journal.nth_step(self._rank(a) + index, mode=self.mode, run=self.run)
            index -= here
        raise AssertionError("unreachable: index was checked against the count")

    def nearest_below(self, step: int) -> Optional[int]:
        """The largest recorded step smaller than `step`, or None."""
        if self.scope is None:
            return self._journal.nearest_below(step, mode=self.mode, run=self.run)
        if self._spans is None:
            earlier = [s for s in self._filtered() if s < step]
            return earlier[-1] if earlier else None
        for a, b in reversed(self._spans):
            if a >= step:
                continue
            found = self._journal.nearest_below(step if b is None else min(step, b + 1), mode=self.mode, run=self.run)
            if found is not None and found >= a:
                return found
        return None

    def nearest_above(self, step: int) -> Optional[int]:
        """The smallest recorded step larger than `step`, or None."""
        if self.scope is None:
            return self._journal.nearest_above(step, mode=self.mode, run=self.run)
        if self._spans is None:
            later = [s for s in self._filtered() if s > step]
            return later[0] if later else None
        for a, b in self._spans:
            if b is not None and b <= step:
                continue
            found = self._journal.nearest_above(max(step, a - 1), mode=self.mode, run=self.run)
            if found is not None and (b is None or found <= b):
                return found
        return None

    def recorded_indices(self, step: int) -> List[int]:
        """The generation indices recorded at `step`, ascending."""
        if not self._visible(step):
            return []
        return self._journal.recorded_indices(step, mode=self.mode, run=self.run)

    # -- restricted views --------------------------------------------------------------------------
    # The journal answers rank queries only through nth_step, so counting the recorded steps of a
    # span is a binary search over it: O(log^2 n) reads of the in-memory projection per span.
    def _rank(self, step: int) -> int:
        """How many recorded steps (of the whole run and mode) are smaller than `step`."""
        lo, hi = 0, self._journal.step_count(mode=self.mode, run=self.run)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._journal.nth_step(mid, mode=self.mode, run=self.run) < step:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _span_count(self, a: int, b: Optional[int]) -> int:
        end = self._journal.step_count(mode=self.mode, run=self.run) if b is None else self._rank(b + 1)
        return end - self._rank(a)

    def _filtered(self) -> List[int]:
        """Scoped steps for a scope with strides (no span form): one filtered copy per view."""
        if self._steps is None:
            self._steps = self.recorded_steps()
        return self._steps

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
        name: how the audit names it (e.g. ``"cache"``, ``"dump@1-5"``).
    """

    name: str

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:  # pragma: no cover - protocol
        ...


def is_policy(obj: object) -> bool:
    """True when `obj` has a string `name` and a callable `decide`."""
    return isinstance(getattr(obj, "name", None), str) and callable(getattr(obj, "decide", None))


def _spans(scope: StepRanges) -> Optional[List[Tuple[int, Optional[int]]]]:
    """`scope` as sorted, disjoint (first, last) spans (last None: open), or None when it has strides."""
    if any(r.stride != 1 for r in scope.ranges):
        return None
    spans: List[Tuple[int, Optional[int]]] = []
    for r in sorted(scope.ranges, key=lambda r: r.start):
        if spans and (spans[-1][1] is None or r.start <= spans[-1][1] + 1):
            last = spans[-1][1]
            spans[-1] = (spans[-1][0], None if last is None or r.stop is None else max(last, r.stop))
        else:
            spans.append((r.start, r.stop))
    return spans
