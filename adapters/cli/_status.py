"""``stepjournal status JOURNAL [REMOTE]``: what a push would send and a pull would fetch; sends nothing."""

from __future__ import annotations

import argparse

import attrs
from rich.console import Console

from stepjournal.events import AUDIT_SCHEMA_VERSION
from stepjournal.sharing import redact, remote_status

from ._args import add_remote_argument
from ._render import cell, human_size, print_json, print_line

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal status``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    add_remote_argument(p)
    p.add_argument("--json", action="store_true", help="print the status as JSON")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    status = remote_status(args.journal, args.remote)
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, **attrs.asdict(status)})
        return 0
    print_line(out, f"{cell(args.journal)} and {cell(redact(status.url))}:")
    sources = len(status.to_pull_sources)
    out.print(f"  push would send {status.to_push_events} events, {status.to_push_payloads} payloads "
              f"({human_size(status.to_push_bytes)})")
    out.print(f"  pull would fetch {status.to_pull_events} events, {status.to_pull_payloads} payloads "
              f"({human_size(status.to_pull_bytes)}) from {sources} journal{'s' * (sources != 1)}")
    return 0
