"""``stepjournal runs``: run keys, sessions, fingerprints and call counts."""

from __future__ import annotations

import argparse
from typing import Any, Dict, Iterator, List, Tuple

import attrs
from rich.console import Console
from rich.table import Table

from stepjournal import CallRefused, RunSummary, SessionOpened, summarize_runs
from stepjournal._audit import ACTIONS

from ._common import open_readonly
from ._render import cell, fingerprint_text, human_size, print_json, short_time

__all__ = ["run"]


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    with open_readonly(args.journal) as journal:
        summaries = _summaries(journal)
    if args.json:
        print_json([s.to_json() for s in summaries])
        return 0
    if not summaries:
        out.print(f"journal {cell(args.journal)} is empty")
        return 0
    runs = Table(title=f"runs in {cell(args.journal)}", title_justify="left")
    for column in ("run", "sessions", "calls", *ACTIONS, "steps", "stored", "fingerprint"):
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



def _summaries(journal: Any) -> List[RunSummary]:
    """`summarize_runs`, with each run's step span taken from the calls that ran or were served: a
    refused call (a replay miss at step 9 of a run recorded through step 4) did not happen at its step."""
    spans: Dict[str, Tuple[int, int]] = {}

    def pairs() -> Iterator[Tuple[int, Any]]:
        for seq, event in journal.events():
            if not isinstance(event, (SessionOpened, CallRefused)):
                lo, hi = spans.get(event.run, (event.step, event.step))
                spans[event.run] = (min(lo, event.step), max(hi, event.step))
            yield seq, event

    summaries = summarize_runs(pairs())
    return [attrs.evolve(s, first_step=spans.get(s.run, (None, None))[0], last_step=spans.get(s.run, (None, None))[1])
            for s in summaries]
