"""``stepjournal report JOURNAL -o run.html``: one self-contained HTML file of a run, to browse offline.

What it holds: per train step, the generate call's action (generated, replayed and from which step,
released), the reward mean and spread and the mean response length of its samples, each stage's
duration, the ``metrics`` stage's numbers (TRL's loss and reward, verl's actor values) and the step's tool
calls (calls, replays, misses, tool time run and saved), of every session or of one (``--session``); and the
first ``--samples N`` samples of each step, their text cut at ``--chars`` characters, and shorter when the
texts would pass `TEXT_BUDGET` bytes in all (so 10 000 steps of 500 samples stay a file a browser opens: the
summaries cover every sample, the texts the first few of each step).
The charts are inline SVG drawn here; the table, a step's samples and the text search are a few lines of
script over the embedded data. Nothing is fetched: no CDN, no network.
"""

from __future__ import annotations

import argparse
import math
import numbers
import os
import statistics
from typing import Any, Dict, List, Optional, Tuple

from rich.console import Console

from stepjournal import Journal
from stepjournal.tools import tool_call_rows, tool_step_summaries
from stepjournal.errors import StepJournalError
from stepjournal.events import GenerationRecorded, ReplayServed, tool_of_stage
from stepjournal.index import session_names
from stepjournal.vocabulary import DEFAULT_MODE, Action

from ._args import nonneg_int
from ._common import choose_run, key_word
from ._render import Failure, UsageError, cell, human_size, print_line
from ._show_text import load_tokenizer, note_to

__all__ = ["add_arguments", "run", "collect", "step_metrics", "step_tools", "choose_session", "TEXT_BUDGET"]

METRICS = "metrics"  # the stage the adapters journal a step's logged numbers under
TEXT_BUDGET = 24 * 1024 * 1024  # characters of prompt and response text embedded in all
_MIN_CHARS = 80


def _stats(values: List[float]) -> Dict[str, Optional[float]]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"mean": None, "std": None}
    # exact sums (statistics' fractions): rewards of ±1e308 overflow a float sum of squares, never these
    return {"mean": statistics.mean(finite), "std": statistics.pstdev(finite)}


def _cut(text: Optional[str], chars: int) -> Optional[str]:
    return text if text is None or len(text) <= chars else text[:chars] + "…"


def collect(journal: Journal, run: str, tokenizer: Any, *, per_step: int, chars: int,
            session: Optional[str] = None, ids: bool = False) -> Dict[str, Any]:
    """The report's data: one entry per train step with a call, in step order (`export --tensorboard` writes
    the same, a session at a time).

    `session` (a full id): that session's calls only. Steps are read one at a time (one step's samples in
    memory), and only the first `per_step` samples of each are decoded: the summaries cover every sample, the
    text the ones embedded (`ids`: their token ids too, the first `chars`). Each entry holds the step's
    `metrics` (`step_metrics`) and its `tools` (`step_tools`)."""
    steps = _entries(journal, run, session)
    from stepjournal.tools import samples_of_steps  # here, with torch: building the parser imports neither

    filled: set = set()
    try:
        for step, found in samples_of_steps(journal, set(steps), run=run, tokenizer=tokenizer, decoded=per_step,
                                            session=session):
            _fill(steps[step], found, per_step, chars, ids)
            filled.add(step)
    except StepJournalError:  # a step whose payload was released (or is damaged): the others one by one
        for step in sorted(set(steps) - filled):
            try:
                found = journal.samples(step, run=run, tokenizer=tokenizer, decoded=per_step, session=session)
            except StepJournalError:
                found = []
            _fill(steps[step], found, per_step, chars, ids)
            filled.add(step)
    for step in set(steps) - filled:
        _fill(steps[step], [], per_step, chars, ids)
    texts = [(s, key) for e in steps.values() for s in e["samples"] for key in ("prompt", "response") if s[key]]
    total = sum(len(s[key]) for s, key in texts)
    if total > TEXT_BUDGET:  # cut every text to the share the budget leaves it
        chars = max(_MIN_CHARS, TEXT_BUDGET // len(texts))
        for sample, key in texts:
            sample[key] = _cut(sample[key], chars)
    stages = sorted({stage for e in steps.values() for stage in e["durations"]})
    metrics = sorted({name for e in steps.values() for name in e["metrics"]})
    return {"run": run, "steps": [steps[s] for s in sorted(steps)], "stages": stages, "metrics": metrics,
            "tools": any(e["tools"] is not None for e in steps.values()), "per_step": per_step, "chars": chars}


def step_tools(journal: Journal, run: str, shown: Dict[int, str]) -> Dict[int, Dict[str, Any]]:
    """The tool calls of each step in `shown` (step -> the session the report shows for it), counted as
    `audit --tools` counts them (`tool_step_summaries`): calls, replays, misses (refusals among them), tool time
    run and saved. Only those steps' call events are read."""
    if not shown:
        return {}
    rows = [row for row in tool_call_rows(journal, run=run, steps=set(shown), payloads=False)
            if row.mode == "train" and row.session == shown[row.step]]
    return {s.step: {"calls": s.calls, "replayed": s.replayed, "misses": s.misses, "refused": s.refused,
                     "tool_s": s.tool_s, "saved_s": s.saved_s} for s in tool_step_summaries(rows)}


def _entries(journal: Journal, run: str, session: Optional[str]) -> Dict[int, Dict[str, Any]]:
    """Each train step's entry (`_entry`), from the run's audit rows (of `session` only, when given; held here
    only), with its `metrics` and, where the session shown called tools, its `tools` (`step_tools`)."""
    names = session_names(opened.session for _, opened in journal.sessions())
    rows: Dict[int, List[Any]] = {}
    for r in journal.audit(run=run, mode=DEFAULT_MODE):
        if session is None or r.session == session:
            rows.setdefault(r.step, []).append(r)
    entries = {step: _entry(step, found, names) for step, found in rows.items()}
    with_tools: Dict[int, str] = {}
    for step, entry in entries.items():
        shown = entry.pop("shown_session")
        entry["metrics"] = step_metrics(journal, [r for r in rows[step] if r.session == shown])
        if any(r.session == shown and tool_of_stage(r.stage) is not None for r in rows[step]):
            with_tools[step] = shown
    for step, tools in step_tools(journal, run, with_tools).items():
        entries[step]["tools"] = tools
    return entries


def step_metrics(journal: Journal, rows: List[Any]) -> Dict[str, Optional[float]]:
    """The ``metrics`` stage's numbers among one session's `rows` of a step (TRL's loss, reward and kl, verl's
    actor and critic values): each call's payload, a dict of name -> value, read in log order, so a later call
    at the step (TRL's end-of-training log) adds its names and wins on a name both hold. Values that are not
    real numbers are left out; a non-finite one is None (JSON has no NaN); a released payload gives nothing."""
    values: Dict[str, Optional[float]] = {}
    for r in rows:
        if r.stage != METRICS or r.action not in (Action.GENERATED, Action.REPLAYED):
            continue
        event = journal.event(r.seq)
        if not isinstance(event, (GenerationRecorded, ReplayServed)) or event.output is None:  # stored nothing
            continue
        try:
            payload = journal.load(event.output, step=r.step)
        except StepJournalError:  # released or damaged: the step's other numbers still show
            continue
        if isinstance(payload, dict):
            for name, value in payload.items():
                if isinstance(value, numbers.Real) and not isinstance(value, bool):
                    values[str(name)] = _finite(value)
    return values


def _finite(value: numbers.Real) -> Optional[float]:
    """`value` as a float, None where it has none (NaN, inf, or an int past float's range: 10**400)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _shown(rows: List[Any]) -> Optional[Any]:
    """The generate call a step's row shows: its latest call #0 with an output (recorded and stored, or
    replayed), which is the call `samples` reads; else its latest call #0 (refused, bypassed, not stored)."""
    calls = [r for r in rows if r.stage == "generate" and r.gen_index == 0 and r.action != Action.RELEASED]
    served = [r for r in calls if r.action == Action.REPLAYED or (r.action == Action.GENERATED and r.stored)]
    return (served or calls or [None])[-1]


def _entry(step: int, rows: List[Any], names: Dict[str, str]) -> Dict[str, Any]:
    """A step's entry: the call shown and its session's durations; every other session's call #0 apart, in
    `others` (a refused replay session never stands for the recording it could not serve)."""
    shown = _shown(rows)
    calls = [r for r in rows if r.action != Action.RELEASED]
    # The session shown: the generate call's, else (a step of metrics or rewards only) the latest call's.
    session = shown.session if shown is not None else (calls[-1].session if calls else None)
    durations: Dict[str, float] = {}
    actions: Dict[str, int] = {}
    for r in calls:
        if r.session == session:
            durations[r.stage] = durations.get(r.stage, 0.0) + (r.duration_s or 0.0)
            actions[r.action] = actions.get(r.action, 0) + 1
    others: Dict[str, Dict[str, Any]] = {}
    for r in rows:
        if r.stage == "generate" and r.gen_index == 0 and r.action != Action.RELEASED and r.session != session:
            others[r.session] = {"session": names.get(r.session, r.session[:8]), "action": r.action,
                                 "source_step": r.source_step}
    return {"step": step, "action": shown.action if shown else None,
            "source_step": shown.source_step if shown else None,
            "session": names.get(session, session) if session else None, "others": list(others.values()),
            "released": any(r.action == Action.RELEASED and r.stage == "generate" for r in rows),
            "durations": durations, "calls": actions, "shown_session": session, "tools": None,
            "ts": max((r.ts for r in calls if r.session == session), default=None)}


def _fill(entry: Dict[str, Any], found: List[Any], per_step: int, chars: int, ids: bool) -> None:
    """A step's summaries over all its samples, and its first `per_step` samples as the page shows them."""
    rewards = [sum(s.rewards.values()) for s in found if s.rewards]
    entry.update(_stats(rewards))
    entry["length"] = _stats([float(s.response_length) for s in found])["mean"]
    entry["count"] = len(found)
    entry["samples"] = [{"index": s.index, "prompt": _cut(s.prompt, chars), "response": _cut(s.response, chars),
                         "length": s.response_length, "truncated": s.truncated,
                         "rewards": {k: v if math.isfinite(v) else None for k, v in s.rewards.items()}}
                        for s in found[:per_step]]
    if ids:
        for sample, s in zip(entry["samples"], found):
            sample["prompt_ids"], sample["response_ids"] = list(s.prompt_ids[:chars]), list(s.response_ids[:chars])


def choose_session(journal: Journal, run: Optional[str], given: str) -> Tuple[str, str, str]:
    """The session `given` names, (full id, short name, its run): its short name as `runs` and `audit` show it
    (``s2``), its id or a unique prefix of it; when `run` is given, it must be a session of `run`."""
    opened = [event for _, event in journal.sessions()]
    names = session_names(event.session for event in opened)
    found = [e for e in {e.session: e for e in opened}.values()
             if given and (names[e.session] == given or e.session.startswith(given))]
    if len(found) != 1:
        known = ", ".join(f"{names[e.session]} ({e.session[:8]})" for e in opened if run in (None, e.run)) or "none"
        whose = f"run {cell(run)}'s" if run is not None else "its"
        matches = "no" if not found else len(found)
        raise UsageError(f"--session {cell(given) or repr(given)}: {matches} session matches; "
                         f"{whose} sessions are: {known}")
    if run is not None and found[0].run != run:
        raise UsageError(f"--session {cell(given)} is a session of run {cell(found[0].run)}, not {cell(run)}")
    return found[0].session, names[found[0].session], found[0].run


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal report``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    p.add_argument("-o", "--out", required=True, metavar="FILE.html", help="the HTML file to write")
    p.add_argument("--run", type=key_word("run"), help="the run key (needed when the journal holds several)")
    p.add_argument("--session", metavar="S", help="only this session's calls, of its run (its name as runs and audit "
                   "show it, s2; or its id or a unique prefix); default: each step's generate call, whichever session "
                   "made it")
    p.add_argument("--tokenizer", metavar="PATH", help="the tokenizer folder (default: the one the run kept in the "
                   "journal, else the one its fingerprint names); loaded from local files only")
    p.add_argument("--no-text", action="store_true", help="no tokenizer: lengths and rewards only")
    p.add_argument("--samples", type=nonneg_int, default=8, metavar="N", help="samples embedded per step (default 8)")
    p.add_argument("--chars", type=nonneg_int, default=2000, metavar="N",
                   help="characters kept of each prompt and response (default 2000)")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ._report_html import render

    if os.path.splitext(args.out)[1].lower() not in (".html", ".htm"):
        raise UsageError(f"-o {args.out}: name an .html file")
    with Journal(args.journal, readonly=True) as journal:
        if args.session is not None:  # the session names its run ("", a script's unset variable, names none)
            session, name, run_key = choose_session(journal, args.run, args.session)
        else:
            session, name, run_key = None, None, choose_run(journal, args.run)
        notes: List[str] = []  # said once there is a report: an error stays the one line it is
        tokenizer = load_tokenizer(journal, run_key, args.tokenizer, notes.append) if not args.no_text else None
        data = collect(journal, run_key, tokenizer, per_step=args.samples, chars=args.chars, session=session)
    if not data["steps"]:
        raise Failure(f"run {cell(run_key)}{f' session {name}' if name else ''} has no train calls: nothing to report")
    for note in notes:
        note_to(err)(note)
    title = f"{os.path.basename(os.path.abspath(args.journal))}: run {run_key}" + (f", session {name}" if name else "")
    page = render(data, title=title)
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(page)
    print_line(out, f"wrote {cell(args.out)} ({len(data['steps'])} steps, {human_size(len(page.encode()))})")
    return 0
