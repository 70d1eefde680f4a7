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

from rich.console import Console
from rich.markup import escape

from ._common import open_readonly, parse_steps
from ._render import Failure, UsageError, progress_bar
from ._timeline_draw import LINK_COLOUR, render, render_html, render_image
from ._timeline_layout import COLOURS, MAX_ARROWS, Cell, Link, Segment, Timeline, build_timeline

__all__ = [
    "COLOURS",
    "LINK_COLOUR",
    "MAX_ARROWS",
    "PROGRESS_ABOVE",
    "Cell",
    "Link",
    "Segment",
    "Timeline",
    "build_timeline",
    "render",
    "render_image",
    "render_html",
    "run",
]

# A journal with more generate calls than this shows progress on stderr; a smaller one draws quietly.
PROGRESS_ABOVE = 5000


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
            records = [r for r in journal.audit() if r.action != "released"]
            if progress:
                progress.update(task, advance=1, description=f"laying out {len(records)} calls")
            shown_runs = sorted({r.run for r in records if args.run is None or r.run == args.run})
            title = f"{os.path.basename(os.path.abspath(args.journal))}: run {', '.join(shown_runs)}"
            timeline = build_timeline(records, title=title, run=args.run, steps=steps, mode=args.mode)
            if not timeline.cells:
                raise Failure(f"no generate calls in {args.journal} match; nothing to draw")
            if progress:
                progress.update(task, advance=1, description=f"drawing {len(timeline.segments)} segments")
            try:
                render(timeline, args.out)
            except ImportError as exc:
                raise Failure(str(exc)) from None
            if progress:
                progress.update(task, advance=1, description="drawn")
    out.print(f"wrote {escape(args.out)} ({len(timeline.cells)} calls, {len(timeline.steps)} steps, "
              f"{len(timeline.segments)} segments, {len(timeline.links)} replay links"
              f"{'' if timeline.arrows or not timeline.links else f', no arrows above {MAX_ARROWS}'})")
    for hidden in timeline.hidden:
        out.print(f"  sources outside the view: {escape(hidden.describe())}")
    return 0
