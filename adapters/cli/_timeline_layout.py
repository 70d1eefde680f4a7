"""The layout of ``stepjournal timeline``: audit records placed on (column, lane), merged into segments.

Nothing here draws. `build_timeline` numbers the sessions over every record it is given (the whole
journal), then applies the ``--run`` / ``--steps`` / ``--mode`` filter, so a session keeps its number
in a filtered view; it merges consecutive calls of one lane with the same kind and policy clause into
one `Segment`, and keeps per-call links only where few enough to draw as arrows.
"""

from __future__ import annotations

from typing import Container, Dict, List, Optional, Sequence, Tuple

import attrs

from stepjournal import AuditRecord
from stepjournal.policies import StepRanges

__all__ = [
    "COLOURS",
    "MAX_ARROWS",
    "Band",
    "Cell",
    "HiddenSource",
    "Link",
    "Segment",
    "Timeline",
    "build_timeline",
    "kind_of",
]

# One colour per kind of call. A replay of the same step (a resumed run, `replay`) and a replay of
# another step (`repeat`, `nearest`) differ in colour; a generated call that stored no output is paler.
COLOURS: Dict[str, str] = {
    "generated": "#2ca02c",
    "generated (not stored)": "#a6dba0",
    "replayed (same step)": "#1f77b4",
    "replayed (other step)": "#ff7f0e",
    "bypassed": "#9e9e9e",
    "refused": "#d62728",
    "generated (released)": "#c5b0d5",
}
# Arrows are drawn only when a view holds at most this many replay links; beyond, they smear.
MAX_ARROWS = 40


def kind_of(record: AuditRecord) -> str:
    """The colour key of a call: its action, with generated split by stored and replayed by source."""
    if record.action == "generated":
        if record.released_by is not None:
            return "generated (released)"  # retention released its payloads (stepjournal prune)
        return "generated" if record.stored else "generated (not stored)"
    if record.action == "replayed":
        same = record.source_step == record.step and record.source_run in (None, record.run)
        return "replayed (same step)" if same else "replayed (other step)"
    return record.action


@attrs.frozen
class Cell:
    """One generate call, placed at (column, lane)."""

    column: int
    lane: int
    record: AuditRecord

    @property
    def colour_key(self) -> str:
        return kind_of(self.record)

    def describe(self) -> str:
        r = self.record
        text = f"step {r.step} #{r.gen_index} ({r.mode}, run {r.run}): {r.action}"
        if r.action == "replayed":
            text += f" from step {r.source_step} #{r.source_gen_index}"
        return f"{text}; policy {r.policy}: {r.reason} (event #{r.seq})"


@attrs.frozen
class Segment:
    """Consecutive columns of one lane whose calls share a kind and a policy clause: one bar."""

    lane: int
    start: int
    end: int  # inclusive
    kind: str
    policy: str
    first: AuditRecord
    last: AuditRecord

    @property
    def count(self) -> int:
        return self.end - self.start + 1

    def describe(self) -> str:
        a, b = self.first, self.last
        steps = f"step {a.step}" if a.step == b.step else f"steps {a.step}-{b.step}"
        text = f"{steps} #{a.gen_index} ({a.mode}, run {a.run}): {self.count} {self.kind}"
        if a.action == "replayed":
            sources = f"{a.source_step}" if self.count == 1 else f"{a.source_step} ... {b.source_step}"
            text += f" from step {sources}"
        return f"{text}; policy {self.policy}: {a.reason}"


@attrs.frozen
class Band:
    """Consecutive calls of one lane decided by one policy clause (``dump@1-5``, ``repeat`` ...).

    Unlike a segment, a band spans columns where the lane has no call.
    """

    lane: int
    start: int
    end: int  # inclusive
    policy: str


@attrs.frozen
class Link:
    """A replay (`to`) and the recorded call it was served from (`source`), both in the view."""

    source: Cell
    to: Cell


@attrs.frozen
class HiddenSource:
    """Replays in the view served from calls the filter left out: which steps of which session."""

    session: int
    run: str
    steps: str  # step-range text, ``1-5``
    replays: int

    def describe(self) -> str:
        return f"{self.replays} replays served from s{self.session} run {self.run} steps {self.steps} (not shown)"


@attrs.frozen
class Timeline:
    """What to draw: the step of each column, the lane labels, cells, segments, bands and links.

    `links` holds every replay link in the view; `arrows` says whether they are few enough to draw.
    """

    title: str
    steps: Tuple[int, ...]
    lanes: Tuple[str, ...]
    cells: Tuple[Cell, ...]
    segments: Tuple[Segment, ...]
    bands: Tuple[Band, ...]
    links: Tuple[Link, ...]
    hidden: Tuple[HiddenSource, ...]

    @property
    def arrows(self) -> bool:
        return 0 < len(self.links) <= MAX_ARROWS


def _lane_key(session_no: Dict[str, int], r: AuditRecord) -> Tuple[int, str, bool, str, bool, str, int]:
    # One lane per stage too: a step's reward is drawn under its generate call, never over it.
    return (session_no[r.session], r.run, r.mode != "train", r.mode, r.stage != "generate", r.stage, r.gen_index)


def _merge(cells: Sequence[Cell]) -> Tuple[List[Segment], List[Band]]:
    """Segments and bands of cells sorted by (lane, column), in one pass (no object per merged call)."""
    segments: List[Segment] = []
    bands: List[Band] = []
    seg: Optional[list] = None  # [lane, start, end, kind, policy, first, last] of the open segment
    band: Optional[list] = None  # [lane, start, end, policy]
    for c in cells:
        r = c.record
        kind, policy, lane, column = kind_of(r), r.policy, c.lane, c.column
        if seg is not None and seg[0] == lane and seg[2] + 1 == column and seg[3] == kind and seg[4] == policy:
            seg[2], seg[6] = column, r
        else:
            if seg is not None:
                segments.append(Segment(*seg))
            seg = [lane, column, column, kind, policy, r, r]
        # A band spans a lane's gaps: a validation lane called every tenth step is one "bypass" band.
        if band is not None and band[0] == lane and band[3] == policy:
            band[2] = column
        else:
            if band is not None:
                bands.append(Band(*band))
            band = [lane, column, column, policy]
    if seg is not None:
        segments.append(Segment(*seg))
        bands.append(Band(*band))
    return segments, bands


def build_timeline(
    records: Sequence[AuditRecord],
    *,
    title: str,
    run: Optional[str] = None,
    steps: Optional[Container[int]] = None,
    mode: Optional[str] = None,
) -> Timeline:
    """Lay out audit records: columns are the distinct steps shown, in order; a lane is (session, mode, stage, index).

    Sessions are numbered s1, s2 ... in order of their first call among all `records` (pass the whole
    journal), before the `run` / `steps` / `mode` filter picks what is shown, so a session's number
    does not change with the filter. When one lane holds several calls of the same step, the latest
    one is drawn.
    """
    session_no: Dict[str, int] = {}
    for r in records:
        if r.session not in session_no:
            session_no[r.session] = len(session_no) + 1
    shown = [
        r for r in records
        if (run is None or r.run == run) and (steps is None or r.step in steps) and (mode is None or r.mode == mode)
    ]
    step_list = sorted({r.step for r in shown})
    column_of = {step: i for i, step in enumerate(step_list)}
    lane_keys = sorted({_lane_key(session_no, r) for r in shown})
    several_runs = len({r.run for r in shown}) > 1
    lane_of = {key: i for i, key in enumerate(lane_keys)}
    labels = tuple(
        f"s{s} {run_ + ' ' if several_runs else ''}{mode_} {stage + ' ' if stage != 'generate' else ''}#{index}"
        for s, run_, _, mode_, _, stage, index in lane_keys
    )
    latest: Dict[Tuple[int, int], AuditRecord] = {}
    for r in shown:
        latest[(lane_of[_lane_key(session_no, r)], column_of[r.step])] = r
    cells = [Cell(column, lane, latest[(lane, column)]) for lane, column in sorted(latest)]
    segments, bands = _merge(cells)
    by_seq = {c.record.seq: c for c in cells}
    links = []
    hidden_steps: Dict[Tuple[int, str], List[int]] = {}
    hidden_count: Dict[Tuple[int, str], int] = {}
    source_of = None
    for c in cells:
        r = c.record
        if r.action != "replayed":
            continue
        if r.source_seq in by_seq:
            links.append(Link(by_seq[r.source_seq], c))
            continue
        if source_of is None:
            source_of = {x.seq: x for x in records}
        source = source_of.get(r.source_seq)
        key = (session_no[source.session], source.run) if source is not None else (0, r.source_run or r.run)
        hidden_steps.setdefault(key, []).append(r.source_step)
        hidden_count[key] = hidden_count.get(key, 0) + 1
    hidden = tuple(
        HiddenSource(session, run_, str(StepRanges.from_steps(sorted(set(hidden_steps[(session, run_)])))),
                     hidden_count[(session, run_)])
        for session, run_ in sorted(hidden_steps)
    )
    links.sort(key=lambda link: (link.to.column, link.to.lane))
    return Timeline(title=title, steps=tuple(step_list), lanes=labels, cells=tuple(cells),
                    segments=tuple(segments), bands=tuple(bands), links=tuple(links), hidden=hidden)
