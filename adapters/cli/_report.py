"""``stepjournal report JOURNAL -o run.html``: one self-contained HTML file of a run, to browse offline.

What it holds: per train step, the generate call's action (generated, replayed and from which step,
released), the reward mean and spread and the mean response length of its samples, and each stage's
duration; and the first ``--samples N`` samples of each step, their text cut at ``--chars`` characters,
and shorter when the texts would pass `TEXT_BUDGET` bytes in all (so 10 000 steps of 500 samples stay a
file a browser opens: the summaries cover every sample, the texts the first few of each step).
The charts are inline SVG drawn here; the table, a step's samples and the text search are a few lines of
script over the embedded data. Nothing is fetched: no CDN, no network.
"""

from __future__ import annotations

import argparse
import math
import statistics
import os
from typing import Any, Dict, List, Optional

from rich.console import Console

from stepjournal import Journal, StepJournalError, session_names

from ._args import nonneg_int
from ._common import choose_run
from ._render import Failure, UsageError, cell, human_size, print_line
from ._show_text import load_tokenizer, note_to

__all__ = ["add_arguments", "run", "collect", "TEXT_BUDGET"]

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


def collect(journal: Journal, run: str, tokenizer: Any, *, per_step: int, chars: int) -> Dict[str, Any]:
    """The report's data: one entry per train step with a generate call, in step order.

    Steps are read one at a time (one step's samples in memory), and only the first `per_step` samples of
    each are decoded: the summaries cover every sample, the text the ones embedded."""
    steps = _entries(journal, run)
    from stepjournal.index._samples import samples_of_steps  # here, with torch: building the parser imports neither

    filled: set = set()
    try:
        for step, found in samples_of_steps(journal, set(steps), run=run, tokenizer=tokenizer, decoded=per_step):
            _fill(steps[step], found, per_step, chars)
            filled.add(step)
    except StepJournalError:  # a step whose payload was released (or is damaged): the others one by one
        for step in sorted(set(steps) - filled):
            try:
                found = journal.samples(step, run=run, tokenizer=tokenizer, decoded=per_step)
            except StepJournalError:
                found = []
            _fill(steps[step], found, per_step, chars)
            filled.add(step)
    for step in set(steps) - filled:
        _fill(steps[step], [], per_step, chars)
    texts = [(s, key) for e in steps.values() for s in e["samples"] for key in ("prompt", "response") if s[key]]
    total = sum(len(s[key]) for s, key in texts)
    if total > TEXT_BUDGET:  # cut every text to the share the budget leaves it
        chars = max(_MIN_CHARS, TEXT_BUDGET // len(texts))
        for sample, key in texts:
            sample[key] = _cut(sample[key], chars)
    stages = sorted({stage for e in steps.values() for stage in e["durations"]})
    return {"run": run, "steps": [steps[s] for s in sorted(steps)], "stages": stages,
            "per_step": per_step, "chars": chars}


def _entries(journal: Journal, run: str) -> Dict[int, Dict[str, Any]]:
    """Each train step's entry (`_entry`), from the run's audit rows (held here only)."""
    names = session_names(opened.session for _, opened in journal.sessions())
    rows: Dict[int, List[Any]] = {}
    for r in journal.audit(run=run, mode="train"):
        rows.setdefault(r.step, []).append(r)
    return {step: _entry(step, found, names) for step, found in rows.items()}


def _shown(rows: List[Any]) -> Optional[Any]:
    """The generate call a step's row shows: its latest call #0 with an output (recorded and stored, or
    replayed), which is the call `samples` reads; else its latest call #0 (refused, bypassed, not stored)."""
    calls = [r for r in rows if r.stage == "generate" and r.gen_index == 0 and r.action != "released"]
    served = [r for r in calls if r.action == "replayed" or (r.action == "generated" and r.stored)]
    return (served or calls or [None])[-1]


def _entry(step: int, rows: List[Any], names: Dict[str, str]) -> Dict[str, Any]:
    """A step's entry: the call shown and its session's durations; every other session's call #0 apart, in
    `others` (a refused replay session never stands for the recording it could not serve)."""
    shown = _shown(rows)
    session = shown.session if shown is not None else None
    durations: Dict[str, float] = {}
    for r in rows:
        if r.action != "released" and (session is None or r.session == session):
            durations[r.stage] = durations.get(r.stage, 0.0) + (r.duration_s or 0.0)
    others: Dict[str, Dict[str, Any]] = {}
    for r in rows:
        if r.stage == "generate" and r.gen_index == 0 and r.action != "released" and r.session != session:
            others[r.session] = {"session": names.get(r.session, r.session[:8]), "action": r.action,
                                 "source_step": r.source_step}
    return {"step": step, "action": shown.action if shown else None, "source_step": shown.source_step if shown else None,
            "session": names.get(session, session) if session else None, "others": list(others.values()),
            "released": any(r.action == "released" and r.stage == "generate" for r in rows), "durations": durations}


def _fill(entry: Dict[str, Any], found: List[Any], per_step: int, chars: int) -> None:
    """A step's summaries over all its samples, and its first `per_step` samples as the page shows them."""
    rewards = [sum(s.rewards.values()) for s in found if s.rewards]
    entry.update(_stats(rewards))
    entry["length"] = _stats([float(s.response_length) for s in found])["mean"]
    entry["count"] = len(found)
    entry["samples"] = [{"index": s.index, "prompt": _cut(s.prompt, chars), "response": _cut(s.response, chars),
                         "length": s.response_length, "truncated": s.truncated,
                         "rewards": {k: v if math.isfinite(v) else None for k, v in s.rewards.items()}}
                        for s in found[:per_step]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal report``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    p.add_argument("-o", "--out", required=True, metavar="FILE.html", help="the HTML file to write")
    p.add_argument("--run", help="the run key (needed when the journal holds several)")
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
        run_key = choose_run(journal, args.run)
        notes: List[str] = []  # said once there is a report: an error stays the one line it is
        tokenizer = load_tokenizer(journal, run_key, args.tokenizer, notes.append) if not args.no_text else None
        data = collect(journal, run_key, tokenizer, per_step=args.samples, chars=args.chars)
    if not data["steps"]:
        raise Failure(f"run {cell(run_key)} has no train calls: nothing to report")
    for note in notes:
        note_to(err)(note)
    page = render(data, title=f"{os.path.basename(os.path.abspath(args.journal))}: run {run_key}")
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(page)
    print_line(out, f"wrote {cell(args.out)} ({len(data['steps'])} steps, {human_size(len(page.encode()))})")
    return 0
