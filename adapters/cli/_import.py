"""``stepjournal import FILE JOURNAL``: bring a bundle's events and payloads into a journal."""

from __future__ import annotations

import argparse

from rich.console import Console

from stepjournal.sharing import import_bundle

from ._args import add_merge_options
from ._pull import merge_options, pulled

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal import``."""
    p.add_argument("bundle", metavar="FILE", help="a bundle written by `stepjournal export --bundle`")
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder (created when missing)")
    p.add_argument("--json", action="store_true", help="print the import report as JSON")
    add_merge_options(p)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    options = merge_options(args)
    return pulled(args, out, err,
                  lambda progress: import_bundle(args.bundle, args.journal, progress=progress, **options))
