"""``stepjournal runs``: run keys, sessions, fingerprints and call counts.

The default view fits 80 columns: the columns that say what a run is (calls, generated, replayed,
steps, stored) and, per session, its name, run, time, host and fingerprint; a run's bypassed or
refused calls and its stages get a line of their own, so a narrow view hides none of them. ``--wide``
shows every column.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, List

from rich.console import Console

from stepjournal.events._events import ACTIONS

from ._common import names_of_sessions, open_readonly
from ._render import cell, fingerprint_text, fitted_table, human_size, plain_table, print_json, print_line, short_time

__all__ = ["add_arguments", "run"]

_RUNS = (("run", "left", None), ("sessions", "right", 8), ("calls", "right", 7), ("generated", "right", 9),
         ("replayed", "right", 8), ("steps", "left", 11), ("stored", "right", 9))
_SESSIONS = (("session", "left", 7), ("opened (UTC)", "left", 16), ("host", "left", 12), ("run", "left", None),
             ("fingerprint", "left", None))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal runs``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--wide", action="store_true", help="every column (the default view fits 80 columns)")
    fmt.add_argument("--json", action="store_true", help="print a JSON array, one object per run")
    p.add_argument("--stage", help="count only the calls of this stage (generate, reward ...)")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    stage = getattr(args, "stage", None)
    with open_readonly(args.journal, check="as-read") as journal:
        summaries = journal.run_summaries(stage=stage)  # the runs index, not a scan of the log
    if args.json:
        print_json([s.to_json() for s in summaries])
        return 0
    if not summaries:
        print_line(out, f"journal {cell(args.journal)} is empty")
        return 0
    names = names_of_sessions(summaries)
    print_line(out, f"runs in {cell(args.journal)}")
    if args.wide:
        out.print(_wide_runs(summaries))
        out.print("sessions")
        out.print(_wide_sessions(summaries, names))
        return 0
    out.print(_runs(out.width, summaries))
    for s in summaries:
        notes = [f"{s.counts[a]} {a}" for a in ACTIONS if a not in ("generated", "replayed") and s.counts[a]]
        if list(s.stages) not in ([], ["generate"]):
            notes.append(f"stages {', '.join(s.stages)}")
        if notes:
            out.print(f"{cell(s.run)}: {cell(' · '.join(notes))}")
    out.print("sessions")
    out.print(_sessions(out.width, summaries, names))
    return 0


def _steps(summary: Any) -> str:
    return "-" if summary.first_step is None else f"{summary.first_step}-{summary.last_step}"


def _runs(width: int, summaries: List[Any]) -> Any:
    table, _ = fitted_table(width, _RUNS)
    for s in summaries:
        table.add_row(cell(s.run), str(len(s.sessions)), str(s.calls), str(s.counts["generated"]),
                      str(s.counts["replayed"]), _steps(s), human_size(s.stored_bytes))
    return table


def _sessions(width: int, summaries: List[Any], names: Dict[str, str]) -> Any:
    table, with_fingerprint = fitted_table(width, _SESSIONS)
    for s in summaries:
        for _, session in s.sessions:
            cells = [names[session.session], short_time(session.ts)[:16], cell(session.host)]
            if with_fingerprint:
                cells += [cell(s.run), fingerprint_text(session.fingerprint)]
            table.add_row(*cells)
    return table


def _wide_runs(summaries: List[Any]) -> Any:
    table = plain_table()
    for column in ("run", "sessions", "calls", *ACTIONS, "steps", "stages", "stored", "fingerprint"):
        table.add_column(column, justify="right" if column in ("sessions", "calls", *ACTIONS, "stored") else "left",
                         overflow="fold")
    for s in summaries:
        fingerprints = s.fingerprints()
        shown = fingerprint_text(fingerprints[-1]) if fingerprints else "-"
        if len(fingerprints) > 1:
            shown += f" [yellow](+{len(fingerprints) - 1} other)[/]"
        table.add_row(cell(s.run), str(len(s.sessions)), str(s.calls), *(str(s.counts[a]) for a in ACTIONS),
                      _steps(s), cell(", ".join(s.stages)) or "-", human_size(s.stored_bytes), shown)
    return table


def _wide_sessions(summaries: List[Any], names: Dict[str, str]) -> Any:
    table = plain_table()
    for column in ("session", "id", "run", "opened (UTC)", "host", "pid", "version", "fingerprint"):
        table.add_column(column, overflow="fold")
    for s in summaries:
        for _, session in s.sessions:
            table.add_row(names[session.session], session.session, cell(s.run), short_time(session.ts),
                          cell(session.host), str(session.pid), cell(session.library_version),
                          fingerprint_text(session.fingerprint))
    return table
