"""The read side of journaled tool calls: one row per call, a summary per step, the first differing response.

Reads through the facade only (`Journal.events`, `Journal.event`, `Journal.load`). A call's outcome is
read from its event: a replay was served; a call recorded under a rule that serves recordings
(`SERVING_RULES`) missed; one recorded under ``dump`` was recorded; a refusal missed and was refused;
a bypassed call under `CATCH_UP_POLICY` re-ran a served call on the live environment.
"""

from __future__ import annotations

from typing import Any, Container, Dict, Iterable, List, Optional, Tuple

import attrs

from ..base._errors import IntegrityError
from ..events._events import CallBypassed, CallEvent, CallRefused, GenerationRecorded, PayloadRef, ReplayServed
from ..events._words import ToolOutcome
from ..events._tool_calls import (
    CATCH_UP_POLICY,
    SERVING_RULES,
    ToolCallError,
    ToolCallKey,
    ToolRequest,
    ToolResponse,
    tool_of_stage,
)

__all__ = ["ToolCallRow", "ToolStepSummary", "tool_call_rows", "tool_step_summaries", "first_tool_difference"]

_CALL_EVENTS = (GenerationRecorded, ReplayServed, CallRefused, CallBypassed)
# What the counts and the comparison read an outcome as: a miss (refusals among them), a call that ran the
# tool here, a call with a response to compare.
_MISSED = frozenset({ToolOutcome.MISS, ToolOutcome.REFUSED})
_RAN = frozenset({ToolOutcome.RECORDED, ToolOutcome.MISS, ToolOutcome.BYPASSED})
_ANSWERED = frozenset({ToolOutcome.RECORDED, ToolOutcome.REPLAYED, ToolOutcome.MISS})


@attrs.frozen
class ToolCallRow:
    """One journaled tool call, as `audit --tools` and `show --text` print it.

    Attributes:
        seq, session, run, step, mode, stage: the call event's.
        tool: the tool (or environment) its stage names.
        key: its `ToolCallKey` (sample, turn, call).
        outcome: a `ToolOutcome` (its text: ``"recorded"``, ``"replayed"``, ``"miss"`` (the tool ran and was
            recorded), ``"refused"`` (a miss under ``replay``), ``"bypassed"`` or ``"caught up"`` (re-run on
            the live environment)).
        request: the `ToolRequest` (None when the event holds none: a refusal, a bypass; a catch-up shows
            the request of the served call it ran again).
        response: the `ToolResponse` (None when nothing was stored or served; a catch-up: the one served).
        duration_s: how long the call took here (the tool's wall time when it ran).
        saved_s: for a replay, the wall time the served call took when it ran (the tool time saved).
        source_key: for a replay, the key of the served record.
    """

    seq: int
    session: str
    run: str
    step: int
    mode: str
    stage: str
    tool: str
    key: ToolCallKey
    outcome: ToolOutcome = attrs.field(converter=ToolOutcome)  # its text too: a word no outcome has is refused
    request: Optional[ToolRequest]
    response: Optional[ToolResponse]
    duration_s: float
    saved_s: float = 0.0
    source_key: Optional[ToolCallKey] = None


@attrs.frozen
class ToolStepSummary:
    """A step's tool calls, counted: calls, replays, misses (refusals among them), tool time run and saved."""

    run: str
    step: int
    calls: int
    replayed: int
    misses: int
    refused: int
    tool_s: float
    saved_s: float


def _loaded(journal: Any, ref: Optional[PayloadRef], kind: Any) -> Any:
    """The `ToolRequest` or `ToolResponse` (`kind`) a stored payload holds; None when none is stored or it
    cannot be read (a released or damaged payload: `verify` names it)."""
    if ref is None:
        return None
    try:
        return kind.from_payload(journal.load(ref))
    except (IntegrityError, ToolCallError):
        return None


def _outcome(event: CallEvent) -> ToolOutcome:
    if isinstance(event, ReplayServed):
        return ToolOutcome.REPLAYED
    if isinstance(event, CallRefused):
        return ToolOutcome.REFUSED
    if isinstance(event, CallBypassed):
        return ToolOutcome.CAUGHT_UP if event.policy == CATCH_UP_POLICY else ToolOutcome.BYPASSED
    return ToolOutcome.MISS if event.policy in SERVING_RULES else ToolOutcome.RECORDED


def tool_call_rows(journal: Any, *, run: Optional[str] = None, steps: Optional[Container[int]] = None,
                   sample: Optional[int] = None, payloads: bool = True) -> List[ToolCallRow]:
    """Every tool call of the journal (of `run`, `steps`, `sample` when given), in log order.

    Args:
        steps: the steps to read (a set, a range, `StepRanges`); None: every step.
        payloads: False leaves requests and responses out (the counts need none).
    """
    rows = []
    # A catch-up re-runs a call its session was served: its row shows that call's request and response.
    served: Dict[Tuple[str, str, int, int], Tuple[Optional[ToolRequest], Optional[ToolResponse]]] = {}
    for seq, event in journal.events(run=run, types=_CALL_EVENTS, steps=steps):
        tool = tool_of_stage(event.stage)
        if tool is None:
            continue
        key = ToolCallKey.from_gen_index(event.gen_index)
        if sample is not None and key.sample != sample:
            continue
        outcome = _outcome(event)
        request = response = None
        saved, source_key = 0.0, None
        if isinstance(event, ReplayServed):
            event = journal.as_read_here(seq, event)  # a pulled replay names its source by this journal's seq
            source_key = ToolCallKey.from_gen_index(event.source_gen_index)
            source = journal.event(event.source_seq)
            saved = float(getattr(source, "duration_s", 0.0) or 0.0)
            if payloads:
                request = _loaded(journal, getattr(source, "input", None), ToolRequest)
        elif payloads and isinstance(event, GenerationRecorded):
            request = _loaded(journal, event.input, ToolRequest)
        if payloads and isinstance(event, (GenerationRecorded, ReplayServed)):
            response = _loaded(journal, event.output, ToolResponse)
        place = (event.session, event.stage, event.step, event.gen_index)
        if outcome is ToolOutcome.REPLAYED:
            served[place] = (request, response)
        elif outcome is ToolOutcome.CAUGHT_UP:
            request, response = served.get(place, (None, None))
        rows.append(ToolCallRow(
            seq=seq, session=event.session, run=event.run, step=event.step, mode=event.mode, stage=event.stage,
            tool=request.tool if request is not None else tool, key=key, outcome=outcome, request=request,
            response=response, duration_s=float(getattr(event, "duration_s", 0.0) or 0.0), saved_s=saved,
            source_key=source_key,
        ))
    return rows


def tool_step_summaries(rows: Iterable[ToolCallRow]) -> List[ToolStepSummary]:
    """Per (run, step), in step order: calls, replays, misses (refusals counted among them), tool time run
    (the calls that ran the tool; a miss's time holds its catch-up's) and saved (the replays' recorded wall
    time). A catch-up is not a call of its own here."""
    table: Dict[Tuple[str, int], List[float]] = {}
    for row in rows:
        counts = table.setdefault((row.run, row.step), [0, 0, 0, 0, 0.0, 0.0])
        if row.outcome is ToolOutcome.CAUGHT_UP:  # its time is in the miss that ran it, too
            continue
        counts[0] += 1
        counts[1] += row.outcome is ToolOutcome.REPLAYED
        counts[2] += row.outcome in _MISSED
        counts[3] += row.outcome is ToolOutcome.REFUSED
        if row.outcome in _RAN:
            counts[4] += row.duration_s
        counts[5] += row.saved_s
    return [ToolStepSummary(run, step, int(c[0]), int(c[1]), int(c[2]), int(c[3]), c[4], c[5])
            for (run, step), c in sorted(table.items(), key=lambda item: (item[0][1], item[0][0]))]


def first_tool_difference(left: Iterable[ToolCallRow], right: Iterable[ToolCallRow]) -> Optional[str]:
    """The first tool call (by step, sample, turn, call) whose response differs between two runs, in words;
    None when every call both hold answers the same. A call one side lacks counts as a difference."""
    def answered(rows: Iterable[ToolCallRow]) -> Dict[Tuple[int, str, str, ToolCallKey], ToolCallRow]:
        found = {}
        for row in rows:
            if row.outcome in _ANSWERED:
                found[(row.step, row.mode, row.stage, row.key)] = row  # the latest answer of a key
        return found

    a, b = answered(left), answered(right)
    for place in sorted(set(a) | set(b), key=lambda p: (p[0], p[3], p[1], p[2])):
        step, mode, stage, key = place
        one, other = a.get(place), b.get(place)
        where = f"step {step} {stage} {key}" + ("" if mode == "train" else f" ({mode})")
        if one is None or other is None:
            return f"{where}: only the {'left' if other is None else 'right'} run has this tool call"
        if one.request != other.request:
            return f"{where}: the requests differ ({one.request} vs {other.request})"
        if _comparable(one.response) != _comparable(other.response):
            return f"{where}: the responses to {one.request} differ"
    return None


class _NaN:
    """NaN where a response holds it: equal to another NaN, so a response compares equal to itself."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NaN)

    def __hash__(self) -> int:
        return 0


def _nan_equal(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return _NaN()
    if isinstance(value, dict):
        return {key: _nan_equal(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_equal(item) for item in value]
    return value


def _comparable(response: Optional[ToolResponse]) -> Any:
    if response is None:
        return None
    images = [image.tolist() if hasattr(image, "tolist") else image for image in response.images]
    return _nan_equal([response.text, response.reward, dict(response.metrics), images])

