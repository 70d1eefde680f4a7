"""``stepjournal import FILE JOURNAL``: bring a bundle's events and payloads into a journal."""

from __future__ import annotations

import argparse

from rich.console import Console

from stepjournal import import_bundle

from ._pull import show
from ._push import progress_to
from ._render import progress_bar

__all__ = ["run"]


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    with progress_bar(err) as progress:
        report = import_bundle(args.bundle, args.journal, progress=progress_to(progress))
    show(args, out, report)
    return 0
