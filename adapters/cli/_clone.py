"""``stepjournal clone URL JOURNAL``: a new journal holding everything pushed to a remote (URL may be a
path, or one of your own remote names: ``stepjournal remote add --global``)."""

from __future__ import annotations

import argparse
import shlex

from rich.console import Console

from stepjournal.sharing import clone, resolve_clone_source

from ._args import add_merge_options
from ._pull import merge_options, pulled

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal clone``."""
    p.add_argument("url", metavar="URL",
                   help="the remote: s3://bucket/prefix, gs://, az://, file:///path, a folder path, "
                   "or one of your own remote names (stepjournal remote add --global)")
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    p.add_argument("--json", action="store_true", help="print the pull report as JSON")
    add_merge_options(p)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    options = merge_options(args)
    url = resolve_clone_source(args.url)
    again = f"stepjournal pull {shlex.quote(args.journal)}"  # the clone named origin before its first transfer
    return pulled(args, out, err, lambda progress: clone(url, args.journal, progress=progress, **options), again)
