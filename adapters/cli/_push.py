"""``stepjournal push JOURNAL URL``: send what a journal recorded since its last push to object storage."""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Dict

import attrs
from rich.console import Console

from stepjournal import AUDIT_SCHEMA_VERSION, push, redact

from ._render import Failure, cell, clean, print_json, progress_bar

__all__ = ["run", "progress_to"]


def progress_to(progress: Any) -> Callable[[str, int, int], None]:
    """A library progress callback ``(what, done, total)`` drawn on a rich progress bar."""
    tasks: Dict[str, Any] = {}

    def update(what: str, done: int, total: int) -> None:
        if what not in tasks:
            tasks[what] = progress.add_task(what, total=total or None)
        progress.update(tasks[what], completed=done, total=total or None)

    return update


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if not os.path.isfile(os.path.join(args.journal, "data.mdb")):
        raise Failure(f"no journal at {clean(args.journal)!r}: the folder or its data.mdb is missing")
    with progress_bar(err) as progress:
        report = push(args.journal, args.url, progress=progress_to(progress))
    shown = cell(redact(args.url))
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, **attrs.asdict(report)})
    elif report.events_sent or report.payloads_sent:
        out.print(f"pushed {report.events_sent} events, {report.payloads_sent} payloads ({report.bytes_sent} bytes) "
                  f"of journal {report.source} to {shown}")
    else:
        out.print(f"{shown} is up to date with journal {report.source} (nothing sent)")
    return 0
