"""The report of a diff: one `PairDiff` per paired call, what each side selected, the summary line.

`DiffReport.to_json` is the format of ``stepjournal diff --json``; its keys are versioned by
`DIFF_SCHEMA_VERSION` and documented in docs/diff.md.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import attrs

from ..events._keys import DEFAULT_MODE
from ._compare import DIFFERING, EQUAL, WITHIN_TOLERANCE, Comparison, json_float
from ._tolerance import Tolerances

__all__ = [
    "DIFF_SCHEMA_VERSION",
    "PAIR_STATES",
    "ONLY_A",
    "ONLY_B",
    "DAMAGED",
    "UNREADABLE",
    "DiffSide",
    "PairDiff",
    "DiffReport",
    "stage_order",
    "stage_rank",
    "compact_steps",
    "pair_order",
]

# Bump when a key of `DiffReport.to_json` changes meaning or disappears; adding keys keeps it.
# 2: a side without a session is its run's recordings (replays left out); it was every call.
DIFF_SCHEMA_VERSION = 2
ONLY_A, ONLY_B, DAMAGED, UNREADABLE = "only_a", "only_b", "damaged", "unreadable"
PAIR_STATES = (EQUAL, WITHIN_TOLERANCE, DIFFERING, ONLY_A, ONLY_B, DAMAGED, UNREADABLE)
_AGREE = (EQUAL, WITHIN_TOLERANCE)

Key = Tuple[str, str, int, int]  # stage, mode, step, gen_index: how pairs are keyed


def stage_order(calls: Iterable[Tuple[int, int, str]]) -> Tuple[str, ...]:
    """The stages in the order a run journaled them, from its calls' ``(step, seq, stage)``.

    The journal knows no adapter's stages: their order within a step is the one the events show. A
    stage's place is its position in the first step that journaled it (each stage placed by its first
    call in the step); stages of the same place sort by name.
    """
    first: Dict[Tuple[int, str], int] = {}
    for step, seq, stage in calls:
        if first.get((step, stage), seq) >= seq:
            first[(step, stage)] = seq
    by_step: Dict[int, List[Tuple[int, str]]] = {}
    for (step, stage), seq in first.items():
        by_step.setdefault(step, []).append((seq, stage))
    place: Dict[str, int] = {}
    for step in sorted(by_step):
        for position, (_, stage) in enumerate(sorted(by_step[step])):
            place.setdefault(stage, position)
    return tuple(sorted(place, key=lambda stage: (place[stage], stage)))


def stage_rank(stage: str, order: Sequence[str]) -> Tuple[int, str]:
    """Where a stage sorts within a step: its place in `order` (a `stage_order`), then any other
    stage alphabetically."""
    return (order.index(stage), "") if stage in order else (len(order), stage)


def pair_order(key: Key, order: Sequence[str]) -> Tuple[Any, ...]:
    """The sort key of a pair: step, stage (by `order`), mode (the default mode first), call index."""
    stage, mode, step, gen_index = key
    return (step, stage_rank(stage, order), mode != DEFAULT_MODE, mode, gen_index)


@attrs.frozen
class DiffSide:
    """What one side of a diff selected.

    Attributes:
        path: the journal folder.
        run, session: the run key and session compared. Session None: the run's recordings, from
            every session, replays left out; a session: its calls, recorded and replayed.
        records: how many (stage, mode, step, gen_index) records were selected.
        event_versions: schema versions of the events read, per event type tag.
        unreadable_events: sequence numbers of events this stepjournal cannot read (newer schema).
        damaged_events: sequence numbers of events that do not decode (damaged).
        session_name: the session's short name (``s2``, see `session_names`), None without a session.
    """

    path: str
    run: str
    session: Optional[str]
    records: int
    event_versions: Mapping[str, Tuple[int, ...]]
    unreadable_events: Tuple[int, ...] = ()
    damaged_events: Tuple[int, ...] = ()
    session_name: Optional[str] = None

    @property
    def selects(self) -> str:
        """What the side pairs: ``"recordings"`` (no session given) or ``"session"``."""
        return "recordings" if self.session is None else "session"

    def to_json(self) -> Dict[str, Any]:
        row = attrs.asdict(self)
        row["selects"] = self.selects
        row["event_versions"] = {k: list(v) for k, v in self.event_versions.items()}
        row["unreadable_events"] = list(self.unreadable_events)
        row["damaged_events"] = list(self.damaged_events)
        return row


@attrs.frozen
class PairDiff:
    """One pair of records: the same (stage, mode, step, gen_index) on both sides.

    Attributes:
        stage, mode, step, gen_index: the call.
        state: one of `PAIR_STATES`: ``equal``, ``within_tolerance``, ``differing``, ``only_a``,
            ``only_b``, ``damaged`` (a payload fails its digest check or is missing), ``unreadable``
            (intact, but this process cannot decode it: a newer payload format, an unknown codec).
        seq_a, seq_b, digest_a, digest_b: the records compared (None on a side that has none).
        comparison: the structural comparison, when both payloads were loaded.
        detail: what went wrong, for ``damaged`` and ``unreadable``.
    """

    stage: str
    mode: str
    step: int
    gen_index: int
    state: str
    seq_a: Optional[int] = None
    seq_b: Optional[int] = None
    digest_a: Optional[str] = None
    digest_b: Optional[str] = None
    comparison: Optional[Comparison] = None
    detail: str = ""

    @property
    def max_abs(self) -> Optional[float]:
        return self.comparison.max_abs if self.comparison is not None else None

    def brief(self) -> str:
        """What this pair is, in a few words: ``sample 12: 0.0 vs 1.0``, ``only in A``, ``damaged in B: …``."""
        if self.state in (DIFFERING, WITHIN_TOLERANCE) and self.comparison and self.comparison.first:
            return self.comparison.first.brief()
        return {ONLY_A: "only in A", ONLY_B: "only in B", EQUAL: "equal"}.get(self.state, self.detail)

    def to_json(self) -> Dict[str, Any]:
        return {
            "stage": self.stage,
            "mode": self.mode,
            "step": self.step,
            "gen_index": self.gen_index,
            "state": self.state,
            "seq_a": self.seq_a,
            "seq_b": self.seq_b,
            "digest_a": self.digest_a,
            "digest_b": self.digest_b,
            "brief": self.brief(),
            "max_abs": json_float(self.max_abs),
            "detail": self.detail,
            "comparison": self.comparison.to_json() if self.comparison is not None else None,
        }


@attrs.frozen
class DiffReport:
    """Every pair of two runs, in step and stage order, with the first divergence on top.

    Attributes:
        a, b: what each side selected.
        pairs: one `PairDiff` per (stage, mode, step, gen_index), ordered by step, then
            `stage_order`, then mode (train first) and call index.
        tolerances: the tolerances applied.
        notes: what the reader should know (schema versions, events left out ...).
        payloads_loaded: how many payloads were decoded (equal digests load none).
        stage_order: the stages in the order the runs journaled them within a step (`stage_order`:
            side A's, then any stage only B has).
    """

    a: DiffSide
    b: DiffSide
    pairs: Tuple[PairDiff, ...]
    tolerances: Tolerances
    notes: Tuple[str, ...] = ()
    payloads_loaded: int = 0
    schema_version: int = DIFF_SCHEMA_VERSION
    stage_order: Tuple[str, ...] = ()

    def stage_rank(self, stage: str) -> Tuple[int, str]:
        """Where `stage` sorts within a step of this report (`stage_order`, then alphabetically)."""
        return stage_rank(stage, self.stage_order)

    @property
    def first_divergence(self) -> Optional[PairDiff]:
        """The earliest pair that does not agree (neither equal nor within tolerance), or None."""
        return next((p for p in self.pairs if p.state not in _AGREE), None)

    @property
    def counts(self) -> Dict[str, int]:
        found = dict.fromkeys(PAIR_STATES, 0)
        for pair in self.pairs:
            found[pair.state] += 1
        return found

    @property
    def exit_code(self) -> int:
        """0 when every pair is equal or within tolerance, else 1 (like `diff`)."""
        return 0 if self.first_divergence is None else 1

    @property
    def summary(self) -> str:
        """One line: where the runs part, or that they agree."""
        steps = sorted({p.step for p in self.pairs})
        first = self.first_divergence
        if first is None:
            close = self.counts[WITHIN_TOLERANCE]
            extra = f", {close} of them within tolerance" if close else ""
            return f"runs agree: {len(self.pairs)} pairs over steps {compact_steps(steps)} are equal{extra}"
        before = [s for s in steps if s < first.step]
        head = f"runs agree through step {before[-1]}" if before else "runs part at the first compared step"
        call = _call_text(first)
        line = f"{head}; at step {first.step} the first differing stage is {first.stage}{call} ({first.brief()})"
        same_step = [p for p in self.pairs if p.step == first.step]
        agreeing = [
            st for st in dict.fromkeys(p.stage for p in same_step
                                       if self.stage_rank(p.stage) < self.stage_rank(first.stage))
            if all(p.state in _AGREE for p in same_step if p.stage == st)
        ]
        if agreeing:
            line += f"; {', '.join(agreeing)} {'is' if len(agreeing) == 1 else 'are'} equal"
        parted = sum(p.state not in _AGREE for p in self.pairs)
        return f"{line}; {parted} of {len(self.pairs)} pairs differ"

    def to_json(self) -> Dict[str, Any]:
        """The report as a JSON object of schema `DIFF_SCHEMA_VERSION` (docs/diff.md)."""
        first = self.first_divergence
        return {
            "schema_version": self.schema_version,
            "summary": self.summary,
            "exit_code": self.exit_code,
            "counts": self.counts,
            "first_divergence": first.to_json() if first is not None else None,
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "tolerances": {
                "atol": self.tolerances.atol,
                "rtol": self.tolerances.rtol,
                "fields": {k: {"atol": t.atol, "rtol": t.rtol} for k, t in self.tolerances.fields.items()},
            },
            "notes": list(self.notes),
            "payloads_loaded": self.payloads_loaded,
            "stage_order": list(self.stage_order),
            "pairs": [p.to_json() for p in self.pairs],
        }


def _call_text(pair: PairDiff) -> str:
    parts = ([] if pair.mode == DEFAULT_MODE else [pair.mode]) + ([f"call #{pair.gen_index}"] if pair.gen_index else [])
    return f" [{', '.join(parts)}]" if parts else ""


def compact_steps(steps: Sequence[int]) -> str:
    """1,2,3,5,7,8 -> '1-3,5,7-8'."""
    out: List[List[int]] = []
    for step in sorted(set(steps)):
        if out and out[-1][1] == step - 1:
            out[-1][1] = step
        else:
            out.append([step, step])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out) or "none"
