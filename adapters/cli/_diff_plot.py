"""The picture of a diff: one column per step, one row per stage, each pair coloured by its state.

`render_diff` writes ``.png`` (or ``.svg``) through matplotlib (the `timeline` extra) or a
self-contained ``.html`` page (a grid table, a tooltip on every cell, no extra). Where a pair differs
its largest absolute error is written into the cell. Past `MAX_COLUMNS` steps, consecutive steps
share a column (a bin) coloured by its worst pair, so that 10 000 steps stay a readable picture.
"""

from __future__ import annotations

import html
import os
from typing import Dict, List, Optional, Tuple

from stepjournal.tools import DiffReport, PairDiff
from stepjournal.vocabulary import DEFAULT_MODE

__all__ = ["MAX_COLUMNS", "STATE_COLOURS", "render_diff"]

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
MAX_COLUMNS = 200  # past this many steps, consecutive steps share a column
_FONT = 8.0  # the smallest text drawn, in points
_MAX_WIDTH_IN = 16.0  # inches at 100 dpi: a picture that opens on a laptop screen


def _grid(report: DiffReport) -> Tuple[List[str], List[str], Dict[Tuple[int, str], PairDiff], bool]:
    """Columns (a step, or a bin of consecutive steps: ``"1-50"``), rows (stage, plus mode and call
    index when not train #0), the worst pair per cell (keyed by column index) and whether steps were binned."""
    steps = sorted({p.step for p in report.pairs})
    stride = max(1, -(-len(steps) // MAX_COLUMNS))
    bins = [steps[i:i + stride] for i in range(0, len(steps), stride)]
    column_of = {step: i for i, group in enumerate(bins) for step in group}
    labels = [str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}" for g in bins]
    rows: Dict[str, Tuple] = {}
    cells: Dict[Tuple[int, str], PairDiff] = {}
    for p in report.pairs:
        row = p.stage + ("" if p.mode == DEFAULT_MODE else f" ({p.mode})") + (f" #{p.gen_index}" if p.gen_index else "")
        rows.setdefault(row, (report.stage_rank(p.stage), p.mode != DEFAULT_MODE, p.mode, p.gen_index))
        key = (column_of[p.step], row)
        held = cells.get(key)
        if held is None or _SEVERITY.index(p.state) > _SEVERITY.index(held.state):
            cells[key] = p
    return labels, sorted(rows, key=rows.__getitem__), cells, stride > 1


def _error_text(pair: PairDiff) -> Optional[str]:
    if pair.state not in ("differing", "within_tolerance") or pair.max_abs is None:
        return None
    return f"{pair.max_abs:.1e}" if pair.max_abs != float("inf") else "inf"


def _ticks(n: int, most: int = _MAX_TICKS) -> List[int]:
    stride = max(1, -(-n // most))
    return list(range(0, n, stride))


def render_image(report: DiffReport, out: str, *, title: str) -> None:
    """Draw the diff with matplotlib (``.png`` or ``.svg``)."""
    try:
        from matplotlib.collections import PatchCollection
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError:
        raise ImportError(
            "drawing PNG or SVG needs matplotlib: pip install 'matplotlib>=3.7' (or write --plot FILE.html)"
        ) from None
    labels, rows, cells, binned = _grid(report)
    line = {r: i for i, r in enumerate(rows)}
    width = min(max(6.0, 3.0 + 0.65 * len(labels)), _MAX_WIDTH_IN)
    height = min(max(2.6, 1.9 + 0.42 * len(rows)), 30.0)
    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_subplot()
    rects, colours = [], []
    gap = 0.1 if len(labels) <= 60 else 0.0  # a gap under a pixel draws as stripes
    for (x, row), pair in cells.items():
        y = line[row]
        rects.append(Rectangle((x - 0.5 + gap / 2, y - 0.4), 1.0 - gap, 0.8))
        colours.append(STATE_COLOURS[pair.state])
        text = _error_text(pair) if len(labels) <= 20 and not binned else None  # 0.65 in holds 8 pt "1.0e-03"
        if text:
            ax.text(x, y, text, ha="center", va="center", fontsize=_FONT,
                    color="white" if pair.state == "differing" else "#222")
    ax.add_collection(PatchCollection(rects, facecolors=colours, edgecolors="none"))
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ticks = _ticks(len(labels), 12 if binned else _MAX_TICKS)
    ax.set_xticks(ticks, [labels[i] for i in ticks], fontsize=_FONT)
    ax.set_yticks(range(len(rows)), rows, fontsize=_FONT)
    ax.set_ylabel("stage", fontsize=_FONT + 1)
    what = (f"steps, {len(report.pairs)} pairs in {len(labels)} columns: each the worst state of its steps"
            if binned else "step (the number in a cell: its largest absolute error)")
    ax.set_xlabel(what, fontsize=_FONT + 1)
    ax.tick_params(length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    present = {p.state for p in cells.values()}
    handles = [Patch(facecolor=c, label=_LABELS[s]) for s, c in STATE_COLOURS.items() if s in present]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=_FONT)
    ax.set_title(title, fontsize=_FONT + 1, loc="left")
    fig.tight_layout()
    fig.savefig(out, format=os.path.splitext(out)[1][1:].lower())


def render_html(report: DiffReport, out: str, *, title: str) -> None:
    """Write the diff as one self-contained HTML page: a grid table with a tooltip on every cell."""
    labels, rows, cells, binned = _grid(report)
    esc = html.escape
    head = "".join(f"<th>{label}</th>" for label in labels)
    body = []
    for row in rows:
        tds = []
        for x, label in enumerate(labels):
            p = cells.get((x, row))
            if p is None:
                tds.append("<td></td>")
                continue
            text = "" if binned else (_error_text(p) or "")
            where = f"steps {label}, worst at step {p.step}" if binned else f"step {p.step}"
            tip = f"{where} {row}: {_LABELS[p.state]}; {p.brief()}"
            tds.append(f'<td class="{p.state}" style="background:{STATE_COLOURS[p.state]}" '
                       f'title="{esc(tip)}">{esc(text)}</td>')
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
        ("<p>One column per bin of consecutive steps, each coloured by its worst pair; one row per stage."
         if binned else
         "<p>One column per step, one row per stage; the number in a cell is its largest absolute error.")
        + " Hover over a cell for where it differs.</p>",
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
