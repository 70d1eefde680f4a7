"""``stepjournal timeline``: the picture of a journal: one column per step, one lane per session and call.

The layout (`_timeline_layout`: cells merged into segments, policy-clause bands, replay links, sources
a filter hides) and the drawing (`_timeline_draw`: matplotlib PNG/SVG with a "source step vs step"
panel, or a self-contained HTML page) live in their own modules; this one is the verb. Sessions are
numbered over the whole journal before ``--run`` / ``--steps`` / ``--mode`` filter the view.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Dict, List, Optional

from rich.console import Console
from rich.markup import escape

from stepjournal import Journal
from stepjournal.tools import json_rows
from stepjournal.vocabulary import Action

from ._common import names_of_sessions, open_readonly, parse_steps, key_word
from ._progress import progress_bar
from ._render import Failure, UsageError, clean, print_line
from ._timeline_draw import LINK_COLOUR, render, render_html, render_image
from ._timeline_layout import (COLOURS, MAX_ARROWS, Cell, Link, Row, Segment, Timeline, build_timeline,
                               build_timeline_rows)

__all__ = ["add_arguments",
    "COLOURS",
    "LINK_COLOUR",
    "MAX_ARROWS",
    "PROGRESS_ABOVE",
    "Cell",
    "Link",
    "Segment",
    "Timeline",
    "build_timeline",
    "build_timeline_rows",
    "read_rows",
    "render",
    "render_image",
    "render_html",
    "run",
]

# A journal with more generate calls than this shows progress on stderr; a smaller one draws quietly.
PROGRESS_ABOVE = 5000


def _clean_or_none(text: Optional[str]) -> Optional[str]:
    return None if text is None else clean(text)


# The journal text a picture shows; each distinct value is cleaned once.
_TEXT_FIELDS = ("run", "mode", "policy", "reason")


class _Cleaned(dict):
    """Each distinct journal text made safe (`clean`) once: ``safe[text]``."""

    def __missing__(self, text: str) -> str:
        found = self[text] = clean(text)
        return found


def read_rows(journal: Journal) -> List[Row]:
    """Every call of the journal as an audit row (what `Journal.audit` gives, as rows straight from the
    stored maps: `stepjournal.index._call_rows`), with its journal text (run, mode, policy, reason, source
    run) made safe to draw and print (`clean`): a picture's labels and the lines below it never carry
    a journal's control characters."""
    released: Dict[int, int] = {}
    rows: List[Row] = []
    for row in json_rows(journal.raw_events(), timed=False, native=True, plain=True):  # call events decoded in C
        if row["action"] == "released":  # retention released a record's payloads: no call of its own
            if row["source_seq"] is not None:  # this journal's seq of the record, pulled or not
                released[row["source_seq"]] = row["seq"]
            continue
        rows.append(row)
    safe = _Cleaned()
    for row in rows:
        for field in _TEXT_FIELDS:
            row[field] = safe[row[field]]
        if row["source_run"] is not None:
            row["source_run"] = safe[row["source_run"]]
        if released and row["action"] == Action.GENERATED and row["seq"] in released:
            row["released_by"] = released[row["seq"]]
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal timeline``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    p.add_argument("--out", required=True, metavar="FILE", help="FILE.png, FILE.svg or FILE.html")
    p.add_argument("--run", type=key_word("run"), help="only this run key")
    p.add_argument("--steps", metavar="RANGES", help="only these steps")
    p.add_argument("--mode", type=key_word("mode"), help="only this mode")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    extension = os.path.splitext(args.out)[1].lower()
    if extension not in (".png", ".svg", ".html"):
        raise UsageError(f"--out {args.out}: name a .png, .svg or .html file")
    steps = parse_steps(args.steps)
    with open_readonly(args.journal) as journal:
        large = journal.last_seq() > PROGRESS_ABOVE  # events, a cheap upper bound on the calls
        with (progress_bar(err) if large else contextlib.nullcontext()) as progress:
            task = progress.add_task("reading the journal", total=3) if progress else None
            # every call: sessions are numbered over the whole journal; releases mark their records
            rows = read_rows(journal)
            if progress:
                progress.update(task, advance=1, description=f"laying out {len(rows)} calls")
            # The filter is compared with the cleaned text: a run key given raw or as it is shown both match.
            run_key, mode = _clean_or_none(args.run), _clean_or_none(args.mode)
            shown_runs = sorted({r["run"] for r in rows if run_key is None or r["run"] == run_key})
            title = f"{os.path.basename(os.path.abspath(args.journal))}: run {', '.join(shown_runs)}"
            sessions = list(names_of_sessions(journal.run_summaries()))  # named as runs and audit name them
            timeline = build_timeline_rows(rows, title=title, run=run_key, steps=steps, mode=mode, sessions=sessions)
            if not timeline.calls:
                raise Failure(f"no generate calls in {args.journal} match; nothing to draw")
            if progress:
                progress.update(task, advance=1, description=f"drawing {len(timeline.segments)} segments")
            try:
                render(timeline, args.out)
            except ImportError as exc:
                raise Failure(str(exc)) from None
            if progress:
                progress.update(task, advance=1, description="drawn")
    links = len(timeline.link_pairs)
    print_line(out, f"wrote {escape(args.out)} ({timeline.calls} calls, {len(timeline.steps)} steps, "
               f"{len(timeline.segments)} segments, {links} replay links"
               f"{'' if timeline.arrows or not links else f', no arrows above {MAX_ARROWS}'})")
    for hidden in timeline.hidden:
        out.print(f"  sources outside the view: {escape(hidden.describe())}")
    return 0
