"""``stepjournal audit``: one row per generate call, as a table, JSON or CSV."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stepjournal import AuditRecord
from stepjournal._audit import AUDIT_FIELDS

from ._common import open_readonly, parse_steps
from ._render import ACTION_STYLE, human_size, print_json, short_time

__all__ = ["run"]


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    steps = parse_steps(args.steps)
    with open_readonly(args.journal) as journal:
        records = journal.audit(run=args.run, steps=steps, mode=args.mode, actions=args.action or None)
    if args.json:
        print_json([r.to_json() for r in records])
    elif args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(AUDIT_FIELDS)
        for r in records:
            row = r.to_json()
            writer.writerow([_csv_cell(row[k]) for k in AUDIT_FIELDS])
    else:
        out.print(_audit_table(args.journal, records))
    return 0


def _csv_cell(value: Any) -> Any:
    """Empty for None, JSON spelling for booleans (true/false), the value otherwise."""
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, bool) else value


def _audit_table(path: str, records: Sequence[AuditRecord]) -> Table:
    table = Table(title=f"generate calls in {escape(path)} ({len(records)})", title_justify="left")
    columns = ("#", "session", "run", "mode", "step", "idx", "action", "stored", "source", "policy", "reason",
               "size", "digest", "time (UTC)")
    for column in columns:
        table.add_column(column, justify="right" if column in ("#", "step", "idx", "size") else "left",
                         overflow="fold")
    for r in records:
        source = f"{r.source_step}#{r.source_gen_index}" if r.action == "replayed" else ""
        if source and r.source_run != r.run:
            source += f" ({r.source_run})"
        style = ACTION_STYLE[r.action]
        table.add_row(
            str(r.seq),
            r.session[:8],
            escape(r.run),
            escape(r.mode),
            str(r.step),
            str(r.gen_index),
            f"[{style}]{r.action}[/]",
            "yes" if r.stored else "no",
            escape(source),
            escape(r.policy),
            escape(r.reason),
            human_size(r.nbytes) if r.nbytes is not None else "",
            (r.digest or "")[:12],
            short_time(r.ts),
        )
    return table
