"""``stepjournal reindex``: rebuild the index (a projection) from the event log."""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from stepjournal import Journal

from ._render import Failure, cell, clean, print_line

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal reindex``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if not os.path.isfile(os.path.join(args.journal, "data.mdb")):
        raise Failure(f"no journal at {clean(args.journal)!r}: the folder or its data.mdb is missing")
    # Maintenance records no calls, so it opens no session: the log keeps only what trainers did.
    with Journal(args.journal, session=False) as journal:
        count = journal.reindex()
    print_line(out, f"rebuilt the index of {cell(args.journal)} from {count} events")
    return 0
