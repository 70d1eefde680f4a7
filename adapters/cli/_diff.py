"""`stepjournal diff A B`: where two runs (or two sessions of one journal) part, step by step and stage by stage.

Read-only, like the other commands. Exit status 0 when every pair is equal within tolerance, 1 when
the runs differ (or a pair could not be compared: damaged, unreadable), 2 on bad arguments or when
there is nothing to compare (a journal that does not open, an unknown run or field, no shared step).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import attrs
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from stepjournal.errors import StepJournalError
from stepjournal.vocabulary import DEFAULT_MODE

if TYPE_CHECKING:
    from stepjournal.tools import DiffReport
    from stepjournal.policies import StepRanges

from ._common import key_word
from ._render import FittedColumns, cell, clean, error_line, json_text, print_line

__all__ = ["add_arguments", "run"]

_STATE_TEXT = {
    "equal": "[green]equal[/]",
    "within_tolerance": "[cyan]within tol[/]",
    "differing": "[bold red]DIFFERS[/]",
    "only_a": "[yellow]only in A[/]",
    "only_b": "[yellow]only in B[/]",
    "damaged": "[magenta]damaged[/]",
    "unreadable": "[magenta]unreadable[/]",
}
_COUNT_TEXT = {"equal": "equal", "within_tolerance": "within tolerance", "differing": "differing",
               "only_a": "only in A", "only_b": "only in B", "damaged": "damaged", "unreadable": "unreadable"}
_STATE_WORDS = {state: Text.from_markup(text).plain for state, text in _STATE_TEXT.items()}
# The table's columns: name, justify, the most each takes (None: `where`, which gets the rest and wraps).
_COLUMNS = (("step", "right", 11), ("stage", "left", 14), ("call", "left", 12), ("state", "left", 10),
            ("max |a-b|", "right", 9), ("where", "left", None))


class _Usage(Exception):
    """Bad arguments or nothing to compare: exit status 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal diff``."""
    p.description = ("Pair the records of two runs (or sessions) by stage, mode, step and call index and compare "
                     "them: equal digests cost nothing, differing ones are compared structurally with tolerances. "
                     "Exit 0 when equal within tolerance, 1 when they differ, 2 on bad arguments.")
    p.add_argument("journal_a", metavar="A", help="the first journal folder")
    p.add_argument("journal_b", metavar="B", help="the second journal folder (may be the same as A)")
    p.add_argument("--run-a", type=key_word("run"), help="the run key on side A (needed when A holds several)")
    p.add_argument("--run-b", type=key_word("run"), help="the run key on side B")
    p.add_argument("--session-a", metavar="S", help="this session of A, its replays included (its name as runs and "
                   "audit show it, s2; or its id or a unique prefix); default: the run's recordings, replays left out")
    p.add_argument("--session-b", metavar="S", help="this session of B, its replays included")
    p.add_argument("--steps", metavar="RANGES", help="only these steps, e.g. '1-10,20'")
    p.add_argument("--stage", type=key_word("stage"), help="only this stage (generate, reward ...)")
    p.add_argument("--mode", type=key_word("mode"), help="only this mode (train, validate ...)")
    p.add_argument("--atol", type=_tolerance_number, help="absolute tolerance of floating-point values")
    p.add_argument("--rtol", type=_tolerance_number, help="relative tolerance of floating-point values")
    p.add_argument("--tol", action="append", default=[], metavar="FIELD=ATOL[,RTOL]",
                   help="tolerance of one field, e.g. old_log_probs=1e-6 (repeatable)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (docs/diff.md)")
    p.add_argument("--plot", metavar="FILE", help="also draw the diff: FILE.png, FILE.svg or FILE.html")
    p.add_argument("--text", action="store_true", help="also show the first differing sample of the first differing "
                   "step, decoded on both sides with its rewards (docs/reading.md)")
    p.add_argument("--tokenizer", metavar="PATH", help="with --text: the tokenizer folder (default: the one each "
                   "run's fingerprint names); loaded from local files only")
    p.add_argument("--tools", action="store_true", help="name the first tool call whose response differs "
                   "(agentic rollouts, docs/agents.md); with --run-a, --run-b, --steps, --json")
    p.add_argument("--no-pager", action="store_true",
                   help="never page (the table on a terminal goes through $PAGER, else less -FRX)")


def _tolerance_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number >= 0")
    return value


def _field_tolerances(items: List[str]) -> Dict[str, Any]:
    found: Dict[str, Any] = {}
    if not items:
        return found
    # Imported here, for --tol only: the tolerances' module loads torch.
    from stepjournal.tools import Tolerance

    for item in items:
        field, sep, numbers = item.partition("=")
        parts = numbers.split(",")
        if not sep or not field.strip() or len(parts) > 2:
            raise _Usage(f"--tol {item!r}: write FIELD=ATOL or FIELD=ATOL,RTOL (e.g. old_log_probs=1e-6)")
        try:
            values = [_tolerance_number(p.strip()) for p in parts]
        except argparse.ArgumentTypeError as exc:
            raise _Usage(f"--tol {item!r}: {exc}") from None
        found[field.strip()] = Tolerance(values[0], values[1] if len(values) == 2 else 0.0)
    return found


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Run ``stepjournal diff``; return the exit status (0 equal within tolerance, 1 differ, 2 usage)."""
    try:
        return _run(args, out)
    except BrokenPipeError:
        raise  # the reader went away (`diff ... | head`): main exits quietly with 141
    except (_Usage, StepJournalError, OSError, ValueError) as exc:
        # DiffError (no shared step, unknown run, session or field) is a ValueError too; its words are
        # Python's (run_a), this command's are flags (--run-a).
        print_line(err, f"stepjournal: error: {escape(error_line(exc))}")
        return 2


def _run(args: argparse.Namespace, out: Console) -> int:
    if args.tools:
        from ._tool_views import run_diff

        return run_diff(args, out)
    from stepjournal import Journal

    fields = _field_tolerances(args.tol)
    steps: Optional[StepRanges] = None
    if args.steps is not None:
        from stepjournal.policies import StepRanges  # the policies package only for --steps (its plugins' metadata)

        try:
            steps = StepRanges.parse(args.steps)
        except StepJournalError as exc:
            raise _Usage(f"--steps: {str(exc).splitlines()[0]}") from None
    if args.plot is not None and os.path.splitext(args.plot)[1].lower() not in (".png", ".svg", ".html"):
        raise _Usage(f"--plot {args.plot}: name a .png, .svg or .html file")
    for path in (args.journal_a, args.journal_b):
        if not os.path.isdir(path):
            raise _Usage(f"journal {path} does not exist (or is not a folder)")
    same = os.path.realpath(args.journal_a) == os.path.realpath(args.journal_b)
    journal_a = Journal(args.journal_a, readonly=True)
    try:
        journal_b = journal_a if same else Journal(args.journal_b, readonly=True)
        try:
            from stepjournal import diff_journals  # once both journals are open, not before a usage error

            report = diff_journals(
                journal_a, journal_b, run_a=args.run_a, run_b=args.run_b, session_a=args.session_a,
                session_b=args.session_b, steps=steps, stage=args.stage, mode=args.mode,
                atol=args.atol, rtol=args.rtol, tolerances=fields,
            )
        finally:
            if journal_b is not journal_a:
                journal_b.close()
    finally:
        journal_a.close()
    shown = report if args.json else shown_numbers(report)
    if args.plot is not None:
        from ._diff_plot import render_diff

        render_diff(report, args.plot, title=_title(shown))
    if args.tokenizer is not None and not args.text:
        raise _Usage("--tokenizer goes with --text")
    text = None
    if args.text:
        from ._diff_text import first_differing_sample

        text = first_differing_sample(report, args.journal_a, args.journal_b, args.tokenizer)
    if args.json:
        data = report.to_json()
        if args.text:
            data["text"] = text
        sys.stdout.write(json_text(data) + "\n")
    else:
        from ._pager import paged  # here, not at the top: `stepjournal --help` loads no verb's output code

        with paged(out, enabled=not args.no_pager) as page:
            _print_report(shown, page)
            if args.text:
                from ._diff_text import print_text

                print_text(text, page)
            if args.plot is not None:
                print_line(page, f"wrote {escape(args.plot)}")
    return report.exit_code


def number_text(value: float) -> str:
    """A number as the diff shows it: four significant digits (``%.4g``)."""
    return f"{value:.4g}"


def _value_texts(a: Optional[str], b: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """Two differing values (the comparison's texts) as the report shows them: floats at ``%.4g``, the second
    followed by their relative difference ``|a-b| / max(|a|,|b|)``, so that two values alike in four digits
    still show how far apart they are. Other values (ints, token ids, strings, shapes) as they are."""
    x, y = _float_of(a), _float_of(b)
    if x is None or y is None:
        return a, b
    scale = max(abs(x), abs(y))
    rel = abs(x - y) / scale if scale and math.isfinite(scale) else None
    return number_text(x), number_text(y) + ("" if rel is None else f" (rel {rel:.2g})")


def _float_of(text: Optional[str]) -> Optional[float]:
    """The float a value's text spells (``-0.87768066``, ``1e-05``, ``nan``), None for an int or any other text."""
    if text is None:
        return None
    try:
        int(text)
        return None  # an int (a token id, a count): every digit stays
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def shown_numbers(report: DiffReport) -> DiffReport:
    """`report` with each difference's values as the table and the summary show them (`_value_texts`); the
    JSON keeps the exact texts."""
    from stepjournal.tools import Comparison, Difference

    def difference(d: Difference) -> Difference:
        value_a, value_b = _value_texts(d.value_a, d.value_b)
        return attrs.evolve(d, value_a=value_a, value_b=value_b)

    def comparison(c: Optional[Comparison]) -> Optional[Comparison]:
        return None if c is None else attrs.evolve(c, differences=tuple(map(difference, c.differences)))

    return attrs.evolve(report, pairs=tuple(attrs.evolve(p, comparison=comparison(p.comparison)) for p in report.pairs))


def _side_text(side: Any) -> str:
    """One side as the header names it: folder, run, and what was paired."""
    what = f"session {side.session_name}, replays included" if side.session else "recordings, replays left out"
    return f"{side.path} · run {side.run} · {what}"


def _title(report: DiffReport) -> str:
    sides = [attrs.evolve(side, path=os.path.basename(os.path.abspath(side.path))) for side in (report.a, report.b)]
    summary = "\n".join(textwrap.wrap(report.summary, 90))
    return f"{summary}\nA: {_side_text(sides[0])}\nB: {_side_text(sides[1])}"


def _print_report(report: DiffReport, out: Console) -> None:
    style = "green" if report.exit_code == 0 else "bold red"
    out.print(f"[{style}]{cell(report.summary)}[/]")
    print_line(out, f"A: {cell(_side_text(report.a))}")
    print_line(out, f"B: {cell(_side_text(report.b))}")
    out.print(_table(report, out.width))
    counts = ", ".join(f"{n} {_COUNT_TEXT[state]}" for state, n in report.counts.items() if n)
    out.print(f"{len(report.pairs)} pairs: {counts}; {report.payloads_loaded} payloads loaded")
    for note in report.notes:
        out.print(f"[yellow]note:[/] {cell(note)}")


def _table(report: DiffReport, width: int) -> Any:
    """One row per pair that does not agree; runs of equal pairs collapse into one row. Each column is as wide
    as it needs; `where` gets the rest of the terminal and wraps there."""
    from stepjournal.tools import json_float
    from stepjournal.tools import compact_steps

    modes = {p.mode for p in report.pairs}
    show_call = len(modes) > 1 or any(p.gen_index for p in report.pairs)
    rows: List[List[str]] = []  # plain text, the state's key in place of its styled text
    run: List[Any] = []

    def flush() -> None:
        if run:
            stages = ", ".join(dict.fromkeys(p.stage for p in run))
            rows.append([compact_steps([p.step for p in run]), clean(stages), "", "equal", "",
                         f"{len(run)} pair{'s' if len(run) != 1 else ''}"])
            run.clear()

    for pair in report.pairs:
        if pair.state == "equal":
            run.append(pair)
            continue
        flush()
        error = json_float(pair.max_abs)
        error_text = "" if error is None else (number_text(error) if isinstance(error, float) else str(error))
        call = f"#{pair.gen_index}" if pair.mode == DEFAULT_MODE else f"{pair.mode} #{pair.gen_index}"
        rows.append([str(pair.step), clean(pair.stage), clean(call), pair.state, error_text, clean(pair.brief())])
    flush()
    columns = [column for column in _COLUMNS if show_call or column[0] != "call"]
    texts = [[text for i, text in enumerate(row) if show_call or i != 2] for row in rows]
    layout = FittedColumns(width, columns)
    layout.measure([[_STATE_WORDS[text] if i == len(row) - 3 else text for i, text in enumerate(row)] for row in texts])
    table = layout.table(wrap=True)
    table.columns[1].no_wrap, table.columns[1].overflow = False, "fold"  # a run of equal pairs lists its stages
    for row in texts:
        table.add_row(*(_STATE_TEXT[text] if i == len(row) - 3 else escape(text) for i, text in enumerate(row)))
    return table
