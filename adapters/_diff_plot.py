"""The picture of a diff: one column per step, one row per stage, each pair coloured by its state.

`render_diff` writes ``.png`` (or ``.svg``) through matplotlib (the `stepjournal[timeline]` extra) or a
self-contained ``.html`` page (inline SVG, a tooltip on every cell, no extra). Where a pair differs
its largest absolute error is written into the cell.
"""

from __future__ import annotations

import html
import os
from typing import Dict, List, Optional, Tuple

from stepjournal import DiffReport, PairDiff
from stepjournal._diff_report import stage_rank

__all__ = ["STATE_COLOURS", "render_diff"]

STATE_COLOURS: Dict[str, str] = {
    "equal": "#2ca02c",
    "within_tolerance": "#a6dba0",
    "differing": "#d62728",
    "only_a": "#fdb863",
    "only_b": "#e08214",
    "damaged": "#542788",
    "unreadable": "#9e9e9e",
}
_LABELS = {
    "equal": "equal",
    "within_tolerance": "within tolerance",
    "differing": "differing",
    "only_a": "only in A",
    "only_b": "only in B",
    "damaged": "damaged",
    "unreadable": "unreadable",
}
# Worse states win when one cell holds several pairs (modes, call indices).
_SEVERITY = ("equal", "within_tolerance", "unreadable", "only_a", "only_b", "differing", "damaged")
_MAX_TICKS = 40


def _grid(report: DiffReport) -> Tuple[List[int], List[str], Dict[Tuple[int, str], PairDiff]]:
    """Steps (columns), rows (stage, plus mode and call index when not train #0) and the worst pair per cell."""
    steps = sorted({p.step for p in report.pairs})
    rows: Dict[str, Tuple] = {}
    cells: Dict[Tuple[int, str], PairDiff] = {}
    for p in report.pairs:
        row = p.stage + ("" if p.mode == "train" else f" ({p.mode})") + (f" #{p.gen_index}" if p.gen_index else "")
        rows.setdefault(row, (stage_rank(p.stage), p.mode != "train", p.mode, p.gen_index))
        held = cells.get((p.step, row))
        if held is None or _SEVERITY.index(p.state) > _SEVERITY.index(held.state):
            cells[(p.step, row)] = p
    return steps, sorted(rows, key=rows.__getitem__), cells


def _error_text(pair: PairDiff) -> Optional[str]:
    if pair.state not in ("differing", "within_tolerance") or pair.max_abs is None:
        return None
    return f"{pair.max_abs:.1e}" if pair.max_abs != float("inf") else "inf"


def _ticks(n: int) -> List[int]:
    stride = max(1, -(-n // _MAX_TICKS))
    return list(range(0, n, stride))


def render_image(report: DiffReport, out: str, *, title: str) -> None:
    """Draw the diff with matplotlib (``.png`` or ``.svg``)."""
    try:
        from matplotlib.collections import PatchCollection
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError:
        raise ImportError(
            "drawing PNG or SVG needs matplotlib: pip install 'stepjournal[timeline]' (or write --plot FILE.html)"
        ) from None
    steps, rows, cells = _grid(report)
    column = {s: i for i, s in enumerate(steps)}
    line = {r: i for i, r in enumerate(rows)}
    width = min(max(6.0, 3.0 + 0.5 * len(steps)), 60.0)
    height = min(max(2.4, 1.7 + 0.42 * len(rows)), 30.0)
    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_subplot()
    rects, colours = [], []
    for (step, row), pair in cells.items():
        x, y = column[step], line[row]
        rects.append(Rectangle((x - 0.45, y - 0.4), 0.9, 0.8))
        colours.append(STATE_COLOURS[pair.state])
        text = _error_text(pair) if len(steps) <= 60 else None
        if text:
            ax.text(x, y, text, ha="center", va="center", fontsize=6.5,
                    color="white" if pair.state == "differing" else "#222")
    ax.add_collection(PatchCollection(rects, facecolors=colours, edgecolors="none"))
    ax.set_xlim(-0.6, len(steps) - 0.4)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ticks = _ticks(len(steps))
    ax.set_xticks(ticks, [str(steps[i]) for i in ticks])
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("step (the number in a cell: its largest absolute error)", fontsize=8)
    ax.tick_params(length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    present = {p.state for p in cells.values()}
    handles = [Patch(facecolor=c, label=_LABELS[s]) for s, c in STATE_COLOURS.items() if s in present]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    ax.set_title(title, fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(out, format=os.path.splitext(out)[1][1:].lower())


def render_html(report: DiffReport, out: str, *, title: str) -> None:
    """Write the diff as one self-contained HTML page: an inline SVG with a tooltip on every cell."""
    steps, rows, cells = _grid(report)
    size_w, size_h, gap, left, top, bottom = 44, 22, 3, 150, 10, 40
    column = {s: i for i, s in enumerate(steps)}
    line = {r: i for i, r in enumerate(rows)}
    width = left + len(steps) * (size_w + gap) + 20
    height = top + len(rows) * (size_h + gap) + bottom
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">']
    for row, i in line.items():
        y = top + i * (size_h + gap) + size_h / 2 + 4
        parts.append(f'<text x="{left - 8}" y="{y}" text-anchor="end">{html.escape(row)}</text>')
    for i in _ticks(len(steps)):
        x = left + i * (size_w + gap) + size_w / 2
        parts.append(f'<text x="{x}" y="{height - bottom + 16}" text-anchor="middle">{steps[i]}</text>')
    parts.append(f'<text x="{left}" y="{height - 6}">step</text>')
    for (step, row), p in cells.items():
        x, y = left + column[step] * (size_w + gap), top + line[row] * (size_h + gap)
        tip = f"step {p.step} {row}: {_LABELS[p.state]}; {p.brief()}"
        parts.append(f'<g class="{p.state}"><title>{html.escape(tip)}</title>'
                     f'<rect x="{x}" y="{y}" width="{size_w}" height="{size_h}" rx="2" fill="{STATE_COLOURS[p.state]}"/>')
        text = _error_text(p)
        if text:
            fill = "white" if p.state == "differing" else "#222"
            parts.append(f'<text x="{x + size_w / 2}" y="{y + size_h / 2 + 4}" text-anchor="middle" '
                         f'font-size="9" fill="{fill}">{html.escape(text)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    present = {p.state for p in cells.values()}
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{c}"></span>{html.escape(_LABELS[s])}</span>'
        for s, c in STATE_COLOURS.items() if s in present
    )
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
.key {{ margin-right: 1.2em; white-space: nowrap; }}
.swatch {{ display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.35em; vertical-align: -0.1em; border-radius: 2px; }}
.scroll {{ overflow-x: auto; margin-top: 1em; }}
</style>
</head>
<body>
<h1 style="font-size:1.2em">{html.escape(title)}</h1>
<p><b>{html.escape(report.summary)}</b></p>
<p>{legend}</p>
<p>One column per step, one row per stage; the number in a cell is its largest absolute error. Hover over a
cell for where it differs.</p>
<div class="scroll">
{"".join(parts)}
</div>
</body>
</html>
"""
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(page)


def render_diff(report: DiffReport, out: str, *, title: str) -> None:
    """Write the picture of `report` to `out`: ``.png``/``.svg`` through matplotlib, ``.html`` self-contained."""
    if os.path.splitext(out)[1].lower() == ".html":
        render_html(report, out, title=title)
    else:
        render_image(report, out, title=title)
