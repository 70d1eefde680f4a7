"""What several verbs share: opening a journal read-only, parsing --steps, choosing the run."""

from __future__ import annotations

from typing import Optional

from stepjournal import Journal, StepJournalError
from stepjournal.policies import StepRanges

from ._render import UsageError

__all__ = ["open_readonly", "parse_steps", "choose_run"]


def open_readonly(path: str) -> Journal:
    return Journal(path, readonly=True)


def choose_run(journal: Journal, run: Optional[str]) -> str:
    """`stepjournal._export.choose_run`, imported when called: the export module loads torch."""
    from stepjournal._export import choose_run as choose

    return choose(journal, run)


def parse_steps(text: Optional[str]) -> Optional[StepRanges]:
    """``--steps`` as `StepRanges` (None when not given); a bad range is a usage error."""
    if text is None:
        return None
    try:
        return StepRanges.parse(text)
    except StepJournalError as exc:
        # The parser draws a caret under the bad character on later lines; one line is enough here.
        raise UsageError(f"--steps: {str(exc).splitlines()[0]}") from None
