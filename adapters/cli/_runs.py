"""``stepjournal runs``: run keys, sessions, fingerprints and call counts.

The default view fits the terminal: the columns that say what a run is (calls, generated, replayed,
steps, stored) and, per session, its name, run, time, host and fingerprint, each column as wide as it
needs and the fingerprint in the rest. The fingerprint column shows the keys whose values differ between
the sessions (what changed from one run to the next), or the whole fingerprint when none does. A run's
bypassed or refused calls and its stages get a line of their own, so a narrow view hides none of them.
``--wide`` shows every column and every key, at its own width (lines overflow for ``less -S``).
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, List

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from stepjournal.tools import ACTIONS
from stepjournal.vocabulary import Action

from ._common import names_of_sessions, open_readonly, key_word
from ._render import (FittedColumns, cell, clean, fingerprint_text, human_size, plain_table, print_json, print_line,
                      print_unsqueezed, short_time)

__all__ = ["add_arguments", "run"]

_RUNS = (("run", "left", None), ("sessions", "right", 8), ("calls", "right", 12), ("generated", "right", 12),
         ("replayed", "right", 12), ("steps", "left", 25), ("stored", "right", 10))
_SESSIONS = (("session", "left", 7), ("opened (UTC)", "left", 16), ("host", "left", 16), ("run", "left", 24),
             ("fingerprint", "left", None))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal runs``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--wide", action="store_true",
                     help="every column, each cell whole (lines overflow the terminal: less -S); "
                          "the default view fits it")
    fmt.add_argument("--json", action="store_true", help="print a JSON array, one object per run")
    p.add_argument("--stage", type=key_word("stage"), help="count only the calls of this stage (generate, reward ...)")


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
        print_unsqueezed(out, _wide_runs(summaries))
        out.print("sessions")
        print_unsqueezed(out, _wide_sessions(summaries, names))
        return 0
    out.print(_runs(out.width, summaries))
    for s in summaries:
        notes = [f"{s.counts[a]} {a}" for a in ACTIONS if a not in (Action.GENERATED, Action.REPLAYED) and s.counts[a]]
        if list(s.stages) not in ([], ["generate"]):
            notes.append(f"stages {', '.join(s.stages)}")
        if notes:
            out.print(f"{cell(s.run)}: {cell(' · '.join(notes))}")
    out.print("sessions")
    opened = [session for s in summaries for _, session in s.sessions]
    differing = _differing_keys([session.fingerprint for session in opened])
    out.print(_sessions(out.width, summaries, names, differing))
    if len(opened) > 1:
        out.print(_fingerprint_note(differing, opened))
    return 0


def _differing_keys(fingerprints: List[Dict[str, Any]]) -> List[str]:
    """The keys whose value is not the same in every fingerprint (missing from one counts), sorted."""
    keys = sorted({key for fp in fingerprints for key in fp})
    return [key for key in keys if len({_value_text(fp, key) for fp in fingerprints}) > 1]


def _value_text(fp: Dict[str, Any], key: str) -> str:
    """``key=value`` (rich markup), or ``no key`` when the fingerprint has none."""
    return fingerprint_text({key: fp[key]}) if key in fp else f"no {cell(key)}"


def _fingerprint_text(fp: Dict[str, Any], differing: List[str]) -> str:
    """What the sessions table shows of a fingerprint: the keys that differ between sessions, else all."""
    if not differing:
        return fingerprint_text(fp)
    return ", ".join(_value_text(fp, key) for key in differing)


def _fingerprint_note(differing: List[str], opened: List[Any]) -> str:
    if not differing:
        return "fingerprint: the same in every session"
    count = len({key for session in opened for key in session.fingerprint})
    which = "the key that differs" if len(differing) == 1 else f"the {len(differing)} keys that differ"
    return f"fingerprint: {which} between sessions; --wide shows all {count}"


def _steps(summary: Any) -> str:
    return "-" if summary.first_step is None else f"{summary.first_step}-{summary.last_step}"


def _runs(width: int, summaries: List[Any]) -> Any:
    rows = [[clean(s.run), str(len(s.sessions)), str(s.calls), str(s.counts[Action.GENERATED]),
             str(s.counts[Action.REPLAYED]), _steps(s), human_size(s.stored_bytes)] for s in summaries]
    layout = FittedColumns(width, _RUNS, whole=[name for name, _, _ in _RUNS[1:]])  # the counts are never cut
    layout.measure(rows)
    table = layout.table()
    for row in rows:
        table.add_row(*(escape(text) for text in row))
    return table


def _sessions(width: int, summaries: List[Any], names: Dict[str, str], differing: List[str]) -> Any:
    """The sessions table: name, time, host and run as wide as they need, the fingerprint in the rest."""
    rows = [[names[session.session], short_time(session.ts)[:16], clean(session.host), clean(s.run),
             _fingerprint_text(session.fingerprint, differing)] for s in summaries for _, session in s.sessions]
    layout = FittedColumns(width, _SESSIONS, whole=("session", "opened (UTC)"))
    layout.measure([row[:4] + [Text.from_markup(row[4]).plain] for row in rows])
    table = layout.table()
    for row in rows:
        table.add_row(*(escape(text) for text in row[:4]), row[4])
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
