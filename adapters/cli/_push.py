"""``stepjournal push JOURNAL [REMOTE]``: send what a journal recorded since its last push to object storage."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any, Callable, Dict, Iterator

import attrs
from rich.console import Console

from stepjournal import AUDIT_SCHEMA_VERSION, push, redact, resolve_remote

from ._args import add_remote_argument
from ._render import Failure, cell, clean, human_size, print_json, progress_bar

__all__ = ["add_arguments", "run", "progress_to"]


@contextlib.contextmanager
def progress_to(err: Console, *, quiet: bool = False) -> Iterator[Callable[..., None]]:
    """A library progress callback drawn on a rich progress bar on `err`: events done of all, the bytes moved
    so far and their rate (it `counts_bytes`: docs/sharing.md, "Progress"), and the time left.

    The bar starts at the first report, so a verb that fails before it reports anything (a remote
    that refuses at once) prints its one error line and nothing else.
    """
    tasks: Dict[str, Any] = {}
    began = time.monotonic()  # the rate is over the whole verb, remote round trips included
    bar: Any = None

    def update(what: str, done: int, total: int, moved: int = 0) -> None:
        nonlocal bar
        if bar is None:
            bar = progress_bar(err, quiet=quiet, moved=True)
            bar.start()
        if what not in tasks:
            tasks[what] = bar.add_task(what, total=total or None, moved="")
        took = max(time.monotonic() - began, 1e-6)
        rate = f" · {human_size(int(moved / took))}/s" if moved else ""
        bar.update(tasks[what], completed=done, total=total or None, moved=f"{human_size(moved)}{rate}")

    update.counts_bytes = True  # type: ignore[attr-defined]
    try:
        yield update
    finally:
        if bar is not None:
            bar.stop()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal push``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    add_remote_argument(p)
    p.add_argument("--json", action="store_true", help="print the push report as JSON")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if not os.path.isfile(os.path.join(args.journal, "data.mdb")):
        raise Failure(f"no journal at {clean(args.journal)!r}: the folder or its data.mdb is missing")
    url = resolve_remote(args.journal, args.remote)
    with progress_to(err, quiet=args.json) as progress:
        report = push(args.journal, url, progress=progress)
    shown = cell(redact(url))
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, **attrs.asdict(report)})
    elif report.events_sent or report.payloads_sent:
        out.print(f"pushed {report.events_sent} events, {report.payloads_sent} payloads ({human_size(report.bytes_sent)}) "
                  f"of journal {report.source} to {shown}")
    else:
        out.print(f"{shown} is up to date with journal {report.source} (nothing sent)")
    return 0
