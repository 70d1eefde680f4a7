"""``stepjournal runs``: run keys, sessions, fingerprints and call counts."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from stepjournal._audit import ACTIONS

from ._common import open_readonly
from ._render import cell, fingerprint_text, human_size, print_json, short_time

__all__ = ["run"]


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    stage = getattr(args, "stage", None)
    with open_readonly(args.journal, check="as-read") as journal:
        summaries = journal.run_summaries(stage=stage)  # the runs index, not a scan of the log
    if args.json:
        print_json([s.to_json() for s in summaries])
        return 0
    if not summaries:
        out.print(f"journal {cell(args.journal)} is empty")
        return 0
    runs = Table(title=f"runs in {cell(args.journal)}", title_justify="left")
    for column in ("run", "sessions", "calls", *ACTIONS, "steps", "stages", "stored", "fingerprint"):
        runs.add_column(column, justify="right" if column in ("sessions", "calls", *ACTIONS, "stored") else "left")
    for s in summaries:
        fingerprints = s.fingerprints()
        shown = fingerprint_text(fingerprints[-1]) if fingerprints else "-"
        if len(fingerprints) > 1:
            shown += f" [yellow](+{len(fingerprints) - 1} other)[/]"
        steps = "-" if s.first_step is None else f"{s.first_step}-{s.last_step}"
        runs.add_row(
            cell(s.run),
            str(len(s.sessions)),
            str(s.calls),
            *(str(s.counts[a]) for a in ACTIONS),
            steps,
            cell(", ".join(s.stages)) or "-",
            human_size(s.stored_bytes),
            shown,
        )
    out.print(runs)
    sessions = Table(title="sessions", title_justify="left")
    for column in ("#", "run", "session", "opened (UTC)", "host", "pid", "version", "fingerprint"):
        sessions.add_column(column)
    for s in summaries:
        for seq, session in s.sessions:
            sessions.add_row(
                str(seq),
                cell(s.run),
                session.session[:12],
                short_time(session.ts),
                cell(session.host),
                str(session.pid),
                cell(session.library_version),
                fingerprint_text(session.fingerprint),
            )
    out.print(sessions)
    return 0
