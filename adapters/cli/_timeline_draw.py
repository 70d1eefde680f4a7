"""Drawing a `Timeline`: a PNG or SVG through matplotlib, or one self-contained HTML page.

Both draw merged segments (one bar per run of like calls), a labelled band per policy clause above
each lane's bars, and arrows only when a view has few replay links. The matplotlib figure adds a
"source step vs step" panel (a diagonal for exact replays, a sawtooth for ``repeat``). Figure sizes
are bounded whatever the number of steps, and every many-element layer is one collection.
"""

from __future__ import annotations

import html
import math
import os
from typing import Any, Dict, List, Sequence, Tuple, Union, cast

from ._render import clean
from ._timeline_layout import COLOURS, MAX_ARROWS, Band, Segment, Timeline

__all__ = ["LINK_COLOUR", "render", "render_html", "render_image"]

LINK_COLOUR = "#08306b"
_BAND_TINTS = ("#e8e8f4", "#f4ece0")  # neighbouring bands of one lane alternate
_MAX_TICKS = 12
_MAX_WIDTH_IN, _MAX_HEIGHT_IN = 16.0, 12.0
_RASTER_ABOVE = 2000  # layers with more elements are rasterised in an SVG, so its size stays bounded


def _markup(text: str) -> str:
    """Journal text (a run key, a session name, a policy, a reason) as SVG or HTML text: control characters
    as visible escapes (XML 1.0 holds none of them), then escaped."""
    return html.escape(clean(text))


def _tick_columns(n: int) -> List[int]:
    every = max(1, math.ceil(n / _MAX_TICKS))
    return list(range(0, n, every))


def _summary(timeline: Timeline) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in timeline.kind_counts().items())


def figure_size(ncols: int, nlanes: int) -> Tuple[float, float]:
    """The figure size in inches: grows with the steps and lanes up to a cap."""
    width = min(max(7.0, 3.0 + 0.32 * ncols), _MAX_WIDTH_IN)
    height = min(max(3.6, 2.8 + 0.42 * nlanes), _MAX_HEIGHT_IN)
    return width, height


def _band_labels(timeline: Timeline, axis_px: float = 1200.0) -> List[Tuple[float, int, str, str]]:
    """Where to write band labels: (x in columns, lane, text, alignment), none overlapping in a lane.

    Widest bands are labelled first, a wide band at its centre and a narrow one at its start; a label
    that would overlap one already placed in its lane is left out (the HTML tooltip still names it).
    """
    columns_per_px = max(len(timeline.steps), 1) / axis_px
    placed: Dict[int, List[Tuple[float, float]]] = {}
    labels = []
    for b in sorted(timeline.bands, key=lambda b: b.start - b.end):
        extent = (len(b.policy) * 5.0 + 6) * columns_per_px
        centre = b.end - b.start + 1 > 2 * extent
        x0 = (b.start + b.end) / 2 - extent / 2 if centre else b.start - 0.4
        if any(x0 < hi and lo < x0 + extent for lo, hi in placed.get(b.lane, ())):
            continue
        placed.setdefault(b.lane, []).append((x0, x0 + extent))
        labels.append((x0 + extent / 2, b.lane, b.policy, "center") if centre else (x0, b.lane, b.policy, "left"))
        if len(labels) == 60:
            break
    return labels


def render_image(timeline: Timeline, out: str) -> Any:
    """Draw the timeline to a PNG or SVG file (the format follows the extension) with matplotlib.

    Returns: the matplotlib `Figure` drawn.

    Raises:
        ImportError: matplotlib is not installed; the message names the extra to install.
    """
    try:
        import numpy as np
        from matplotlib.collections import PolyCollection
        from matplotlib.figure import Figure
        from matplotlib.patches import FancyArrowPatch, Patch
    except ImportError:
        raise ImportError(
            "drawing PNG or SVG needs matplotlib: pip install 'matplotlib>=3.7' (or write --out FILE.html)"
        ) from None

    ncols, nlanes = len(timeline.steps), len(timeline.lanes)
    fig = Figure(figsize=figure_size(ncols, nlanes), dpi=100)
    lanes_share = max(1.0, 0.5 * nlanes)
    ax, panel = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [lanes_share, 1.6]})

    min_half = 1.25 * max(ncols, 1) / (fig.get_figwidth() * fig.dpi * 0.8)

    def boxes(items: Sequence[Union[Segment, Band]], top: float, bottom: float) -> Sequence[np.ndarray]:
        spans = np.array([(i.start, i.end, i.lane) for i in items], dtype=float).reshape(-1, 3)
        # A bar is at least ~2.5 px wide, so a single call among 100 000 steps stays visible.
        half = np.maximum((spans[:, 1] - spans[:, 0] + 0.9) / 2, min_half)
        middle, y = (spans[:, 0] + spans[:, 1]) / 2, spans[:, 2]
        x0, x1 = middle - half, middle + half
        corners = np.stack([np.stack([x0, y + top]), np.stack([x1, y + top]), np.stack([x1, y + bottom]),
                            np.stack([x0, y + bottom])]).transpose(2, 0, 1)
        # One 3-D array, which PolyCollection takes whole (its fast path for many boxes); matplotlib's stubs
        # name only a sequence of (4, 2) arrays, which is what the array is row by row.
        return cast("Sequence[np.ndarray]", corners)

    # Narrow bars are drawn last: widened to stay visible, they must not vanish under a wide neighbour.
    segments = sorted(timeline.segments, key=lambda s: s.start - s.end)
    bands = timeline.bands
    tint_of: List[str] = []
    parity: Dict[int, int] = {}
    for b in bands:
        parity[b.lane] = 1 - parity.get(b.lane, 1)
        tint_of.append(_BAND_TINTS[parity[b.lane]])
    band_layer = PolyCollection(boxes(bands, -0.46, -0.26), facecolors=tint_of, edgecolors="none")
    bar_layer = PolyCollection(boxes(segments, -0.22, 0.38), facecolors=[COLOURS[s.kind] for s in segments],
                               edgecolors="white" if len(segments) <= 200 else "none", linewidths=0.6)
    for layer, n in ((band_layer, len(bands)), (bar_layer, len(segments))):
        layer.set_rasterized(n > _RASTER_ABOVE)
        ax.add_collection(layer)
    for x, lane, text, align in _band_labels(timeline):
        ax.text(x, lane - 0.36, clean(text), fontsize=7, va="center", ha=align, color="#333", clip_on=True)
    if timeline.arrows:
        for link in timeline.links:
            source, to = link.source, link.to
            bend = 0.3 if to.column != source.column else 0.12  # a same-step replay: nearly straight
            ax.add_patch(FancyArrowPatch((source.column, source.lane + 0.08), (to.column, to.lane + 0.08),
                                         connectionstyle=f"arc3,rad={bend}", arrowstyle="-|>", mutation_scale=9,
                                         color=LINK_COLOUR, linewidth=1.0, alpha=0.75, shrinkA=5, shrinkB=4,
                                         zorder=3))
    ax.set_xlim(-0.7, ncols - 0.3)
    ax.set_ylim(nlanes - 0.5, -0.6)
    ax.set_yticks(range(nlanes), [clean(label) for label in timeline.lanes])
    ax.tick_params(length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)

    # Source step vs step: what data each call trained on (generated: its own step; replayed: its source).
    xs, ys, served_kinds = timeline.served()
    xy = np.array([xs, ys], dtype=float).T.reshape(-1, 2)
    of_kind = np.array(served_kinds, dtype=object)
    for kind in sorted(COLOURS, key=lambda k: k.startswith("generated")):  # recorded data on top
        points = xy[of_kind == kind] if len(xy) else xy
        if len(points):
            dots = panel.scatter(points[:, 0], points[:, 1], s=4 if len(points) > 300 else 10, marker="s",
                                 color=COLOURS[kind], linewidths=0)
            dots.set_rasterized(len(points) > _RASTER_ABOVE)
    if ys and max(ys) > 50 * max(1, min(ys)):
        panel.set_yscale("log")  # a sawtooth over steps 1-5 stays visible beside data of step 20 000
    panel.set_ylabel("data of step", fontsize=8)
    panel.set_xlabel("step")
    panel.tick_params(labelsize=8)
    for side in ("top", "right"):
        panel.spines[side].set_visible(False)
    ticks = _tick_columns(ncols)
    panel.set_xticks(ticks, [str(timeline.steps[i]) for i in ticks])

    present = {s.kind for s in segments}
    handles = [Patch(facecolor=colour, label=name) for name, colour in COLOURS.items() if name in present]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    note = _summary(timeline)
    if timeline.link_pairs and not timeline.arrows:
        note += f"; {len(timeline.link_pairs)} replay links (arrows drawn up to {MAX_ARROWS})"
    if timeline.hidden:
        note += "\n" + "; ".join(clean(h.describe()) for h in timeline.hidden[:3])
    ax.set_title(f"{clean(timeline.title)}\n{note}", fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(out, format=os.path.splitext(out)[1][1:].lower())
    return fig


def _toward(x: float, y: float, tx: float, ty: float, distance: float) -> Tuple[float, float]:
    """The point `distance` away from (x, y) in the direction of (tx, ty)."""
    length = math.hypot(tx - x, ty - y) or 1.0
    return x + (tx - x) / length * distance, y + (ty - y) / length * distance


def render_html(timeline: Timeline, out: str) -> None:
    """Write the timeline as one self-contained HTML file (inline SVG, a tooltip on every segment)."""
    size, gap, plot_width = 18, 8, 1400
    left, top, bottom = 170, 14, 40
    ncols, nlanes = len(timeline.steps), len(timeline.lanes)
    pitch = min(22.0, plot_width / max(ncols, 1))  # bounded width: the columns narrow as steps grow
    width = int(left + ncols * pitch + 20)
    height = top + nlanes * (size + gap) + bottom

    def cx(column: float) -> float:
        return left + column * pitch + pitch / 2

    def cy(lane: int) -> float:
        return top + lane * (size + gap) + gap + size / 2

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
    ]
    for lane, label in enumerate(timeline.lanes):
        parts.append(f'<text x="{left - 8}" y="{cy(lane) + 4}" text-anchor="end">{_markup(label)}</text>')
    for column in _tick_columns(ncols):
        parts.append(f'<text x="{cx(column):.1f}" y="{height - bottom + 16}" text-anchor="middle">'
                     f"{timeline.steps[column]}</text>")
    parts.append(f'<text x="{left}" y="{height - 6}">step</text>')
    inset = min(2.0, pitch * 0.1)
    for b in timeline.bands:
        x0 = cx(b.start) - pitch / 2 + inset
        w = (b.end - b.start + 1) * pitch - 2 * inset
        parts.append(f'<rect class="band" x="{x0:.1f}" y="{cy(b.lane) - size / 2 - gap:.1f}" width="{w:.1f}" '
                     f'height="{gap - 1}" fill="{_BAND_TINTS[0]}"><title>{_markup(b.policy)}</title></rect>')
        if w >= 7 * len(b.policy):
            parts.append(f'<text x="{x0 + 2:.1f}" y="{cy(b.lane) - size / 2 - 1.5:.1f}" font-size="8">'
                         f"{_markup(b.policy)}</text>")
    for s in timeline.segments:
        x0 = cx(s.start) - pitch / 2 + inset
        w = (s.end - s.start + 1) * pitch - 2 * inset
        parts.append(
            f'<rect class="{s.first.action}" data-kind="{s.kind}" x="{x0:.1f}" y="{cy(s.lane) - size / 2}" '
            f'width="{w:.1f}" height="{size}" rx="2" fill="{COLOURS[s.kind]}">'
            f"<title>{_markup(s.describe())}</title></rect>"
        )
    for link in timeline.links if timeline.arrows else ():
        source, to = link.source, link.to
        x0, y0, x1, y1 = cx(source.column), cy(source.lane), cx(to.column), cy(to.lane)
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
        head = [(x1, y1), (x1 - 7 * ux - 3.5 * uy, y1 - 7 * uy + 3.5 * ux),
                (x1 - 7 * ux + 3.5 * uy, y1 - 7 * uy - 3.5 * ux)]
        parts.append(
            f'<g class="link" fill="none" stroke="{LINK_COLOUR}" stroke-opacity="0.75" stroke-width="1.2">'
            f"<title>{_markup(to.describe())}</title>"
            f'<path d="M{x0:.1f},{y0:.1f} Q{qx:.1f},{qy:.1f} {x1 - 5 * ux:.1f},{y1 - 5 * uy:.1f}"/>'
            f'<polygon points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in head)}" fill="{LINK_COLOUR}" stroke="none"/>'
            "</g>"
        )
    parts.append("</svg>")
    present = {s.kind for s in timeline.segments}
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{colour}"></span>{_markup(name)}</span>'
        for name, colour in COLOURS.items()
        if name in present
    )
    notes = "".join(f"<li>{_markup(h.describe())}</li>" for h in timeline.hidden)
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{_markup(timeline.title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
.key {{ margin-right: 1.2em; white-space: nowrap; }}
.swatch {{ display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.35em; vertical-align: -0.1em;
           border-radius: 2px; }}
.scroll {{ overflow-x: auto; margin-top: 1em; }}
</style>
</head>
<body>
<h1 style="font-size:1.2em">{_markup(timeline.title)}</h1>
<p>{legend}</p>
<p>{_markup(_summary(timeline))}. Lanes are sessions (s1, s2 … numbered over the whole journal) × mode ×
call index; a bar is a run of consecutive calls of one kind and policy clause, under a band naming the clause.
Arrows run from the recorded call to each replay served from it when there are at most 40.
Hover over a bar for its steps, policy and reason.</p>
<ul>{notes}</ul>
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
