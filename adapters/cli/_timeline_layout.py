"""The layout of ``stepjournal timeline``: audit records placed on (column, lane), merged into segments.

Nothing here draws. `build_timeline` numbers the sessions over every record it is given (the whole
journal), then applies the ``--run`` / ``--steps`` / ``--mode`` filter, so a session keeps its number
in a filtered view; it merges consecutive calls of one lane with the same kind and policy clause into
one `Segment`, and keeps per-call links only where few enough to draw as arrows.

The layout works on audit rows (`Row`: a dict of `AuditRecord`'s fields, as ``audit --json`` rows are)
and keeps its cells as columns (lane, column, kind and row per call): at 100 000 calls no object is
built per call. `Timeline.cells` and `Timeline.links` build their objects when asked for.
"""

from __future__ import annotations

import functools
from typing import Any, Container, Dict, List, Optional, Sequence, Tuple

import attrs

from stepjournal.index import AuditRecord, session_names
from stepjournal.policies import StepRanges
from stepjournal.vocabulary import ACTION_COLOURS, DEFAULT_MODE, DEFAULT_STAGE, Action

__all__ = [
    "COLOURS",
    "MAX_ARROWS",
    "Band",
    "Cell",
    "HiddenSource",
    "Link",
    "Segment",
    "Row",
    "Timeline",
    "build_timeline",
    "build_timeline_rows",
    "kind_of",
    "record_of",
]

# One colour per kind of call. A replay of the same step (a resumed run, `replay`) and a replay of
# another step (`repeat`, `nearest`) differ in colour; a generated call that stored no output is paler.
COLOURS: Dict[str, str] = {
    "generated": ACTION_COLOURS[Action.GENERATED],
    "generated (not stored)": "#a6dba0",
    "replayed (same step)": ACTION_COLOURS[Action.REPLAYED],
    "replayed (other step)": "#ff7f0e",
    "bypassed": ACTION_COLOURS[Action.BYPASSED],
    "refused": ACTION_COLOURS[Action.REFUSED],
    "generated (released)": "#c5b0d5",
}
# Arrows are drawn only when a view holds at most this many replay links; beyond, they smear.
MAX_ARROWS = 40
# An audit row: `AuditRecord`'s fields by name (extra keys, such as ``audit --json``'s ``time``, are ignored).
Row = Dict[str, Any]
_RECORD_FIELDS = tuple(f.name for f in attrs.fields(AuditRecord))


def kind_of(record: AuditRecord) -> str:
    """The colour key of a call: its action, with generated split by stored and replayed by source."""
    if record.action == Action.GENERATED:
        if record.released_by is not None:
            return "generated (released)"  # retention released its payloads (stepjournal prune)
        return "generated" if record.stored else "generated (not stored)"
    if record.action == Action.REPLAYED:
        same = record.source_step == record.step and record.source_run in (None, record.run)
        return "replayed (same step)" if same else "replayed (other step)"
    return record.action


def _kind(r: Row) -> str:
    """`kind_of` for a row."""
    action = r["action"]
    if action == Action.GENERATED:
        if r["released_by"] is not None:
            return "generated (released)"
        return "generated" if r["stored"] else "generated (not stored)"
    if action == Action.REPLAYED:
        same = r["source_step"] == r["step"] and r["source_run"] in (None, r["run"])
        return "replayed (same step)" if same else "replayed (other step)"
    return action


def record_of(row: Row) -> AuditRecord:
    """The `AuditRecord` of an audit row."""
    return AuditRecord(**{name: row[name] for name in _RECORD_FIELDS})


def _row_of(record: AuditRecord) -> Row:
    return {name: getattr(record, name) for name in _RECORD_FIELDS}


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
        if r.action == Action.REPLAYED:
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
        if a.action == Action.REPLAYED:
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


@attrs.frozen(slots=False)  # not slotted: `cells` and `links` are cached on the instance
class Timeline:
    """What to draw: the step of each column, the lane labels, cells, segments, bands and links.

    The calls are kept as columns (`cell_rows`, `cell_lanes`, `cell_columns`, `cell_kinds`, in
    (lane, column) order); `cells` and `links` build their objects on first use. `links` holds every
    replay link in the view; `arrows` says whether they are few enough to draw.
    """

    title: str
    steps: Tuple[int, ...]
    lanes: Tuple[str, ...]
    segments: Tuple[Segment, ...]
    bands: Tuple[Band, ...]
    hidden: Tuple[HiddenSource, ...]
    cell_rows: Tuple[Row, ...] = attrs.field(repr=False)
    cell_lanes: Tuple[int, ...] = attrs.field(repr=False)
    cell_columns: Tuple[int, ...] = attrs.field(repr=False)
    cell_kinds: Tuple[str, ...] = attrs.field(repr=False)
    link_pairs: Tuple[Tuple[int, int], ...] = attrs.field(repr=False)  # (source cell, replay cell) indices

    @property
    def calls(self) -> int:
        """The number of cells (calls drawn)."""
        return len(self.cell_rows)

    def cell(self, index: int) -> Cell:
        return Cell(self.cell_columns[index], self.cell_lanes[index], record_of(self.cell_rows[index]))

    @functools.cached_property
    def cells(self) -> Tuple[Cell, ...]:
        return tuple(self.cell(i) for i in range(self.calls))

    @functools.cached_property
    def links(self) -> Tuple[Link, ...]:
        return tuple(Link(self.cell(a), self.cell(b)) for a, b in self.link_pairs)

    @property
    def arrows(self) -> bool:
        return 0 < len(self.link_pairs) <= MAX_ARROWS

    def kind_counts(self) -> Dict[str, int]:
        """Calls per kind, in order of the kind's first cell."""
        counts: Dict[str, int] = {}
        for kind in self.cell_kinds:
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def served(self) -> Tuple[List[int], List[int], List[str]]:
        """For each generated or replayed cell: its column, the step whose data it served, its kind."""
        xs: List[int] = []
        ys: List[int] = []
        kinds: List[str] = []
        for row, column, kind in zip(self.cell_rows, self.cell_columns, self.cell_kinds):
            action = row["action"]
            if action == Action.GENERATED:
                served_step = row["step"]
            elif action == Action.REPLAYED:
                served_step = row["source_step"]
            else:
                continue
            xs.append(column)
            ys.append(served_step)
            kinds.append(kind)
        return xs, ys, kinds


def _merge(rows: Sequence[Row], lanes: Sequence[int], columns: Sequence[int],
           kinds: Sequence[str]) -> Tuple[List[Segment], List[Band]]:
    """Segments and bands of cells sorted by (lane, column), in one pass (no object per merged call)."""
    segments: List[List[Any]] = []  # as `seg`, closed
    bands: List[Band] = []
    seg: Optional[List[Any]] = None  # [lane, start, end, kind, policy, first, last] of the open segment
    band: Optional[List[Any]] = None  # [lane, start, end, policy]
    for r, lane, column, kind in zip(rows, lanes, columns, kinds):
        policy = r["policy"]
        if seg is not None and seg[0] == lane and seg[2] + 1 == column and seg[3] == kind and seg[4] == policy:
            seg[2], seg[6] = column, r
        else:
            if seg is not None:
                segments.append(seg)
            seg = [lane, column, column, kind, policy, r, r]
        # A band spans a lane's gaps: a validation lane called every tenth step is one "bypass" band.
        if band is not None and band[0] == lane and band[3] == policy:
            band[2] = column
        else:
            if band is not None:
                bands.append(Band(*band))
            band = [lane, column, column, policy]
    if seg is not None and band is not None:  # both open from the first cell on
        segments.append(seg)
        bands.append(Band(*band))
    return [Segment(lane, start, end, kind, policy, record_of(first), record_of(last))
            for lane, start, end, kind, policy, first, last in segments], bands


def build_timeline(
    records: Sequence[AuditRecord],
    *,
    title: str,
    run: Optional[str] = None,
    steps: Optional[Container[int]] = None,
    mode: Optional[str] = None,
    sessions: Sequence[str] = (),
) -> Timeline:
    """Lay out audit records: columns are the distinct steps shown, in order; a lane is (session, mode, stage, index).

    Sessions are named s1, s2 ... as `session_names` names them: `sessions` are the journal's session
    ids in the order they opened; a session of `records` not among them follows, in order of its first
    call. Pass the whole journal's records: the `run` / `steps` / `mode` filter picks what is shown
    after naming, so a session's name does not change with the filter. When one lane holds several
    calls of the same step, the latest one is drawn.
    """
    return build_timeline_rows([_row_of(r) for r in records], title=title, run=run, steps=steps, mode=mode,
                               sessions=sessions)


def build_timeline_rows(
    rows: Sequence[Row],
    *,
    title: str,
    run: Optional[str] = None,
    steps: Optional[Container[int]] = None,
    mode: Optional[str] = None,
    sessions: Sequence[str] = (),
) -> Timeline:
    """`build_timeline` of audit rows (the whole journal's calls, in log order)."""
    names = session_names([*sessions, *(r["session"] for r in rows)])
    session_no = {session: int(name[1:]) for session, name in names.items()}
    if run is None and steps is None and mode is None:
        shown = rows
    else:
        shown = [r for r in rows if (run is None or r["run"] == run) and (steps is None or r["step"] in steps)
                 and (mode is None or r["mode"] == mode)]
    step_list = sorted({r["step"] for r in shown})
    column_of = {step: i for i, step in enumerate(step_list)}
    keys = [(session_no[r["session"]], r["run"], r["mode"] != DEFAULT_MODE, r["mode"], r["stage"] != DEFAULT_STAGE,
             r["stage"], r["gen_index"]) for r in shown]
    lane_keys = sorted(set(keys))
    several_runs = len({key[1] for key in lane_keys}) > 1
    lane_of = {key: i for i, key in enumerate(lane_keys)}
    labels = tuple(
        f"s{s} {run_ + ' ' if several_runs else ''}{mode_} {stage + ' ' if stage != 'generate' else ''}#{index}"
        for s, run_, _, mode_, _, stage, index in lane_keys
    )
    # A cell's place as one int, lane-major: sorting the ints sorts the cells by (lane, column).
    width = max(len(step_list), 1)
    latest: Dict[int, Row] = {}
    for key, r in zip(keys, shown):
        latest[lane_of[key] * width + column_of[r["step"]]] = r
    places = sorted(latest)
    cell_rows = [latest[p] for p in places]
    lanes = [p // width for p in places]
    columns = [p % width for p in places]
    kinds = [_kind(r) for r in cell_rows]
    segments, bands = _merge(cell_rows, lanes, columns, kinds)
    by_seq = {r["seq"]: i for i, r in enumerate(cell_rows)}
    links: List[Tuple[int, int]] = []
    hidden_steps: Dict[Tuple[int, str], List[int]] = {}
    hidden_count: Dict[Tuple[int, str], int] = {}
    source_of = None
    for i, r in enumerate(cell_rows):
        if r["action"] != Action.REPLAYED:
            continue
        source_seq = r["source_seq"]
        if source_seq in by_seq:
            links.append((by_seq[source_seq], i))
            continue
        if source_of is None:
            source_of = {x["seq"]: x for x in rows}
        source = source_of.get(source_seq)
        hidden_key: Tuple[int, str] = ((session_no[source["session"]], source["run"]) if source is not None
                                       else (0, r["source_run"] or r["run"]))
        hidden_steps.setdefault(hidden_key, []).append(r["source_step"])
        hidden_count[hidden_key] = hidden_count.get(hidden_key, 0) + 1
    hidden = tuple(
        HiddenSource(session, run_, str(StepRanges.from_steps(sorted(set(hidden_steps[(session, run_)])))),
                     hidden_count[(session, run_)])
        for session, run_ in sorted(hidden_steps)
    )
    links.sort(key=lambda pair: (columns[pair[1]], lanes[pair[1]]))
    return Timeline(title=title, steps=tuple(step_list), lanes=labels, segments=tuple(segments), bands=tuple(bands),
                    hidden=hidden, cell_rows=tuple(cell_rows), cell_lanes=tuple(lanes), cell_columns=tuple(columns),
                    cell_kinds=tuple(kinds), link_pairs=tuple(links))
