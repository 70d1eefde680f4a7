"""``stepjournal compact``: give freed pages back to the disk (a compacted copy, swapped in atomically; writes)."""

from __future__ import annotations

import argparse

from rich.console import Console

from stepjournal.events import AUDIT_SCHEMA_VERSION
from stepjournal.upkeep import compact

from ._render import cell, human_size, print_json, print_line

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal compact``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    p.add_argument("--to", metavar="DIR",
                   help="write the compacted journal into this new folder instead (original unchanged)")
    p.add_argument("--json", action="store_true", help="print the sizes as JSON")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    result = compact(args.journal, to=args.to)
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, "path": result.path, "before_bytes": result.before_bytes,
                    "after_bytes": result.after_bytes, "files_removed": result.files_removed})
        return 0
    where = f"into {cell(result.path)}" if args.to else "in place"
    print_line(out, f"compacted {cell(args.journal)} {where}: data.mdb {human_size(result.before_bytes)} -> "
               f"{human_size(result.after_bytes)}"
               + (f"; {result.files_removed} payload file(s) no event names removed" if result.files_removed else ""))
    return 0
