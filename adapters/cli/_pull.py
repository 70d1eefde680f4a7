"""``stepjournal pull [REMOTE] JOURNAL``: bring the events and payloads pushed to a remote into a journal.

Git's order, ``pull JOURNAL REMOTE``, works too: `pull_words` tells which word is which, and the verb says
what it understood: on a terminal before it starts (``pull: from remote origin (s3://...) into journal b``),
and in its report line.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any, Callable, Dict

import attrs
from rich.console import Console

from stepjournal.events import AUDIT_SCHEMA_VERSION
from stepjournal.sharing import PullReport, pull, pull_words, redact, resolve_remote

from ._args import add_merge_options, add_remote_argument
from ._progress import progress_to
from ._render import UsageError, cell, human_size, print_json, print_line

__all__ = ["add_arguments", "run", "show", "pulled", "merge_options"]


def show(args: argparse.Namespace, out: Console, report: PullReport) -> None:
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, **attrs.asdict(report)})
    else:
        verb = {"import": "imported", "clone": "cloned"}.get(getattr(args, "command", ""), "pulled")
        sources = len(report.sources)
        understood = f"{args.understood} " if getattr(args, "understood", "") else ""  # pull's words, as read
        print_line(out, f"{verb} {report.events_pulled} events, {report.payloads_fetched} payloads "
                        f"({human_size(report.bytes_fetched)}) of {sources} journal{'s' * (sources != 1)} "
                        f"{understood}into {cell(args.journal)}")
        if report.kept:
            out.print(f"kept this journal's records of {report.kept} call(s) served; the incoming ones are in the "
                      "audit only (--keep ours)")


def merge_options(args: argparse.Namespace) -> Dict[str, Any]:
    """``runs=`` and ``keep=`` of `pull`, `clone` and `import_bundle` from ``--as`` and ``--keep``.

    Raises:
        UsageError: ``--as NEW`` given with other ``--as`` values.
    """
    given = args.runs_as or []
    if len(given) == 1 and "=" not in given[0]:
        runs: Any = given[0]
    elif any("=" not in g for g in given):
        raise UsageError("--as takes NEW (every incoming run under one key) once, or OLD=NEW for each run to rename")
    else:
        runs = dict(g.split("=", 1) for g in given) or None
    return {"runs": runs, "keep": args.keep}


def pulled(args: argparse.Namespace, out: Console, err: Console, fetch: Callable[[Any], PullReport],
           again: str = "") -> int:
    """Run `fetch(progress)` (a pull, clone or import) with progress on stderr, then print its report;
    interrupted, it says that `again` (a command line) resumes."""
    with progress_to(err, quiet=args.json, again=again) as progress:
        report = fetch(progress)
    show(args, out, report)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal pull``."""
    add_remote_argument(p)
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder (JOURNAL REMOTE, git's order, works too)")
    p.add_argument("--json", action="store_true", help="print the pull report as JSON")
    add_merge_options(p)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    options = merge_options(args)
    if args.remote is not None:
        words = pull_words(args.remote, args.journal)
        args.remote, args.journal = words.remote, words.journal
    url = resolve_remote(args.journal, args.remote)
    word = None if args.remote is None else redact(args.remote)  # a URL typed with a password shows none
    named = "its default remote" if word is None else f"remote {cell(word)}"
    shown = "" if word is not None and redact(url) == word else f" ({cell(redact(url))})"
    args.understood = f"from {named}{shown}"  # said back: before the bar on a terminal, and in the report line
    if not args.json and err.is_terminal:
        print_line(err, f"pull: {args.understood} into journal {cell(args.journal)}")
    again = f"stepjournal pull {shlex.quote(args.journal)}" + (f" {shlex.quote(word)}" if word else "")
    return pulled(args, out, err, lambda progress: pull(url, args.journal, progress=progress, **options), again)
