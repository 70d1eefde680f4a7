"""`StepRanges`: which train steps a clause applies to, parsed from text like ``"1-10,20,30-40:2,50-"``."""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import attrs

from ._errors import SpecError

__all__ = ["StepRange", "StepRanges"]

_MAX_DIGITS = len(str((1 << 63) - 1))


@attrs.frozen
class StepRange:
    """Steps ``start, start+stride, ...`` up to `stop` inclusive (`stop` None: no end)."""

    start: int
    stop: Optional[int]
    stride: int = 1

    def __contains__(self, step: object) -> bool:
        if not isinstance(step, int) or isinstance(step, bool) or step < self.start:
            return False
        if self.stop is not None and step > self.stop:
            return False
        return (step - self.start) % self.stride == 0

    def __str__(self) -> str:
        if self.stop == self.start:
            return str(self.start)
        text = f"{self.start}-{'' if self.stop is None else self.stop}"
        return text if self.stride == 1 else f"{text}:{self.stride}"


def _as_ranges(value: object) -> Tuple[StepRange, ...]:
    """What `StepRanges(...)` accepts: range text, another `StepRanges`, or an iterable of `StepRange`."""
    if isinstance(value, str):
        return _Parser(value).parse().ranges
    if isinstance(value, StepRanges):
        return value.ranges
    items = tuple(value) if isinstance(value, (tuple, list)) else None
    if items is None or not all(isinstance(item, StepRange) for item in items):
        raise SpecError(
            f"StepRanges takes range text like '1-10,20' or a tuple of StepRange, got {type(value).__name__} "
            f"{value!r}; for a collection of step numbers use StepRanges.of(steps)"
        )
    return items


@attrs.frozen
class StepRanges:
    """A union of inclusive step ranges, with strides and open ends.

    Grammar: items separated by commas; an item is ``N`` (one step), ``A-B`` (A to B inclusive),
    ``A-`` (A and every later step), each range optionally followed by ``:K`` (every K-th step from
    A). ``"*"`` means every step. Whitespace is ignored.

    ``StepRanges("1-10,20")`` is ``StepRanges.parse("1-10,20")``; ``StepRanges((StepRange(1, 10),))``
    builds it from ranges.

    Example: ``StepRanges.parse("1-10,20,30-40:2,50-")`` contains 1..10, 20, 30, 32, ..., 40 and 50 on.
    """

    ranges: Tuple[StepRange, ...] = attrs.field(converter=_as_ranges)

    @classmethod
    def parse(cls, text: str) -> "StepRanges":
        """Parse range text.

        Raises:
            SpecError: the text is malformed; the message shows the bad character with a caret.
        """
        if not isinstance(text, str):
            raise SpecError(f"step ranges must be a string like '1-10,20', got {type(text).__name__} {text!r}")
        return _Parser(text).parse()

    @classmethod
    def every(cls) -> "StepRanges":
        """All steps."""
        return cls((StepRange(0, None),))

    @classmethod
    def of(cls, steps) -> "StepRanges":
        """The given steps (an iterable of ints), as single-step ranges."""
        out = []
        for s in sorted(set(steps)):
            if not isinstance(s, int) or isinstance(s, bool) or s < 0:
                raise SpecError(f"step {s!r} is not a non-negative int")
            out.append(StepRange(s, s))
        return cls(tuple(out))

    def __contains__(self, step: object) -> bool:
        return any(step in r for r in self.ranges)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.ranges)

    def is_finite(self) -> bool:
        return all(r.stop is not None for r in self.ranges)

    def __iter__(self) -> Iterator[int]:
        """The steps in ascending order, each once (only for finite ranges)."""
        if not self.is_finite():
            raise SpecError(f"step ranges {self} are open-ended and cannot be listed")
        seen = sorted({s for r in self.ranges for s in range(r.start, r.stop + 1, r.stride)})  # type: ignore[operator]
        return iter(seen)

    @classmethod
    def from_steps(cls, steps) -> "StepRanges":
        """The given steps (an iterable of ints), runs of consecutive steps joined: ``str()`` is ``"1-5,7"``.

        Raises:
            SpecError: a step is not a non-negative int.
        """
        given = list(steps)
        for s in given:
            if not isinstance(s, int) or isinstance(s, bool) or s < 0:
                raise SpecError(f"step {s!r} is not a non-negative int")
        out: list = []
        for s in sorted(set(given)):
            if out and out[-1].stop == s - 1:
                out[-1] = StepRange(out[-1].start, s)
            else:
                out.append(StepRange(s, s))
        return cls(tuple(out))


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str, at: Optional[int] = None) -> SpecError:
        at = self.pos if at is None else at
        shown = self.text if self.text else "<empty>"
        caret = " " * at + "^"
        return SpecError(f"bad step ranges: {what} at position {at}\n  {shown}\n  {caret}")

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def number(self, what: str) -> int:
        self.skip_space()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "0123456789":
            self.pos += 1
        if start == self.pos:
            found = repr(self.text[self.pos]) if self.pos < len(self.text) else "end of text"
            raise self.fail(f"expected {what}, found {found}")
        if self.pos - start > _MAX_DIGITS:  # int() refuses 4 300 digits and more; no step has 20
            raise self.fail(f"{what} of {self.pos - start} digits: steps go up to 2**63-1 ({_MAX_DIGITS} digits)",
                            at=start)
        return int(self.text[start : self.pos])

    def parse(self) -> StepRanges:
        if self.peek() == "*":
            self.pos += 1
            if self.peek():
                raise self.fail(f"unexpected {self.peek()!r} after '*'")
            return StepRanges.every()
        items = [self.item()]
        while self.peek() == ",":
            self.pos += 1
            items.append(self.item())
        if self.peek():
            raise self.fail(f"unexpected {self.peek()!r}; expected ',' between items")
        return StepRanges(tuple(items))

    def item(self) -> StepRange:
        begin = self.pos
        start = self.number("a step number")
        if self.peek() != "-":
            if self.peek() == ":":
                raise self.fail("a stride ':K' needs a range 'A-B' before it")
            return StepRange(start, start)
        self.pos += 1
        stop: Optional[int] = None
        if self.peek() and self.peek() in "0123456789":
            stop = self.number("the range's last step")
            if stop < start:
                raise self.fail(f"range {start}-{stop} ends before it starts", at=begin)
        stride = 1
        if self.peek() == ":":
            self.pos += 1
            at = self.pos
            stride = self.number("a stride")
            if stride < 1:
                raise self.fail("a stride must be at least 1", at=at)
        # "4-4:3" is the single step 4; normalise so that equal sets print and compare the same.
        return StepRange(start, stop, 1 if stop == start else stride)
