"""The same-step prompt check: an exact replay is served only for the prompts it was recorded with.

A trainer replaying into a journal with another dataset (or shuffled differently) asks at step s
for completions of other prompts than the ones recorded at step s. Serving them would train on
completions of prompts the batch does not hold. `SamePromptsAtSameStep` wraps the user's policy: when
the policy serves the record of the call's own (step, index) and that record's input digest differs
from the call's, the record is set aside and the policy asked again as if it were not recorded, so
the policy's own rule for an unrecorded call applies (``cache`` generates and stores it, ``replay``
refuses). Replays of another step's record (``repeat``, ``nearest`` ...) are served as the policy
decided; ``verify_input=True`` checks those too.
"""

from __future__ import annotations

import bisect
from typing import Any, List, Optional

from stepjournal import RecordedGeneration
from stepjournal.policies import CallContext, GenerateCall, JournalView, Policy, RefuseCall, ServeRecorded, StepRanges

__all__ = ["SamePromptsAtSameStep", "PROMPTS_DIFFER"]

# How a refusal for different prompts begins (the adapter raises it as `InputMismatchError`).
PROMPTS_DIFFER = "the prompts differ from the ones recorded"


class _WithoutRecord(JournalView):
    """A view in which one (step, gen_index) reads as never recorded (its step too, when it was the only call).

    Built only when a same-step replay met other prompts, so reading the step list here is rare.
    """

    __slots__ = ("_hidden", "_left")

    def __init__(self, view: JournalView, step: int, gen_index: int) -> None:
        super().__init__(view._journal, run=view.run, mode=view.mode)
        self.scope = view.scope
        self._hidden = (step, gen_index)
        self._left: Optional[List[int]] = None

    def restricted(self, scope: StepRanges) -> JournalView:
        return _WithoutRecord(super().restricted(scope), *self._hidden)

    def lookup(self, step: int, gen_index: int = 0) -> Optional[RecordedGeneration]:
        if (step, gen_index) == self._hidden:
            return None
        return super().lookup(step, gen_index)

    def recorded_indices(self, step: int) -> List[int]:
        return [i for i in super().recorded_indices(step) if (step, i) != self._hidden]

    def recorded_steps(self) -> List[int]:
        if self._left is None:
            step = self._hidden[0]
            self._left = [s for s in super().recorded_steps() if s != step or self.recorded_indices(step)]
        return list(self._left)

    def step_count(self) -> int:
        return len(self.recorded_steps())

    def nth_step(self, n: int) -> int:
        return self.recorded_steps()[n]

    def nearest_below(self, step: int) -> Optional[int]:
        steps = self.recorded_steps()
        i = bisect.bisect_left(steps, step)
        return steps[i - 1] if i > 0 else None

    def nearest_above(self, step: int) -> Optional[int]:
        steps = self.recorded_steps()
        i = bisect.bisect_right(steps, step)
        return steps[i] if i < len(steps) else None


class SamePromptsAtSameStep:
    """`policy`, but an exact replay of a record made for other prompts is decided as a miss.

    Args:
        policy: the user's policy.

    Attributes:
        name: the wrapped policy's name (what the audit shows).
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name: str = policy.name

    def __repr__(self) -> str:
        return f"SamePromptsAtSameStep({self.policy!r})"

    def decide(self, ctx: CallContext, view: JournalView) -> Any:
        decision = self.policy.decide(ctx, view)
        if not isinstance(decision, ServeRecorded):
            return decision
        source = decision.source
        recorded = source.event.input_digest
        if (source.step, source.gen_index) != (ctx.step, ctx.gen_index) or recorded is None or ctx.input_digest is None:
            return decision  # another step's data, or nothing to compare (an input that was not stored)
        if recorded == ctx.input_digest:
            return decision
        why = (
            f"{PROMPTS_DIFFER} at step {ctx.step} index {ctx.gen_index} (input digest {ctx.input_digest[:16]}, "
            f"recorded {recorded[:16]})"
        )
        again = self.policy.decide(ctx, _WithoutRecord(view, ctx.step, ctx.gen_index))
        if isinstance(again, RefuseCall):
            return RefuseCall(
                reason=f"{why}: refused to replay them ({again.reason}); replay into a trainer with the recorded "
                "dataset and order, or pass check_prompts='off' to attach() to serve them anyway",
                policy=again.policy,
            )
        if isinstance(again, GenerateCall):
            return GenerateCall(reason=f"{why}; {again.reason}", store=again.store, policy=again.policy)
        return again
