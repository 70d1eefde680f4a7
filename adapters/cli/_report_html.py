"""The report's page: inline SVG charts, and a table, samples and search drawn by a few lines of script
from the data embedded in the page. Every journal text reaches the page as JSON and is shown with
``textContent``: nothing of it is ever parsed as HTML."""

from __future__ import annotations

import html
import json
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from stepjournal.vocabulary import ACTION_COLOURS

__all__ = ["render"]

_W, _H, _PAD = 1000, 150, 44  # chart width, height, left margin (px)
_ACTION_COLOURS = {str(action): colour for action, colour in ACTION_COLOURS.items()}
_STAGE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _scale(values: Sequence[Optional[float]]) -> Tuple[float, float]:
    finite = [v for v in values if v is not None]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    if low != high:
        return low, high
    # One value: a band around it that float can tell from it (± 0.5 is lost beside 1e20: TRL's total_flos).
    pad = max(0.5, abs(low) * 1e-9)
    if math.isinf(high + pad):  # beside float's largest: the band lies below it
        return low - 2 * pad, high
    if math.isinf(low - pad):
        return low, high + 2 * pad
    return low - pad, high + pad


def _xy(i: int, n: int, value: float, low: float, high: float) -> str:
    x = _PAD + (i + 0.5) * (_W - _PAD - 8) / max(n, 1)
    if math.isinf(high - low):  # a span past float's range (-1e308 to 1e308): halved, as "nan" is no coordinate
        low, high, value = low / 2, high / 2, value / 2
    y = 8 + (1 - (value - low) / (high - low)) * (_H - 30)
    return f"{x:.1f},{y:.1f}"


def _frame(title: str, steps: List[int], low: float, high: float, body: str) -> str:
    first, last = (steps[0], steps[-1]) if steps else (0, 0)
    return (f'<figure><figcaption>{html.escape(title)}</figcaption><svg viewBox="0 0 {_W} {_H}" width="100%" '
            f'role="img" aria-label="{html.escape(title)}">'
            f'<line x1="{_PAD}" y1="{_H - 22}" x2="{_W - 8}" y2="{_H - 22}" stroke="#999"/>'
            f'<text x="{_PAD - 4}" y="14" text-anchor="end" class="tick">{high:.3g}</text>'
            f'<text x="{_PAD - 4}" y="{_H - 22}" text-anchor="end" class="tick">{low:.3g}</text>'
            f'<text x="{_PAD}" y="{_H - 6}" class="tick">step {first}</text>'
            f'<text x="{_W - 8}" y="{_H - 6}" text-anchor="end" class="tick">step {last}</text>'
            f"{body}</svg></figure>")


def _line(values: Sequence[Optional[float]], low: float, high: float, colour: str) -> str:
    runs: List[List[str]] = []
    current: List[str] = []  # a gap where a step has no value
    for i, v in enumerate(values):
        if v is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(_xy(i, len(values), v, low, high))
    if current:
        runs.append(current)
    # A value with none beside it (a metric logged every few steps) is a dot: a one-point line draws nothing.
    return "".join(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(r)}"/>'
                   if len(r) > 1 else _dot(r[0], colour) for r in runs)


def _dot(point: str, colour: str) -> str:
    x, y = point.split(",")
    return f'<circle cx="{x}" cy="{y}" r="2.5" fill="{colour}"/>'


def _reward_chart(steps: List[Dict[str, Any]]) -> str:
    means = [s["mean"] for s in steps]
    upper = [None if s["mean"] is None else s["mean"] + s["std"] for s in steps]
    lower = [None if s["mean"] is None else s["mean"] - s["std"] for s in steps]
    low, high = _scale([*upper, *lower])
    n = len(steps)
    band = [(i, u, lo) for i, (u, lo) in enumerate(zip(upper, lower)) if u is not None]
    body = ""
    if band:
        points = ([_xy(i, n, u, low, high) for i, u, _ in band]
                  + [_xy(i, n, lo, low, high) for i, _, lo in reversed(band)])
        body += f'<polygon class="band" fill="#1f77b4" fill-opacity="0.18" points="{" ".join(points)}"/>'
    body += _line(means, low, high, "#1f77b4")
    return _frame("reward: mean of each step's samples, and its spread (± one standard deviation)",
                  [s["step"] for s in steps], low, high, body)


def _length_chart(steps: List[Dict[str, Any]]) -> str:
    values = [s["length"] for s in steps]
    low, high = _scale(values)
    return _frame("response length: mean tokens of each step's samples", [s["step"] for s in steps], low, high,
                  _line(values, low, high, "#ff7f0e"))


def _action_chart(steps: List[Dict[str, Any]]) -> str:
    n = len(steps)
    width = (_W - _PAD - 8) / max(n, 1)
    bars = []
    for i, s in enumerate(steps):
        kind = "released" if s["released"] else (s["action"] or "bypassed")
        x = _PAD + i * width
        bars.append(f'<rect x="{x:.2f}" y="20" width="{max(width, 0.6):.2f}" height="90" '
                    f'fill="{_ACTION_COLOURS.get(kind, "#aaaaaa")}"/>')
    legend = "".join(f'<tspan fill="{c}">■</tspan> {k}  ' for k, c in _ACTION_COLOURS.items())
    body = "".join(bars) + f'<text x="{_PAD}" y="14" class="tick">{legend}</text>'
    return _frame("each step's generate call: generated, replayed, released", [s["step"] for s in steps], 0, 1, body)


def _duration_chart(steps: List[Dict[str, Any]], stages: List[str]) -> str:
    per_stage = {st: [s["durations"].get(st) for s in steps] for st in stages}
    low, high = _scale([v for values in per_stage.values() for v in values])
    body, legend = "", []
    for k, stage in enumerate(stages):
        colour = _STAGE_COLOURS[k % len(_STAGE_COLOURS)]
        body += _line(per_stage[stage], low, high, colour)
        legend.append(f'<tspan fill="{colour}">■</tspan> {html.escape(stage)}')
    body += f'<text x="{_PAD + 6}" y="14" class="tick">{"  ".join(legend)}</text>'
    return _frame("stage durations (seconds per step)", [s["step"] for s in steps], low, high, body)


def _tool_chart(steps: List[Dict[str, Any]]) -> str:
    """A step's tool calls (when any step made some): calls, replays and misses, one line each."""
    lines = (("calls", "#555555"), ("replayed", "#1f77b4"), ("misses", "#d62728"))
    per_kind = {kind: [None if s["tools"] is None else float(s["tools"][kind]) for s in steps] for kind, _ in lines}
    low, high = _scale([v for values in per_kind.values() for v in values])
    body = "".join(_line(per_kind[kind], low, high, colour) for kind, colour in lines)
    legend = "  ".join(f'<tspan fill="{colour}">■</tspan> {kind}' for kind, colour in lines)
    body += f'<text x="{_PAD + 6}" y="14" class="tick">{legend}</text>'
    return _frame("tool calls per step: calls, replayed, misses", [s["step"] for s in steps], low, high, body)


def _metric_charts(steps: List[Dict[str, Any]], names: List[str]) -> str:
    """One chart per name the ``metrics`` stage logged (TRL's loss, reward, kl ...), over every step."""
    charts = []
    for k, name in enumerate(names):
        values = [s["metrics"].get(name) for s in steps]
        low, high = _scale(values)
        charts.append(_frame(name, [s["step"] for s in steps], low, high,
                             _line(values, low, high, _STAGE_COLOURS[k % len(_STAGE_COLOURS)])))
    return "".join(charts)


_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.2em;color:#222;max-width:1100px}
figure{margin:0 0 1em} figcaption{font-weight:600;margin-bottom:.2em} .tick{font-size:11px;fill:#555}
table{border-collapse:collapse;width:100%} td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
tr.step{cursor:pointer} tr.step:hover{background:#f3f6fb} .replayed{color:#1f77b4} .released{color:#9467bd}
#samples pre{white-space:pre-wrap;background:#f7f7f7;padding:6px;margin:2px 0 10px}
#samples pre.prompt::before{content:"prompt  ";color:#888}
#samples pre.response::before{content:"response  ";color:#888}
#metrics h2{margin:.3em 0}
#pager button{margin-right:4px} #search{width:50%;padding:4px} .hit{cursor:pointer;color:#1f5fbf}
"""

_SCRIPT = """
const data = JSON.parse(document.getElementById('data').textContent);
const PAGE = 100; let page = 0;
const el = (tag, text, cls) => {
  const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls;
  return e;
};
const call = s => s.action === 'replayed' ? `replayed from step ${s.source_step}` : (s.action || '-');
const later = s => s.others.length
  ? ` (${s.session}) · ` + s.others.map(o => `${o.session}: ${call(o)}`).join(' · ') : '';
const served = s => (s.released ? 'released' : call(s)) + later(s);
const num = v => v === null || v === undefined ? '-' : Number(v).toFixed(3);
const tools = t => t === null ? '-' : `${t.calls} (${t.replayed} replayed, ${t.misses} misses)`;
function drawTable() {
  const body = document.querySelector('#steps tbody'); body.replaceChildren();
  for (const s of data.steps.slice(page * PAGE, (page + 1) * PAGE)) {
    const tr = el('tr', undefined, 'step'); tr.dataset.step = s.step;
    tr.append(el('td', String(s.step)), el('td', served(s), s.released ? 'released' : s.action),
              el('td', num(s.mean)), el('td', num(s.std)), el('td', num(s.length)), el('td', String(s.count)));
    if (data.tools) tr.append(el('td', tools(s.tools), 'tools'));
    tr.addEventListener('click', () => showStep(s.step)); body.append(tr);
  }
  document.getElementById('where').textContent =
    `steps ${page * PAGE + 1}-${Math.min((page + 1) * PAGE, data.steps.length)} of ${data.steps.length}`;
}
function showStep(step) {
  const s = data.steps.find(x => x.step === step);
  const box = document.getElementById('samples'); box.replaceChildren();
  box.append(el('h3', `step ${s.step}: ${served(s)} · ${s.count} samples (${s.samples.length} shown)`));
  const logged = Object.entries(s.metrics).map(([k, v]) => `${k} ${v === null ? '-' : Number(v.toPrecision(4))}`);
  if (logged.length) box.append(el('p', 'metrics: ' + logged.join(' · '), 'metrics'));
  if (s.tools) box.append(el('p', `tool calls: ${s.tools.calls} · replayed ${s.tools.replayed}` +
    ` · misses ${s.tools.misses} (refused ${s.tools.refused})` +
    ` · tool time ${num(s.tools.tool_s)} s · saved ${num(s.tools.saved_s)} s`, 'tools'));
  for (const x of s.samples) {
    const rewards = Object.entries(x.rewards).map(([k, v]) => `${k} ${v}`).join(' · ');
    const head = el('div', `sample ${x.index} · ${x.length} tokens${x.truncated ? ' (truncated)' : ''}` +
      `${rewards ? ' · ' + rewards : ''}`);
    head.className = 'sample'; head.dataset.sample = x.index;
    box.append(head, el('pre', x.prompt === null ? '(no tokenizer)' : x.prompt, 'prompt'),
               el('pre', x.response === null ? '(no tokenizer)' : x.response, 'response'));
  }
  box.scrollIntoView();
}
function search(query) {
  const out = document.getElementById('hits'); out.replaceChildren(); const q = query.toLowerCase();
  if (q.length < 2) return; let n = 0;
  for (const s of data.steps) for (const x of s.samples) {
    if (((x.prompt || '') + '\\n' + (x.response || '')).toLowerCase().includes(q) && n < 200) {
      const hit = el('div', `step ${s.step} · sample ${x.index}: ${(x.response || '').slice(0, 120)}`, 'hit');
      hit.addEventListener('click', () => showStep(s.step)); out.append(hit); n++;
    }
  }
  out.prepend(el('div', n ? `${n} matching samples${n === 200 ? ' (first 200)' : ''}` : 'no sample matches'));
}
document.getElementById('prev').addEventListener('click', () => { if (page > 0) { page--; drawTable(); } });
document.getElementById('next').addEventListener('click', () => {
  if ((page + 1) * PAGE < data.steps.length) { page++; drawTable(); }
});
document.getElementById('search').addEventListener('input', e => search(e.target.value));
drawTable();
"""


def render(data: Dict[str, Any], *, title: str) -> str:
    """The page for `collect`'s data."""
    steps = data["steps"]
    charts = _reward_chart(steps) + _length_chart(steps) + _action_chart(steps) + _duration_chart(steps, data["stages"])
    if data["tools"]:
        charts += _tool_chart(steps)
    # Every "<" as a JSON escape: no text of the journal can end the script element or open a comment.
    embedded = json.dumps(data, ensure_ascii=True, allow_nan=False).replace("<", "\\u003c")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(steps)} train steps; up to {data['per_step']} samples a step, text cut at {data['chars']} characters."
        " Click a step to read its samples.</p>",
        f'<section id="charts">{charts}</section>',
        (f'<section id="metrics"><h2>metrics</h2>{_metric_charts(steps, data["metrics"])}</section>'
         if data["metrics"] else ""),
        '<p><input id="search" type="search" placeholder="search prompts and responses"></p><div id="hits"></div>',
        '<div id="pager"><button id="prev">previous</button><button id="next">next</button> '
        '<span id="where"></span></div>',
        '<table id="steps"><thead><tr><th>step</th><th>generate</th><th>reward mean</th><th>spread</th>'
        f"<th>response length</th><th>samples</th>{'<th>tool calls</th>' if data['tools'] else ''}</tr></thead>"
        "<tbody></tbody></table>",
        '<section id="samples"></section>',
        f'<script type="application/json" id="data">{embedded}</script>',
        f"<script>{_SCRIPT}</script>", "</body></html>",
    ])
