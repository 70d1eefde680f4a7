"""``stepjournal pull URL JOURNAL``: bring the events and payloads pushed to a remote into a journal."""

from __future__ import annotations

import argparse
from typing import Any, Callable

import attrs
from rich.console import Console

from stepjournal import AUDIT_SCHEMA_VERSION, pull

from ._push import progress_to
from ._render import cell, print_json, progress_bar

__all__ = ["run", "show", "pulled"]


def show(args: argparse.Namespace, out: Console, report: object) -> None:
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, **attrs.asdict(report)})
    else:
        out.print(f"pulled {report.events_pulled} events, {report.payloads_fetched} payloads "
                  f"({report.bytes_fetched} bytes) from {len(report.sources)} journal(s) into {cell(args.journal)}")


def pulled(args: argparse.Namespace, out: Console, err: Console, fetch: Callable[[Any], object]) -> int:
    """Run `fetch(progress)` (a pull, clone or import) with progress on stderr, then print its report."""
    with progress_bar(err) as progress:
        report = fetch(progress_to(progress))
    show(args, out, report)
    return 0


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    return pulled(args, out, err, lambda progress: pull(args.url, args.journal, progress=progress))
