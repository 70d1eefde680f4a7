"""``stepjournal timeline``: the picture of a journal: one column per step, one lane per session and call, replays linked.

`build_timeline` turns audit records into a layout (cells and links, no drawing); `render_image` draws
it with matplotlib (PNG or SVG, the `stepjournal[timeline]` extra) and `render_html` writes a
self-contained HTML page with an inline SVG and a tooltip on every cell (no extra needed).
"""

from __future__ import annotations

import argparse
import html
import math
import os
from typing import Dict, List, Sequence, Tuple

import attrs

from rich.console import Console
from rich.markup import escape

from stepjournal import AuditRecord

from ._common import open_readonly, parse_steps
from ._render import Failure, UsageError

__all__ = [
    "COLOURS",
    "LINK_COLOUR",
    "Cell",
    "Link",
    "Timeline",
    "build_timeline",
    "render",
    "render_image",
    "render_html",
    "run",
]

# One colour per action; a generated call that stored no output (passthrough) is a paler green.
COLOURS: Dict[str, str] = {
    "generated": "#2ca02c",
    "generated (not stored)": "#a6dba0",
    "replayed": "#1f77b4",
    "bypassed": "#9e9e9e",
    "refused": "#d62728",
}
LINK_COLOUR = "#08306b"
_MAX_TICKS = 40


@attrs.frozen
class Cell:
    """One generate call, placed at (column, lane)."""

    column: int
    lane: int
    record: AuditRecord

    @property
    def colour_key(self) -> str:
        if self.record.action == "generated" and not self.record.stored:
            return "generated (not stored)"
        return self.record.action

    def describe(self) -> str:
        r = self.record
        text = f"step {r.step} #{r.gen_index} ({r.mode}, run {r.run}): {r.action}"
        if r.action == "replayed":
            text += f" from step {r.source_step} #{r.source_gen_index}"
        return f"{text}; policy {r.policy}: {r.reason} (event #{r.seq})"


@attrs.frozen
class Link:
    """A replay (`to`) and the recorded call it was served from (`source`)."""

    source: Cell
    to: Cell


@attrs.frozen
class Timeline:
    """What to draw: the step of each column, the label of each lane, the cells and the links."""

    title: str
    steps: Tuple[int, ...]
    lanes: Tuple[str, ...]
    cells: Tuple[Cell, ...]
    links: Tuple[Link, ...]


def build_timeline(records: Sequence[AuditRecord], *, title: str) -> Timeline:
    """Lay out audit records: columns are the distinct steps in order; a lane is (session, mode, index).

    Sessions are numbered s1, s2 ... in order of their first call, so a resumed run shows the first
    session's generations above the replays that the next session served from them. When one lane
    holds several calls of the same step, the latest one is drawn.
    """
    steps = sorted({r.step for r in records})
    column_of = {step: i for i, step in enumerate(steps)}
    session_no: Dict[str, int] = {}
    for r in records:
        session_no.setdefault(r.session, len(session_no) + 1)
    lane_keys = sorted(
        {(session_no[r.session], r.run, r.mode != "train", r.mode, r.gen_index) for r in records}
    )
    several_runs = len({r.run for r in records}) > 1
    lane_of = {key: i for i, key in enumerate(lane_keys)}
    labels = tuple(
        f"s{s} {run + ' ' if several_runs else ''}{mode} #{index}" for s, run, _, mode, index in lane_keys
    )
    placed: Dict[Tuple[int, int], Cell] = {}
    for r in records:
        lane = lane_of[(session_no[r.session], r.run, r.mode != "train", r.mode, r.gen_index)]
        placed[(column_of[r.step], lane)] = Cell(column_of[r.step], lane, r)
    cells = tuple(sorted(placed.values(), key=lambda c: (c.column, c.lane)))
    by_seq = {c.record.seq: c for c in cells}
    links = tuple(
        Link(by_seq[c.record.source_seq], c)
        for c in cells
        if c.record.action == "replayed" and c.record.source_seq in by_seq
    )
    return Timeline(title=title, steps=tuple(steps), lanes=labels, cells=cells, links=links)


def _tick_columns(n: int) -> List[int]:
    every = max(1, math.ceil(n / _MAX_TICKS))
    return list(range(0, n, every))


def render_image(timeline: Timeline, out: str) -> None:
    """Draw the timeline to a PNG or SVG file (the format follows the extension) with matplotlib.

    Raises:
        ImportError: matplotlib is not installed; the message names the extra to install.
    """
    try:
        from matplotlib.figure import Figure
        from matplotlib.collections import PatchCollection
        from matplotlib.patches import FancyArrowPatch, Patch, Rectangle
    except ImportError:
        raise ImportError(
            "drawing PNG or SVG needs matplotlib: pip install 'stepjournal[timeline]' (or write --out FILE.html)"
        ) from None

    ncols, nlanes = len(timeline.steps), len(timeline.lanes)
    width = min(max(6.0, 2.5 + 0.32 * ncols), 60.0)
    height = min(max(2.6, 1.6 + 0.34 * nlanes), 40.0)
    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_subplot()
    rects = [Rectangle((c.column - 0.4, c.lane - 0.38), 0.8, 0.76) for c in timeline.cells]
    colours = [COLOURS[c.colour_key] for c in timeline.cells]
    ax.add_collection(PatchCollection(rects, facecolors=colours, edgecolors="none"))
    for link in timeline.links:
        a, b = link.source, link.to
        # A replay of the same step (a resumed run) is a short, nearly straight drop; others arc.
        bend = 0.3 if b.column != a.column else 0.12
        ax.add_patch(
            FancyArrowPatch(
                (a.column, a.lane),
                (b.column, b.lane),
                connectionstyle=f"arc3,rad={bend}",
                arrowstyle="-|>",
                mutation_scale=9,
                color=LINK_COLOUR,
                linewidth=1.0,
                alpha=0.75,
                shrinkA=6,
                shrinkB=4,
                zorder=3,
            )
        )
    ax.set_xlim(-0.7, ncols - 0.3)
    ax.set_ylim(nlanes - 0.4, -0.6)
    ticks = _tick_columns(ncols)
    ax.set_xticks(ticks, [str(timeline.steps[i]) for i in ticks])
    ax.set_yticks(range(nlanes), timeline.lanes)
    ax.set_xlabel("step")
    ax.tick_params(length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    present = {c.colour_key for c in timeline.cells}
    handles = [Patch(facecolor=colour, label=name) for name, colour in COLOURS.items() if name in present]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    ax.set_title(timeline.title, fontsize=10, loc="left")
    fig.tight_layout()
    fig.savefig(out, format=os.path.splitext(out)[1][1:].lower())


def _toward(x: float, y: float, tx: float, ty: float, distance: float) -> Tuple[float, float]:
    """The point `distance` away from (x, y) in the direction of (tx, ty)."""
    length = math.hypot(tx - x, ty - y) or 1.0
    return x + (tx - x) / length * distance, y + (ty - y) / length * distance


def render_html(timeline: Timeline, out: str) -> None:
    """Write the timeline as one self-contained HTML file (inline SVG, a tooltip on every cell)."""
    size, gap = 18, 4
    left, top, bottom = 170, 14, 40
    ncols, nlanes = len(timeline.steps), len(timeline.lanes)
    width = left + ncols * (size + gap) + 20
    height = top + nlanes * (size + gap) + bottom

    def cx(column: int) -> float:
        return left + column * (size + gap) + size / 2

    def cy(lane: int) -> float:
        return top + lane * (size + gap) + size / 2

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
    ]
    for lane, label in enumerate(timeline.lanes):
        parts.append(f'<text x="{left - 8}" y="{cy(lane) + 4}" text-anchor="end">{html.escape(label)}</text>')
    for column in _tick_columns(ncols):
        parts.append(
            f'<text x="{cx(column)}" y="{height - bottom + 16}" text-anchor="middle">{timeline.steps[column]}</text>'
        )
    parts.append(f'<text x="{left}" y="{height - 6}">step</text>')
    for c in timeline.cells:
        parts.append(
            f'<rect class="{c.record.action}" x="{cx(c.column) - size / 2}" y="{cy(c.lane) - size / 2}" '
            f'width="{size}" height="{size}" rx="2" fill="{COLOURS[c.colour_key]}">'
            f"<title>{html.escape(c.describe())}</title></rect>"
        )
    for link in timeline.links:
        a, b = link.source, link.to
        x0, y0, x1, y1 = cx(a.column), cy(a.lane), cx(b.column), cy(b.lane)
        # Bend each link sideways from its straight line, so links between the same lanes stay apart.
        mx, my = (x0 + x1) / 2, (y0 + y1) / 2
        dx, dy = x1 - x0, y1 - y0
        length = math.hypot(dx, dy) or 1.0
        bend = 0.25 * length + 6 if dx else 0.1 * length + 3  # a resumed run's same-step replay: nearly straight
        qx, qy = mx - dy / length * bend, my + dx / length * bend
        # Leave the source and reach the replay at their borders, along the curve's end tangents.
        x0, y0 = _toward(x0, y0, qx, qy, size / 2)
        x1, y1 = _toward(x1, y1, qx, qy, size / 2 + 2)
        # The arrowhead is drawn, not a marker: markers' orientation differs between SVG renderers.
        ux, uy = _toward(0, 0, x1 - qx, y1 - qy, 1.0)
        head = [(x1, y1), (x1 - 7 * ux - 3.5 * uy, y1 - 7 * uy + 3.5 * ux), (x1 - 7 * ux + 3.5 * uy, y1 - 7 * uy - 3.5 * ux)]
        parts.append(
            f'<g class="link" fill="none" stroke="{LINK_COLOUR}" stroke-opacity="0.75" stroke-width="1.2">'
            f"<title>{html.escape(b.describe())}</title>"
            f'<path d="M{x0:.1f},{y0:.1f} Q{qx:.1f},{qy:.1f} {x1 - 5 * ux:.1f},{y1 - 5 * uy:.1f}"/>'
            f'<polygon points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in head)}" fill="{LINK_COLOUR}" stroke="none"/>'
            "</g>"
        )
    parts.append("</svg>")
    present = {c.colour_key for c in timeline.cells}
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{colour}"></span>{html.escape(name)}</span>'
        for name, colour in COLOURS.items()
        if name in present
    )
    counts: Dict[str, int] = {}
    for c in timeline.cells:
        counts[c.record.action] = counts.get(c.record.action, 0) + 1
    summary = ", ".join(f"{n} {action}" for action, n in counts.items())
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(timeline.title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
.key {{ margin-right: 1.2em; white-space: nowrap; }}
.swatch {{ display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.35em; vertical-align: -0.1em; border-radius: 2px; }}
.scroll {{ overflow-x: auto; margin-top: 1em; }}
</style>
</head>
<body>
<h1 style="font-size:1.2em">{html.escape(timeline.title)}</h1>
<p>{legend}</p>
<p>{html.escape(summary)}. Lanes are sessions (s1, s2 … in order) × mode × call index; arrows run from
the recorded call to each replay served from it. Hover over a cell for its policy and reason.</p>
<div class="scroll">
{"".join(parts)}
</div>
</body>
</html>
"""
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(page)


def render(timeline: Timeline, out: str) -> None:
    """Write the timeline to `out`: ``.png`` or ``.svg`` through matplotlib, ``.html`` self-contained."""
    if os.path.splitext(out)[1].lower() == ".html":
        render_html(timeline, out)
    else:
        render_image(timeline, out)


# -- the verb --------------------------------------------------------------------------------------
def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    extension = os.path.splitext(args.out)[1].lower()
    if extension not in (".png", ".svg", ".html"):
        raise UsageError(f"--out {args.out}: name a .png, .svg or .html file")
    steps = parse_steps(args.steps)
    with open_readonly(args.journal) as journal:
        records = journal.audit(run=args.run, steps=steps, mode=args.mode)
    if not records:
        raise Failure(f"no generate calls in {args.journal} match; nothing to draw")
    runs = sorted({r.run for r in records})
    title = f"{os.path.basename(os.path.abspath(args.journal))}: run {', '.join(runs)}"
    try:
        render(build_timeline(records, title=title), args.out)
    except ImportError as exc:
        raise Failure(str(exc)) from None
    out.print(f"wrote {escape(args.out)} ({len(records)} calls, {len({r.step for r in records})} steps)")
    return 0
