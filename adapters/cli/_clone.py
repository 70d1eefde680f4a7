"""``stepjournal clone URL JOURNAL``: a new journal holding everything pushed to a remote (URL may be a
path, or one of your own remote names: ``stepjournal remote add --global``)."""

from __future__ import annotations

import argparse

from rich.console import Console

from stepjournal import clone, resolve_clone_source

from ._pull import merge_options, pulled

__all__ = ["run"]


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    options = merge_options(args)
    url = resolve_clone_source(args.url)
    return pulled(args, out, err, lambda progress: clone(url, args.journal, progress=progress, **options))
