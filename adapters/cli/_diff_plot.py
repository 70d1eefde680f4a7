"""The picture of a diff: one column per step, one row per stage, each pair coloured by its state.

`render_diff` writes ``.png`` (or ``.svg``) through matplotlib (the `stepjournal[timeline]` extra) or a
self-contained ``.html`` page (a grid table, a tooltip on every cell, no extra). Where a pair differs
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
    """Write the diff as one self-contained HTML page: a grid table with a tooltip on every cell."""
    steps, rows, cells = _grid(report)
    esc = html.escape
    head = "".join(f"<th>{step}</th>" for step in steps)
    body = []
    for row in rows:
        tds = []
        for step in steps:
            p = cells.get((step, row))
            if p is None:
                tds.append("<td></td>")
                continue
            text = _error_text(p) or ""
            tip = f"step {p.step} {row}: {_LABELS[p.state]}; {p.brief()}"
            tds.append(f'<td class="{p.state}" style="background:{STATE_COLOURS[p.state]}" title="{esc(tip)}">{esc(text)}</td>')
        body.append(f'<tr><th class="row">{esc(row)}</th>{"".join(tds)}</tr>')
    legend = " ".join(
        f'<span style="background:{c};padding:0 0.6em">&nbsp;</span> {esc(_LABELS[s])}'
        for s, c in STATE_COLOURS.items() if s in {p.state for p in cells.values()}
    )
    lines = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        "<style>body{font:14px sans-serif;margin:1.5em;color:#222} table{border-collapse:separate;border-spacing:3px}"
        " td{width:4.2em;height:1.6em;text-align:center;font-size:11px;border-radius:2px}"
        " td.differing{color:white} th{font-weight:normal;font-size:12px} th.row{text-align:right;padding-right:.6em}"
        " .grid{overflow-x:auto}</style></head><body>",
        f"<pre>{esc(title)}</pre>",
        f"<p>{legend}</p>",
        "<p>One column per step, one row per stage; the number in a cell is its largest absolute error."
        " Hover over a cell for where it differs.</p>",
        f'<div class="grid"><table><tr><th></th>{head}</tr>{"".join(body)}</table></div>',
        "</body></html>",
    ]
    with open(out, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


def render_diff(report: DiffReport, out: str, *, title: str) -> None:
    """Write the picture of `report` to `out`: ``.png``/``.svg`` through matplotlib, ``.html`` self-contained."""
    if os.path.splitext(out)[1].lower() == ".html":
        render_html(report, out, title=title)
    else:
        render_image(report, out, title=title)
