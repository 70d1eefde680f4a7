"""What a policy sees (a call context and a read-only journal view) and what it returns (a decision)."""

from __future__ import annotations

from typing import List, Optional, Protocol, Union, runtime_checkable

import attrs

from stepjournal import Journal, RecordedGeneration

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
    """

    __slots__ = ("_journal", "run", "mode")

    def __init__(self, journal: Journal, *, run: Optional[str] = None, mode: str = "train") -> None:
        self._journal = journal
        self.run = run or journal.run
        self.mode = mode

    def lookup(self, step: int, gen_index: int = 0) -> Optional[RecordedGeneration]:
        """The recorded generation at (step, gen_index), or None."""
        return self._journal.lookup(step, gen_index, mode=self.mode, run=self.run)

    def recorded_steps(self) -> List[int]:
        """Every recorded step, ascending (a copy: prefer the methods below on long runs)."""
        return self._journal.recorded_steps(mode=self.mode, run=self.run)

    def step_count(self) -> int:
        """How many distinct steps are recorded."""
        return self._journal.step_count(mode=self.mode, run=self.run)

    def nth_step(self, n: int) -> int:
        """The n-th recorded step in ascending order (negative n counts from the end)."""
        return self._journal.nth_step(n, mode=self.mode, run=self.run)

    def nearest_below(self, step: int) -> Optional[int]:
        """The largest recorded step smaller than `step`, or None."""
        return self._journal.nearest_below(step, mode=self.mode, run=self.run)

    def nearest_above(self, step: int) -> Optional[int]:
        """The smallest recorded step larger than `step`, or None."""
        return self._journal.nearest_above(step, mode=self.mode, run=self.run)

    def recorded_indices(self, step: int) -> List[int]:
        """The generation indices recorded at `step`, ascending."""
        return self._journal.recorded_indices(step, mode=self.mode, run=self.run)

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
