"""`StepRanges.from_steps`: a set of steps as the fewest ranges, the one range-compacting helper."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepjournal.policies import SpecError, StepRanges


def test_consecutive_steps_are_joined_into_ranges():
    assert str(StepRanges.from_steps([7, 1, 2, 3, 4, 5, 5])) == "1-5,7"
    assert str(StepRanges.from_steps([4, 5])) == "4-5"
    assert str(StepRanges.from_steps([])) == ""


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_from_steps_holds_exactly_the_steps_and_its_text_parses_back(steps):
    ranges = StepRanges.from_steps(steps)
    assert list(ranges) == sorted(steps)
    assert all(r.stop - r.start >= 0 and r.stride == 1 for r in ranges.ranges)
    # No two ranges touch: the compaction is the shortest.
    assert all(b.start > a.stop + 1 for a, b in zip(ranges.ranges, ranges.ranges[1:]))
    if steps:
        assert list(StepRanges.parse(str(ranges))) == sorted(steps)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_a_step_that_is_not_a_non_negative_int_is_refused(bad):
    with pytest.raises(SpecError, match="non-negative int"):
        StepRanges.from_steps([1, bad])
