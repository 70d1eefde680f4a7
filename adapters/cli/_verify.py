"""``stepjournal verify``: re-hash every payload, decode every event, check the index."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any, Dict, List, Set

from stepjournal.events import AUDIT_SCHEMA_VERSION

from ._common import open_readonly
from ._progress import bytes_checked
from ._render import cell, print_json, print_line

if TYPE_CHECKING:
    from rich.console import Console

    from stepjournal import Journal

__all__ = ["add_arguments", "run"]

# A whole journal is the common case and should cost only the check: what a problem's report needs (the
# audit rows, step ranges, a table, the bundle reader) is imported where it is used.


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal verify``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if os.path.isfile(args.journal):  # a journal is a folder: a file can only be a bundle
        from stepjournal.sharing import verify_bundle

        events, problems = verify_bundle(args.journal)
        return _report(args, out, events, problems, "bundle")
    with open_readonly(args.journal) as journal, bytes_checked(err, quiet=args.json) as progress:
        # `verify` reports bytes checked (events, then payloads): the bar moves as payloads are hashed.
        problems = journal.verify(progress=progress)
        events = journal.last_seq()
        problems = _with_serving_steps(journal, problems)
    return _report(args, out, events, problems, "journal")


def _report(args: argparse.Namespace, out: Console, events: int, problems: List[Any], what: str) -> int:
    steps = sorted({s for p in problems for s in p.steps})
    if args.json:
        print_json({
            "schema_version": AUDIT_SCHEMA_VERSION,
            "ok": not problems,
            "events": events,
            "affected_steps": steps,
            "problems": [{"kind": p.kind, "where": p.where, "steps": list(p.steps), "detail": p.detail}
                         for p in problems],
        })
        return 1 if problems else 0
    if not problems:
        index = "the index matches the event log" if what == "journal" else "every segment matches its head"
        out.print(f"[green]{what} is whole[/]: {events} events decode, every payload matches its digest, {index}")
        return 0
    from rich.table import Table

    from stepjournal.policies import StepRanges

    print_line(out, f"{len(problems)} problem{'s' * (len(problems) != 1)} in {cell(args.journal)}")
    table = Table()
    for column in ("kind", "where", "steps", "detail"):
        table.add_column(column, overflow="fold")
    for p in problems:
        table.add_row(p.kind, cell(_where_text(p)), str(StepRanges.from_steps(p.steps)) or "?", cell(p.detail))
    out.print(table)
    out.print(f"[red]{what} is damaged[/]; affected steps: {str(StepRanges.from_steps(steps)) or 'unknown'}")
    return 1


def _with_serving_steps(journal: Journal, problems: List[Any]) -> List[Any]:
    """Each damaged or missing payload with every step it reached: the step that recorded it and every
    step that replayed it (or recorded the same bytes again)."""
    digests = {p.where for p in problems if p.kind in ("payload", "missing_payload")}
    if not digests:
        return problems
    import attrs

    from stepjournal.errors import StepJournalError
    from stepjournal.index import AuditRecord
    from stepjournal.tools import CALL_EVENT_TYPES

    steps: Dict[str, Set[int]] = {d: set() for d in digests}
    try:
        for seq, event in journal.events(types=CALL_EVENT_TYPES):
            record = AuditRecord.from_event(seq, event)
            for digest in (record.digest, record.input_digest):
                if digest in steps:
                    steps[digest].add(record.step)
    except StepJournalError:
        pass  # a broken event is a problem of its own; the steps read up to it are still right
    return [attrs.evolve(p, steps=tuple(sorted(steps[p.where] | set(p.steps)))) if p.where in steps else p
            for p in problems]


def _where_text(problem: Any) -> str:
    """An index key (``run \\0 mode \\0 step gen_index``, hex) as words; other places as they are."""
    if problem.kind == "index":
        from stepjournal.tools import parse_gen_key

        key = parse_gen_key(bytes.fromhex(problem.where))
        if key is not None:
            return f"run {key.run} {key.mode} step {key.step} #{key.gen_index}"
    if problem.kind in ("payload", "missing_payload"):
        return problem.where[:16] + "…"
    return problem.where
