"""The tool calls of a journal on the command line: ``audit --tools`` (a row per call, a summary per step),
``show STEP --text --sample S`` (one sample's calls as its turns) and ``diff A B --tools`` (the first differing
tool response). The rows are `stepjournal.tools.tool_call_rows`'."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from rich.console import Console

from stepjournal.tools import ToolCallRow, tool_call_rows, tool_step_summaries
from stepjournal.vocabulary import ToolOutcome

from ._common import choose_run, open_readonly, parse_steps
from ._render import FittedColumns, UsageError, cell, plain_table, print_json, print_line

if TYPE_CHECKING:
    from stepjournal import Journal

__all__ = ["run_audit", "run_show", "run_diff", "row_json"]

_CALLS = (("step", "right", 6), ("call", "left", 12), ("tool", "left", 16), ("outcome", "left", 9),
          ("time", "right", 7), ("saved", "right", 7), ("arguments", "left", None))
# A sample's assistant texts, one per turn, and each turn's generate call event (empty: one call holds them all).
_Said = Tuple[List[str], List[int]]
_SUMMARY = ("step", "calls", "replayed", "misses", "refused", "tool time", "saved")


def _seconds(value: float) -> str:
    return f"{value:.2f}s"


def _json_float(value: Any) -> Any:
    """A reward for JSON, which has no NaN or infinity: those as their names (``"nan"``, ``"inf"``)."""
    return repr(value) if isinstance(value, float) and not math.isfinite(value) else value


def row_json(row: Any) -> Dict[str, Any]:
    """A tool call's row as ``audit --tools --json`` prints it."""
    response = row.response
    return {
        "seq": row.seq, "run": row.run, "step": row.step, "mode": row.mode, "stage": row.stage, "tool": row.tool,
        "sample": row.key.sample, "turn": row.key.turn, "call": row.key.call, "outcome": row.outcome,
        "arguments": None if row.request is None else row.request.arguments,
        "response": None if response is None else response.text,
        "reward": None if response is None else _json_float(response.reward),
        "duration_s": row.duration_s, "saved_s": row.saved_s,
        "source": None if row.source_key is None else str(row.source_key),
    }


def _counted(rows: List[ToolCallRow], args: argparse.Namespace) -> List[ToolCallRow]:
    """The calls `audit`'s count options keep: the newest N (``-n`` / ``--last``) or the oldest N (``--first``)."""
    if args.last is not None:
        return rows[len(rows) - args.last:] if args.last else []
    return rows if args.first is None else rows[:args.first]


def run_audit(args: argparse.Namespace, out: Console) -> int:
    """``stepjournal audit JOURNAL --tools``: each tool call, then per step its calls, misses and tool time saved."""
    steps = parse_steps(args.steps)
    with open_readonly(args.journal, check="as-read") as journal:
        rows = tool_call_rows(journal, run=args.run, steps=steps)
    rows = [row for row in rows if args.mode is None or row.mode == args.mode]
    if args.stage is not None:
        rows = [row for row in rows if row.stage == args.stage]
    summaries = tool_step_summaries(rows)
    if args.json:
        print_json({"calls": [row_json(row) for row in _counted(rows, args)],
                    "steps": [{"run": s.run, "step": s.step, "calls": s.calls, "replayed": s.replayed,
                               "misses": s.misses, "refused": s.refused, "tool_s": s.tool_s, "saved_s": s.saved_s}
                              for s in summaries]})
        return 0
    if not rows:
        print_line(out, f"journal {cell(args.journal)} has no tool calls")
        return 0
    print_line(out, f"tool calls in {cell(args.journal)}")
    texts = [[str(row.step), str(row.key), cell(row.tool), row.outcome, _seconds(row.duration_s),
              _seconds(row.saved_s) if row.outcome is ToolOutcome.REPLAYED else "-",
              cell(row.request.arguments if row.request is not None else "-")] for row in _counted(rows, args)]
    layout = FittedColumns(out.width, _CALLS, whole=("step", "outcome"))
    layout.measure(texts)
    table = layout.table()
    for cells in texts:
        table.add_row(*cells)
    out.print(table)
    out.print("per step")
    summary = plain_table()
    for name in _SUMMARY:
        summary.add_column(name, justify="left" if name == "step" else "right", no_wrap=True)
    for s in summaries:
        summary.add_row(str(s.step), str(s.calls), str(s.replayed), str(s.misses), str(s.refused),
                        _seconds(s.tool_s), _seconds(s.saved_s))
    out.print(summary)
    return 0


def run_show(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``stepjournal show JOURNAL STEP --text --sample S``: the sample as its turns, each session apart: the
    assistant's text of each turn (where the step's generate call marks the tokens tools wrote, as verl's
    ToolAgentLoop batches do, or where each turn is a generate call of its own, as in TRL's tool loop), then each
    tool call of the turn with its arguments, its response and whether it was recorded, replayed or a miss."""
    with open_readonly(args.journal, check="as-read") as journal:
        rows = tool_call_rows(journal, run=args.run, steps=[args.step], sample=args.sample)
        rows = [row for row in rows if row.mode == args.mode]
        if args.json:
            print_json([row_json(row) for row in rows])
            return 0
        if not rows:  # the sample's assistant text alone, from the step's latest generate call (if it has one)
            said = _assistant_turns(journal, choose_run(journal, args.run), args, [None], err, check_range=True)
            print_line(out, f"step {args.step} sample {args.sample}: no tool calls in {cell(args.journal)}")
            for number, text in enumerate(said.get(None, ([], []))[0]):
                out.print(f"  turn {number}", highlight=False)
                _print_assistant(out, text)
            return 0
        sessions: List[str] = []
        for row in rows:
            if row.session not in sessions:
                sessions.append(row.session)
        said = _assistant_turns(journal, rows[0].run, args, sessions, err)
    for number, session in enumerate(sessions, 1):
        out.print(f"[bold]step {args.step} sample {args.sample}[/] · session {number} of {len(sessions)} "
                  f"({cell(session[:8])})", highlight=False)
        turns, events = said.get(session, ([], []))
        mine = [r for r in rows if r.session == session]
        if events:
            _print_in_log_order(out, mine, turns, events)
        else:
            _print_by_turn(out, mine, turns)
    return 0


def _print_by_turn(out: Console, rows: Sequence[ToolCallRow], turns: Sequence[str]) -> None:
    """The turns of one generate call's response (verl's): assistant turn N above the calls keyed turn N."""
    turn: Optional[int] = None
    shown = set()
    for row in rows:
        if row.key.turn != turn:
            turn = row.key.turn
            out.print(f"  turn {turn}", highlight=False)
            if turn not in shown and turn < len(turns):
                _print_assistant(out, turns[turn])
            shown.add(turn)
        _print_call(out, row)
    for later in range(len(turns)):  # the turns that called no tool: the final answer among them
        if later not in shown:
            out.print(f"  turn {later}", highlight=False)
            _print_assistant(out, turns[later])


def _print_in_log_order(out: Console, rows: Sequence[ToolCallRow], turns: Sequence[str],
                        events: Sequence[int]) -> None:
    """The turns of a tool loop that journals each turn's generation as a call of its own (TRL's): each assistant
    text above the calls journaled after its generate call and before the next, under their key's turn."""
    pending: List[str] = []
    texts = sorted(zip(events, turns))
    turn: Optional[int] = None
    for row in rows:
        while texts and texts[0][0] < row.seq:
            pending.append(texts.pop(0)[1])
        if row.key.turn != turn or pending:
            turn = row.key.turn
            out.print(f"  turn {turn}", highlight=False)
        for text in pending:
            _print_assistant(out, text)
        pending = []
        _print_call(out, row)
    pending += [text for _, text in texts]
    if pending:  # the last answer, after which the sample called no tool
        out.print("  no tool call", highlight=False)
        for text in pending:
            _print_assistant(out, text)


def _print_call(out: Console, row: ToolCallRow) -> None:
    arguments = row.request.arguments if row.request is not None else "-"
    source = f" from {row.source_key}" if row.source_key is not None and row.source_key != row.key else ""
    out.print(f"    {cell(row.tool)}({cell(arguments)})  [dim]{row.outcome}{source}[/]", highlight=False)
    if row.response is not None:
        for line in row.response.text.splitlines() or [""]:
            out.print(f"      → {cell(line)}", highlight=False)


def _assistant_turns(journal: "Journal", run: str, args: argparse.Namespace, sessions: Sequence[Optional[str]],
                     err: Console, check_range: bool = False) -> Dict[Optional[str], _Said]:
    """Per session, the sample's assistant text of each turn (`Sample.turns` decoded, or its token ids without a
    tokenizer) and, where each turn is a generate call of its own, each turn's call event (`Sample.turn_events`),
    from the step's generate call of that session (None: its latest); nothing for a session without one, or whose
    generate calls do not tell the sample's turns apart.

    Raises:
        UsageError: `check_range` and a generate call of the step has no sample ``args.sample``.
    """
    from stepjournal import Sample
    from stepjournal.errors import JournalError

    from ._show_text import load_tokenizer, note_to

    tokenizer, loaded = None, False
    said: Dict[Optional[str], _Said] = {}
    for session in sessions:
        try:
            found = journal.samples(args.step, run=run, mode=args.mode, session=session, decoded=0)
        except JournalError:  # no generate call of this session here, or none in a form read: the calls alone
            continue
        if check_range and args.sample >= len(found):
            raise UsageError(f"--sample {args.sample}: the generate call of step {args.step} has {len(found)} samples "
                             f"(0 to {len(found) - 1}); choose one of them")
        if args.sample >= len(found) or not found[args.sample].turns:
            continue
        if not loaded:
            tokenizer, loaded = load_tokenizer(journal, run, args.tokenizer, note_to(err)), True
        sample: Sample = found[args.sample]
        said[session] = ([tokenizer.decode(list(ids), skip_special_tokens=True) if tokenizer is not None
                          else " ".join(map(str, ids)) for ids in sample.turns], list(sample.turn_events))
    return said


def _print_assistant(out: Console, text: str) -> None:
    for line in text.strip("\n").splitlines() or [""]:  # a turn's own lines, less the newlines around its tokens
        out.print(f"    assistant: {cell(line)}", highlight=False)


def run_diff(args: argparse.Namespace, out: Console) -> int:
    """``stepjournal diff A B --tools``: the first tool call whose response differs (each side's latest answer
    per key, in --run-a / --run-b, needed when a side holds several runs, and --steps, --mode, --stage); exit
    status 1 when one differs, 0 when none does.

    Raises:
        DiffError: a side holds tool calls of several runs and names none.
    """
    from stepjournal.tools import first_tool_difference
    from stepjournal.errors import DiffError

    steps = parse_steps(args.steps)
    sides = []
    for side, path, run in (("A", args.journal_a, args.run_a), ("B", args.journal_b, args.run_b)):
        with open_readonly(path, check="as-read") as journal:
            rows = tool_call_rows(journal, run=run, steps=steps)
        runs = sorted({row.run for row in rows})
        if len(runs) > 1:  # one run's calls are compared with the other side's, never a mix of runs
            raise DiffError(f"journal {side} ({path}) holds tool calls of several runs ({', '.join(runs)}); "
                            f"choose one with --run-{side.lower()}")
        sides.append([row for row in rows if (args.mode is None or row.mode == args.mode)
                      and (args.stage is None or row.stage == args.stage)])
    difference = first_tool_difference(*sides)
    if args.json:
        print_json({"first_difference": difference, "calls_a": len(sides[0]), "calls_b": len(sides[1])})
    elif difference is None:
        print_line(out, f"tool responses: the same ({len(sides[0])} and {len(sides[1])} tool call events)")
    else:
        print_line(out, f"first differing tool response: {cell(difference)}")
    return 0 if difference is None else 1
