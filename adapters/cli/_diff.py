"""`stepjournal diff A B`: where two runs (or two sessions of one journal) part, step by step and stage by stage.

Read-only, like the other commands. Exit status 0 when every pair is equal within tolerance, 1 when
the runs differ (or a pair could not be compared: damaged, unreadable), 2 on bad arguments or when
there is nothing to compare (a journal that does not open, an unknown run or field, no shared step).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import attrs
from rich.console import Console
from rich.markup import escape

from stepjournal.base._errors import StepJournalError

if TYPE_CHECKING:
    from stepjournal import DiffReport
    from stepjournal.policies import StepRanges

from ._render import cell, error_line, json_text, print_line

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
_TABLE_WIDTH = 100


class _Usage(Exception):
    """Bad arguments or nothing to compare: exit status 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal diff``."""
    p.description = ("Pair the records of two runs (or sessions) by stage, mode, step and call index and compare "
                     "them: equal digests cost nothing, differing ones are compared structurally with tolerances. "
                     "Exit 0 when equal within tolerance, 1 when they differ, 2 on bad arguments.")
    p.add_argument("journal_a", metavar="A", help="the first journal folder")
    p.add_argument("journal_b", metavar="B", help="the second journal folder (may be the same as A)")
    p.add_argument("--run-a", help="the run key on side A (needed when A holds several)")
    p.add_argument("--run-b", help="the run key on side B")
    p.add_argument("--session-a", metavar="S", help="this session of A, its replays included (its name as runs and "
                   "audit show it, s2; or its id or a unique prefix); default: the run's recordings, replays left out")
    p.add_argument("--session-b", metavar="S", help="this session of B, its replays included")
    p.add_argument("--steps", metavar="RANGES", help="only these steps, e.g. '1-10,20'")
    p.add_argument("--stage", help="only this stage (generate, reward ...)")
    p.add_argument("--mode", help="only this mode (train, validate ...)")
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
    from stepjournal import Tolerance

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
    if args.plot is not None:
        from ._diff_plot import render_diff

        render_diff(report, args.plot, title=_title(report))
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
            _print_report(report, page)
            if args.text:
                from ._diff_text import print_text

                print_text(text, page)
            if args.plot is not None:
                print_line(page, f"wrote {escape(args.plot)}")
    return report.exit_code


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
    """One row per pair that does not agree; runs of equal pairs collapse into one row."""
    from rich import box
    from rich.table import Table

    from stepjournal.tools._compare import json_float
    from stepjournal.tools._diff_report import compact_steps

    modes = {p.mode for p in report.pairs}
    show_call = len(modes) > 1 or any(p.gen_index for p in report.pairs)
    table = Table(box=box.SIMPLE_HEAD, width=min(_TABLE_WIDTH, width), pad_edge=False)
    table.add_column("step", justify="right", max_width=11, overflow="fold")
    table.add_column("stage", max_width=14, overflow="fold")
    if show_call:
        table.add_column("call", max_width=12, overflow="fold")
    table.add_column("state", max_width=10, no_wrap=True)
    table.add_column("max |a-b|", justify="right", max_width=9, no_wrap=True)
    table.add_column("where", ratio=1, overflow="fold")
    run: List[Any] = []

    def flush() -> None:
        if not run:
            return
        steps = compact_steps([p.step for p in run])
        stages = ", ".join(dict.fromkeys(p.stage for p in run))
        cells = [steps, cell(stages)] + ([""] if show_call else [])
        table.add_row(*cells, _STATE_TEXT["equal"], "", f"{len(run)} pair{'s' if len(run) != 1 else ''}")
        run.clear()

    for pair in report.pairs:
        if pair.state == "equal":
            run.append(pair)
            continue
        flush()
        error = json_float(pair.max_abs)
        error_text = "" if error is None else (f"{error:.2e}" if isinstance(error, float) else str(error))
        cells = [str(pair.step), cell(pair.stage)]
        if show_call:
            cells.append(cell(f"{pair.mode} #{pair.gen_index}"))
        table.add_row(*cells, _STATE_TEXT[pair.state], error_text, cell(pair.brief()))
    flush()
    return table
