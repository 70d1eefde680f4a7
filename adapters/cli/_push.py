"""``stepjournal push JOURNAL [REMOTE]``: send what a journal recorded since its last push to object storage."""

from __future__ import annotations

import argparse
import shlex
import os

import attrs
from rich.console import Console

from stepjournal.events import AUDIT_SCHEMA_VERSION
from stepjournal.sharing import push, redact, resolve_remote

from ._args import add_remote_argument
from ._progress import progress_to
from ._render import Failure, cell, clean, human_size, print_json, print_line

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal push``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    add_remote_argument(p)
    p.add_argument("--json", action="store_true", help="print the push report as JSON")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if not os.path.isfile(os.path.join(args.journal, "data.mdb")):
        raise Failure(f"no journal at {clean(args.journal)!r}: the folder or its data.mdb is missing")
    url = resolve_remote(args.journal, args.remote)
    again = f"stepjournal push {shlex.quote(args.journal)}"
    if args.remote:
        again += f" {shlex.quote(redact(args.remote))}"
    with progress_to(err, quiet=args.json, again=again) as progress:
        report = push(args.journal, url, progress=progress)
    shown = cell(redact(url))
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, **attrs.asdict(report)})
    elif report.events_sent or report.payloads_sent:
        print_line(out, f"pushed {report.events_sent} events, {report.payloads_sent} payloads "
                        f"({human_size(report.bytes_sent)}) of journal {report.source} to {shown}")
    else:
        print_line(out, f"{shown} is up to date with journal {report.source} (nothing sent)")
    return 0
