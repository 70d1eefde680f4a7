"""What several verbs share: opening a journal read-only, parsing --steps and the key flags, choosing the run."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Dict, Iterable, Optional

from stepjournal import Journal
from stepjournal.errors import StepJournalError
from stepjournal.index import RunSummary, session_names
from stepjournal.vocabulary import DEFAULT_MODE, DEFAULT_STAGE, check_key

from ._render import UsageError

if TYPE_CHECKING:  # the policies package loads the engine: imported when --steps is given
    from stepjournal.policies import StepRanges

__all__ = ["open_readonly", "parse_steps", "key_word", "choose_run", "names_of_sessions"]


def open_readonly(path: str, check: str = "open") -> Journal:
    """The journal read-only; ``check="as-read"`` checks data.mdb's trees as they are read (see `Journal`)."""
    return Journal(path, readonly=True, check=check)


def choose_run(journal: Journal, run: Optional[str]) -> str:
    """`stepjournal.tools._export.choose_run`, imported when called: the export module loads torch."""
    from stepjournal.tools import choose_run as choose

    return choose(journal, run)


def parse_steps(text: Optional[str]) -> Optional[StepRanges]:
    """``--steps`` as `StepRanges` (None when not given); a bad range is a usage error."""
    if text is None:
        return None
    from stepjournal.policies import StepRanges

    try:
        return StepRanges.parse(text)
    except StepJournalError as exc:
        # The parser draws a caret under the bad character on later lines; one line is enough here.
        raise UsageError(f"--steps: {str(exc).splitlines()[0]}") from None


class key_word:  # noqa: N801 - used as a type, as argparse's own `FileType`
    """An argparse ``type`` for ``--run``, ``--mode`` or ``--stage`` (``part``): a value no journal can hold
    (empty, NUL, too long for a key) is a usage error naming it, never a filter that quietly matches everything
    or nothing."""

    def __init__(self, part: str) -> None:
        if part not in ("run", "mode", "stage"):
            raise ValueError(f"key_word part {part!r}: use 'run', 'mode' or 'stage'")
        self.part = part

    def __call__(self, value: str) -> str:
        key = {"run": "default", "mode": DEFAULT_MODE, "stage": DEFAULT_STAGE}
        key[self.part] = value
        try:
            check_key(key["run"], key["mode"], key["stage"])
        except StepJournalError as exc:
            raise argparse.ArgumentTypeError(str(exc).splitlines()[0]) from None
        return value


def names_of_sessions(summaries: Iterable[RunSummary]) -> Dict[str, str]:
    """Session id -> its short name (``s1``, ``s2`` ..., `session_names`), from the run summaries (the runs
    index: a read per session, not a scan of the log, so the first screen does not wait for it)."""
    opened = sorted(session for summary in summaries for session in summary.sessions)
    return session_names(event.session for _, event in opened)
