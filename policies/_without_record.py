"""`WithoutRecord`: a journal view in which one recorded call reads as never recorded.

The engine's same-step prompt check (`EngineOptions.check_prompts`) asks the policy again through
this view when the call's own record was made for other prompts, so the policy's own rule for an
unrecorded call applies (``cache`` generates and stores it, ``replay`` refuses).
"""

from __future__ import annotations

import bisect
from typing import List, Optional

from stepjournal import Journal
from stepjournal.index import RecordedGeneration
from stepjournal.vocabulary import DEFAULT_MODE, DEFAULT_STAGE

from ._base import JournalView
from ._ranges import StepRanges

__all__ = ["WithoutRecord"]


class WithoutRecord(JournalView):
    """`view` with the record at (step, gen_index) hidden (and its step, when that was its only call).

    Built only when a same-step replay met other prompts, so reading the step list here is rare.
    """

    __slots__ = ("_hidden", "_left")

    def __init__(self, journal: Journal, step: int, gen_index: int, *, run: Optional[str] = None,
                 mode: str = DEFAULT_MODE, stage: str = DEFAULT_STAGE, scope: Optional[StepRanges] = None) -> None:
        super().__init__(journal, run=run, mode=mode, stage=stage)
        self.scope = scope
        self._hidden = (step, gen_index)
        self._left: Optional[List[int]] = None

    def restricted(self, scope: StepRanges) -> JournalView:
        plain = super().restricted(scope)  # refuses a view restricted already
        return WithoutRecord(self._journal, *self._hidden, run=self.run, mode=self.mode, stage=self.stage,
                             scope=plain.scope)

    def lookup(self, step: int, gen_index: int = 0) -> Optional[RecordedGeneration]:
        if (step, gen_index) == self._hidden:
            return None
        return super().lookup(step, gen_index)

    def recorded_indices(self, step: int, start: int = 0, stop: Optional[int] = None) -> List[int]:
        return [i for i in super().recorded_indices(step, start, stop) if (step, i) != self._hidden]

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
