"""The command line's output: consoles, tables, progress, JSON, one-line errors, shared cell text.

Rich's tables, trees and progress bars are imported by the verbs that draw them, so that
``stepjournal --help`` loads none of them.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, Dict, Iterator, Optional, Tuple

from rich.console import Console
from rich.markup import escape

from stepjournal._audit import iso_time

__all__ = [
    "UsageError",
    "Failure",
    "ACTION_STYLE",
    "consoles",
    "progress_bar",
    "one_line",
    "print_json",
    "fingerprint_text",
    "short_time",
    "human_size",
]

ACTION_STYLE = {"generated": "green", "replayed": "blue", "bypassed": "bright_black", "refused": "red"}


class UsageError(Exception):
    """Bad arguments: exit status 2."""


class Failure(Exception):
    """The command could not do its work: exit status 1."""


@contextlib.contextmanager
def consoles() -> Iterator[Tuple[Console, Console]]:
    """The console for results (stdout) and the one for progress and warnings (stderr)."""
    out = Console(highlight=False)
    if not out.is_terminal:
        # A pipe or a file has no width; do not squeeze a wide audit table into 80 columns.
        out = Console(highlight=False, width=max(out.width, 200))
    yield out, Console(stderr=True, highlight=False)


def progress_bar(err: Console) -> Any:
    """A rich progress bar on `err` (use as a context manager)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
    )


def one_line(message: object) -> str:
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False) + "\n")


def human_size(nbytes: int) -> str:
    from rich.filesize import decimal

    return decimal(nbytes)


def fingerprint_text(fp: Dict[str, Any]) -> str:
    if not fp:
        return "{}"
    return escape(", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in sorted(fp.items())))


def short_time(ts: Optional[float]) -> str:
    text = iso_time(ts)
    return "-" if text is None else text.replace("T", " ")[:19]
