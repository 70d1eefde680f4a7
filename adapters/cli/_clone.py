"""``stepjournal clone URL JOURNAL``: a new journal holding everything pushed to a remote."""

from __future__ import annotations

import argparse

from rich.console import Console

from stepjournal import clone

from ._pull import show
from ._push import progress_to
from ._render import progress_bar

__all__ = ["run"]


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    with progress_bar(err) as progress:
        report = clone(args.url, args.journal, progress=progress_to(progress))
    show(args, out, report)
    return 0
