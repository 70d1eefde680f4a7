"""``stepjournal clone URL JOURNAL``: a new journal holding everything pushed to a remote."""

from __future__ import annotations

import argparse

from rich.console import Console

from stepjournal import clone

from ._pull import merge_options, pulled

__all__ = ["run"]


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    options = merge_options(args)
    return pulled(args, out, err, lambda progress: clone(args.url, args.journal, progress=progress, **options))
