"""``stepjournal pull URL JOURNAL``: bring the events and payloads pushed to a remote into a journal."""

from __future__ import annotations

import argparse

import attrs
from rich.console import Console

from stepjournal import AUDIT_SCHEMA_VERSION, pull

from ._push import progress_to
from ._render import cell, print_json, progress_bar

__all__ = ["run", "show"]


def show(args: argparse.Namespace, out: Console, report: object) -> None:
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, **attrs.asdict(report)})
    else:
        out.print(f"pulled {report.events_pulled} events, {report.payloads_fetched} payloads "
                  f"({report.bytes_fetched} bytes) from {len(report.sources)} journal(s) into {cell(args.journal)}")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    with progress_bar(err) as progress:
        report = pull(args.url, args.journal, progress=progress_to(progress))
    show(args, out, report)
    return 0
