"""``stepjournal audit``: one row per generate call, as a table that fits the terminal, JSON, CSV or a summary.

Rows are read from the log as they come (in batches, each in its own read transaction) and printed
in chunks, so the first screen of a long journal shows at once. On a terminal the table goes through
a pager, as ``git log`` does.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
from typing import Any, Dict, Iterable, Iterator, List, Optional

from rich.console import Console

from stepjournal import AuditRecord, Journal
from stepjournal._audit import AUDIT_FIELDS
from stepjournal._audit_rows import json_rows, releases_of

from ._common import names_of_sessions, open_readonly, parse_steps
from ._pager import paged
from ._render import JSON_RAW, SURROGATE, ACTION_STYLE, Failure, cell, clean, fitted_table, human_size, plain_table, short_time

__all__ = ["run"]

_CHUNK = 200  # rows per printed table piece: the first ones show before the rest are read
_FIRST_CHUNK = 40  # the first piece: about a screen, so that it shows before 200 rows are laid out


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    steps = parse_steps(args.steps)
    with open_readonly(args.journal, check="as-read") as journal:
        # Rows straight from the stored maps, no event objects: the same rows as the event path, faster.
        # JSON and CSV carry released_by: the releases (which follow their records) are read first.
        released = releases_of(journal.raw_events()) if args.json or args.csv else None
        records: Iterator[Any] = json_rows(journal.raw_events(), run=args.run, steps=steps, mode=args.mode,
                                           actions=set(args.action or ()), stage=args.stage, native=args.json,
                                           released_by=released)
        if not (args.json or args.csv):
            records = (AuditRecord(**{k: v for k, v in row.items() if k not in _NOT_FIELDS}) for row in records)
        first = next(records, None)
        if first is None:
            _check_run(journal, args.run)
        rows = itertools.islice(itertools.chain([first] if first else [], records), args.limit)
        if args.json:
            _print_json_rows(rows)
        elif args.csv:
            writer = csv.writer(sys.stdout, lineterminator="\n")
            writer.writerow(AUDIT_FIELDS)
            for row in rows:
                writer.writerow([_csv_cell(row[k]) for k in AUDIT_FIELDS])
        else:
            names = names_of_sessions(journal.run_summaries())
            with paged(out, enabled=not args.no_pager) as page:
                if args.summary:
                    _print_summary(page, args.journal, rows, names)
                else:
                    _print_table(page, args.journal, rows, names, wide=args.wide)
    return 0


def _print_json_rows(rows: Iterable[Any]) -> None:
    """The rows as one JSON array, written as they come: what ``print_json(list(rows))`` prints, byte for byte.

    Rows come in batches of 512 through msgspec's JSON encoder (`_native_rows.encode_rows`: the
    indented layout, Python's text of every value); a batch it cannot write as Python would goes
    through the C encoder of the standard library, row by row.
    """
    from stepjournal._native_rows import Row, as_dicts, as_row, encode_rows

    write, pending, first = sys.stdout.write, [], True

    def flush() -> None:
        nonlocal first
        batch = [row if type(row) is Row else as_row(row) for row in pending]
        text = encode_rows(batch)
        if text is None:
            text = ",\n".join(_json_row(row) for row in as_dicts(batch))
        elif (not text.isascii() or "\x7f" in text) and JSON_RAW.search(text):
            # C1 controls and bidi overrides: escaped, as `print_json` does (a regex over the batch
            # costs more than its encoding: asked only when the text is not plain ASCII or holds DEL)
            text = JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
        write(("[\n" if first else ",\n") + text)
        first = False
        pending.clear()

    for row in rows:
        pending.append(row)
        if len(pending) >= 512:
            flush()
    if pending:
        flush()
    write("[]\n" if first else "\n]\n")


def _json_row(row: Dict[str, Any]) -> str:
    """One row as ``json.dumps([row], indent=2)`` lays it out inside the array (``  {...}``)."""
    text = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",\n    ", ": ")).encode(row)
    if SURROGATE.search(text):  # not UTF-8 (never from a decoded journal): spelled as escapes
        text = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",\n    ", ": ")).encode(row)
    if JSON_RAW.search(text):
        text = JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return "  {\n    " + text[1:-1] + "\n  }"


# The keys of a JSON row that are no `AuditRecord` field.
_NOT_FIELDS = ("schema_version", "time")


def _check_run(journal: Journal, run: Optional[str]) -> None:
    """Nothing matched: when that is because `run` is not in the journal, say which runs are."""
    if run is None:
        return
    runs = list(dict.fromkeys(event.run for _, event in journal.events() if hasattr(event, "run")))
    if run not in runs:
        named = ", ".join(repr(clean(r)) for r in runs) or "none (the journal is empty)"
        raise Failure(f"no run {clean(run)!r} in {journal.path}; its runs: {named}")


def _csv_cell(value: Any) -> Any:
    """Empty for None, JSON spelling for booleans (true/false), text made safe (`clean`) otherwise."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return json.dumps(value)
    return clean(value) if isinstance(value, str) else value


def _source(r: AuditRecord) -> str:
    if r.action != "replayed":
        return ""
    source = f"{r.source_step}#{r.source_gen_index}"
    return source + (f" ({r.source_run})" if r.source_run != r.run else "")


def _call(r: AuditRecord) -> str:
    """``#0``; the mode and the stage named when they are not the defaults: ``validate#0``, ``reward#1``."""
    named = [part for part, default in ((r.mode, "train"), (r.stage, "generate")) if part != default]
    return f"{'/'.join(named)}#{r.gen_index}"


def _session(r: AuditRecord, names: Dict[str, str]) -> str:
    return names.get(r.session, r.session[:8])


# -- the table --------------------------------------------------------------------------------------------
_NARROW = (  # column, justify, width (None: what is left)
    ("step", "right", 6), ("call", "left", 10), ("action", "left", 9), ("source", "left", 8),
    ("policy", "left", 12), ("sess", "left", 4), ("reason", "left", None),
)
_WIDE = ("#", "session", "run", "mode", "stage", "step", "idx", "action", "stored", "source", "policy", "reason",
         "size", "digest", "time (UTC)")


def _print_table(out: Console, path: str, rows: Iterable[AuditRecord], names: Dict[str, str], *,
                 wide: bool) -> None:
    count = 0
    out.print(f"generate calls in {cell(path)}")
    for start, chunk in enumerate(_chunks(rows)):
        table = _wide_table(chunk, names) if wide else _narrow_table(out.width, chunk, names)
        table.show_header = start == 0
        out.print(table)
        count += len(chunk)
    out.print(f"{count} call{'s' * (count != 1)}" if count else "no generate call matches")


def _chunks(rows: Iterable[AuditRecord]) -> Iterator[List[AuditRecord]]:
    it, size = iter(rows), _FIRST_CHUNK
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk
        size = _CHUNK


def _narrow_table(width: int, chunk: List[AuditRecord], names: Dict[str, str]) -> Any:
    """step, call, action, source, policy, session name and as much of the reason as fits: one line
    per call at 80 columns and up (the same widths in every chunk, so the pieces line up)."""
    table, with_reason = fitted_table(width, _NARROW)
    for r in chunk:
        call = _call(r)
        cells = [str(r.step), cell(call), f"[{ACTION_STYLE[r.action]}]{r.action}[/]", cell(_source(r)),
                 cell(r.policy), cell(_session(r, names))]
        if with_reason:
            cells.append(cell(r.reason))
        table.add_row(*cells)
    return table


def _wide_table(chunk: List[AuditRecord], names: Dict[str, str]) -> Any:
    table = plain_table()
    for column in _WIDE:
        table.add_column(column, justify="right" if column in ("#", "step", "idx", "size") else "left",
                         overflow="fold")
    for r in chunk:
        table.add_row(
            str(r.seq), cell(_session(r, names)), cell(r.run), cell(r.mode), cell(r.stage), str(r.step),
            str(r.gen_index),
            f"[{ACTION_STYLE[r.action]}]{r.action}[/]", "yes" if r.stored else "no", cell(_source(r)),
            cell(r.policy), cell(r.reason), human_size(r.nbytes) if r.nbytes is not None else "",
            (r.digest or "")[:12], short_time(r.ts),
        )
    return table


# -- the summary -----------------------------------------------------------------------------------------
def _print_summary(out: Console, path: str, rows: Iterable[AuditRecord], names: Dict[str, str]) -> None:
    """One line per run of calls that went alike: same run, mode, session, action and policy, steps in a row."""
    out.print(f"generate calls in {cell(path)}, by ranges of steps", soft_wrap=True)
    group: List[AuditRecord] = []
    count = 0
    for r in rows:
        count += 1
        if group and not _same_range(group[-1], r):
            out.print(_summary_line(group, names), soft_wrap=True)
            group = []
        group.append(r)
    if group:
        out.print(_summary_line(group, names), soft_wrap=True)
    out.print(f"{count} call{'s' * (count != 1)}" if count else "no generate call matches", soft_wrap=True)


def _same_range(last: AuditRecord, r: AuditRecord) -> bool:
    key = ("run", "mode", "stage", "session", "action", "policy")
    return (all(getattr(last, k) == getattr(r, k) for k in key) and r.step in (last.step, last.step + 1)
            and (r.action != "replayed" or r.source_run == last.source_run))


def _summary_line(group: List[AuditRecord], names: Dict[str, str]) -> str:
    from stepjournal.policies import StepRanges  # the policies package loads the engine: not for the table

    first = group[0]
    steps = str(StepRanges.from_steps(r.step for r in group))
    calls = len(group)
    line = f"steps {steps} [{ACTION_STYLE[first.action]}]{first.action}[/]"
    if first.action == "replayed":
        sources = str(StepRanges.from_steps(r.source_step for r in group if r.source_step is not None))
        line += f" from {sources}" + (f" of run {cell(first.source_run)}" if first.source_run != first.run else "")
    line += f" by {cell(first.policy)}"
    where = [f"run {cell(first.run)}", cell(first.mode), cell(_session(first, names))]
    if first.stage != "generate":
        where.insert(2, f"stage {cell(first.stage)}")
    per = "" if calls == len({r.step for r in group}) else f", {calls} calls"
    return f"{line} [dim]({', '.join(where)}{per})[/]"
