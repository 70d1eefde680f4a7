"""`diff_journals`: pair the records of two runs (or sessions) call by call and say where they part.

Records are paired by (stage, mode, step, gen_index). By default each side is its run's recordings:
the latest `GenerationRecorded` with an output, replays left out (a later replay of a run does not
change what the run recorded). A side given a session is that session's latest call, recorded or
replayed (`ReplayServed`): how a replay is compared with its recording. Equal
digests are equal without loading anything; differing digests are loaded (digest checked) and
compared structurally by `_compare`. A payload that fails its digest check is *damaged*, never
*differing*. Nothing here writes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Container, Dict, List, Mapping, Optional, Set, Tuple

import attrs
import msgpack

from ..index._audit import session_names
from ..payloads._codec_registry import CodecRegistry
from ._compare import Comparison, compare_values
from ..events._convert import decode_event
from ._diff_report import (
    DAMAGED,
    EQUAL,
    ONLY_A,
    ONLY_B,
    UNREADABLE,
    DiffReport,
    DiffSide,
    PairDiff,
    compact_steps,
    pair_order,
    stage_order,
)
from ..base._errors import (
    DiffError,
    EventDecodeError,
    IntegrityError,
    PayloadDecodeError,
    UnknownEventTypeError,
    UnsupportedSchemaVersionError,
)
from ..events._events import EventsImported, GenerationRecorded, ReplayServed, SessionOpened
from ..base._log import get_logger
from ._tolerance import Tolerance, Tolerances

if TYPE_CHECKING:  # pragma: no cover
    from .._journal import Journal

__all__ = ["diff_journals"]

Key = Tuple[str, str, int, int]

log = get_logger(__name__)

# -- reading one side -------------------------------------------------------------------------------
@attrs.define
class _Scan:
    """Every readable event of one journal, with what could not be read."""

    events: List[Tuple[int, Any]] = attrs.field(factory=list)
    versions: Dict[str, Set[int]] = attrs.field(factory=dict)
    unreadable: List[int] = attrs.field(factory=list)
    damaged: List[int] = attrs.field(factory=list)


def _scan(journal: "Journal") -> _Scan:
    scan = _Scan()
    for seq, raw in journal.raw_events():
        try:
            event = decode_event(raw, seq=seq)
        except (UnsupportedSchemaVersionError, UnknownEventTypeError):
            scan.unreadable.append(seq)
            continue
        except EventDecodeError:
            scan.damaged.append(seq)
            continue
        if isinstance(event, EventsImported):
            continue  # provenance of pulled events, not a call
        scan.events.append((seq, event))
        # The version as stored, before any upgrade lifted it: what the notes report.
        body = msgpack.unpackb(bytes(raw), raw=False)
        scan.versions.setdefault(body["type"], set()).add(body["v"])
    return scan


def _choose(scan: _Scan, path: str, label: str, run: Optional[str],
            session: Optional[str]) -> Tuple[str, Optional[str], Optional[str]]:
    """The run, full session id and session name (``s2``) one side compares (None, None without a session)."""
    runs = list(dict.fromkeys(e.run for _, e in scan.events if not isinstance(e, SessionOpened)))
    arg = f"run_{label.lower()}"
    if session is not None:
        opened = [e for _, e in scan.events if isinstance(e, SessionOpened)]
        names = session_names(e.session for e in opened)
        found = [e for e in opened if names[e.session] == session or e.session.startswith(session)]
        if len(found) != 1:
            known = ", ".join(f"{names[e.session]} ({e.session[:8]})" for e in opened) or "none"
            how = "no" if not found else f"{len(found)}"
            raise DiffError(f"{label} ({path}): {how} session matches {session!r}; its sessions are: {known}")
        if run is not None and run != found[0].run:
            raise DiffError(f"{label} ({path}): session {session!r} belongs to run {found[0].run!r}, not {run!r}")
        return found[0].run, found[0].session, names[found[0].session]
    if run is not None:
        if run not in runs:
            raise DiffError(f"{label} ({path}): run {run!r} has no calls; its runs are: {', '.join(runs) or 'none'}")
        return run, None, None
    if not runs:
        raise DiffError(f"{label} ({path}) holds no recorded calls")
    if len(runs) > 1:
        raise DiffError(f"{label} ({path}) holds several runs ({', '.join(runs)})", argument=arg)
    return runs[0], None, None


# Stages that record the run, not a step (the tokenizer `stepjournal.adapters.record_tokenizer` keeps, docs/journal.md):
# a replay session that found it kept already records none, so comparing them would say sessions differ.
RUN_STAGES = frozenset({"tokenizer"})


def _records(
    scan: _Scan,
    run: str,
    session: Optional[str],
    steps: Optional[Container[int]],
    stage: Optional[str],
    mode: Optional[str],
) -> Dict[Key, Tuple[int, Any]]:
    """The latest call with an output per (stage, mode, step, gen_index) of the selection.

    Without a session: the run's recordings only. With one: that session's records and replays.
    """
    latest: Dict[Key, Tuple[int, Any]] = {}
    for seq, event in scan.events:
        if isinstance(event, GenerationRecorded):
            if event.output is None:
                continue
        elif not isinstance(event, ReplayServed) or session is None:
            continue
        if event.run != run or (session is not None and event.session != session):
            continue
        event_stage = getattr(event, "stage", "generate")  # journals before stages: every call generates
        if (stage is not None and event_stage != stage) or (mode is not None and event.mode != mode):
            continue
        if event_stage in RUN_STAGES and stage is None:  # the run's tokenizer, not a step's call: only when asked
            continue
        if steps is not None and event.step not in steps:
            continue
        latest[(event_stage, event.mode, event.step, event.gen_index)] = (seq, event)
    return latest


# -- comparing -------------------------------------------------------------------------------------
class _Loader:
    """Loads payloads (digest checked), sorting failures into damaged and unreadable."""

    def __init__(self) -> None:
        self.loaded = 0

    def load(self, journal: "Journal", event: Any, label: str) -> Tuple[Optional[str], Any, str]:
        """(state, value, detail): state None when loaded, else `DAMAGED` or `UNREADABLE`."""
        try:
            value = journal.load(event.output, step=event.step)
        except PayloadDecodeError as exc:  # digest matched: intact bytes this process cannot decode
            return UNREADABLE, None, f"unreadable in {label}: {_one_line(exc)}"
        except IntegrityError as exc:
            return DAMAGED, None, f"damaged in {label}: {_one_line(exc)}"
        self.loaded += 1
        return None, value, ""


def _one_line(message: object) -> str:
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


def diff_journals(
    a: "Journal",
    b: "Journal",
    *,
    run_a: Optional[str] = None,
    run_b: Optional[str] = None,
    session_a: Optional[str] = None,
    session_b: Optional[str] = None,
    steps: Optional[Container[int]] = None,
    stage: Optional[str] = None,
    mode: Optional[str] = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    tolerances: Optional[Mapping[str, Any]] = None,
    registry: Optional[CodecRegistry] = None,
) -> DiffReport:
    """Compare two runs record by record; see docs/diff.md.

    Args:
        a, b: open journals (read-only is enough); they may be the same journal.
        run_a, run_b: the run key of each side (needed when a journal holds several).
        session_a, session_b: this session's calls, recorded and replayed: its short name (``s2``,
            see `session_names`), its id or a unique prefix of it. Without one, a side is its run's
            recordings: replays are left out.
        steps: only these steps (a set, range or `StepRanges`).
        stage, mode: only records of this stage / mode.
        atol, rtol: overall tolerance of floating-point values; None for both means the per-dtype
            defaults (`DTYPE_TOLERANCES`), one given means the other is 0.
        tolerances: per field: field path -> atol, (atol, rtol) or `Tolerance`.
        registry: codecs of custom types, to compare them as stored (default: the default registry).

    Returns:
        The `DiffReport`.

    Raises:
        DiffError: a run or session does not exist or is ambiguous, the runs share no step, or a
            per-field tolerance names a field neither side holds.
        EventDecodeError: never for a damaged event: damaged events are left out and noted.
    """
    tol = Tolerances(atol=atol, rtol=rtol, fields={k: _tolerance(k, v) for k, v in (tolerances or {}).items()})
    scan_a = _scan(a)
    scan_b = scan_a if b is a else _scan(b)
    run_a, session_a, name_a = _choose(scan_a, a.path, "A", run_a, session_a)
    run_b, session_b, name_b = _choose(scan_b, b.path, "B", run_b, session_b)
    rec_a = _records(scan_a, run_a, session_a, steps, stage, mode)
    rec_b = _records(scan_b, run_b, session_b, steps, stage, mode)
    steps_a, steps_b = {k[2] for k in rec_a}, {k[2] for k in rec_b}
    if not steps_a & steps_b:
        raise DiffError(
            f"the runs share no step: A (run {run_a!r}) has steps {compact_steps(sorted(steps_a))}, "
            f"B (run {run_b!r}) has {compact_steps(sorted(steps_b))}; check the runs, sessions and filters"
        )
    loader = _Loader()
    seen: Set[Tuple[str, ...]] = set()
    cache: Dict[Tuple[str, str], Tuple[str, Optional[Comparison], str]] = {}
    pairs: List[PairDiff] = []
    order_a = stage_order((key[2], seq, key[0]) for key, (seq, _) in rec_a.items())
    order = order_a + tuple(s for s in stage_order((key[2], seq, key[0]) for key, (seq, _) in rec_b.items())
                            if s not in order_a)
    for key in sorted(set(rec_a) | set(rec_b), key=lambda key: pair_order(key, order)):
        stage_k, mode_k, step_k, index_k = key
        got_a, got_b = rec_a.get(key), rec_b.get(key)
        seq_a, ev_a = got_a if got_a else (None, None)
        seq_b, ev_b = got_b if got_b else (None, None)
        dig_a = ev_a.output.digest if ev_a is not None else None
        dig_b = ev_b.output.digest if ev_b is not None else None
        comparison, detail = None, ""
        if ev_b is None:
            state = ONLY_A
        elif ev_a is None:
            state = ONLY_B
        elif dig_a == dig_b:
            state = EQUAL  # the same content: nothing to load
        else:
            pair = (ev_a.output.digest, ev_b.output.digest)  # both sides hold the call here
            if pair not in cache:
                cache[pair] = _compare_pair(loader, a, ev_a, b, ev_b, tol, registry, seen)
            state, comparison, detail = cache[pair]
        pairs.append(PairDiff(stage_k, mode_k, step_k, index_k, state, seq_a, seq_b, dig_a, dig_b, comparison, detail))
    notes = _notes(scan_a, scan_b)
    if os.path.realpath(a.path) == os.path.realpath(b.path) and (run_a, session_a) == (run_b, session_b):
        notes.append("A and B select the same records (one journal, run and session): choose two runs or sessions")
    if tol.fields:
        if loader.loaded:
            unused = tol.unused(seen)
            if unused:
                fields = sorted({".".join(n) for n in seen if n})[:12]
                raise DiffError(
                    f"tolerance for {', '.join(repr(f) for f in unused)}: no such field on either side; "
                    f"the fields compared are: {', '.join(fields) or 'none (no dicts)'}"
                )
        else:
            notes.append("per-field tolerances were not checked: no payload needed comparing")
    report = DiffReport(
        a=DiffSide(a.path, run_a, session_a, len(rec_a), _versions(scan_a), tuple(scan_a.unreadable),
                   tuple(scan_a.damaged), name_a),
        b=DiffSide(b.path, run_b, session_b, len(rec_b), _versions(scan_b), tuple(scan_b.unreadable),
                   tuple(scan_b.damaged), name_b),
        pairs=tuple(pairs),
        tolerances=tol,
        notes=tuple(notes),
        payloads_loaded=loader.loaded,
        stage_order=order,
    )
    log.info("journals_diffed", pairs=len(pairs), loaded=loader.loaded, exit_code=report.exit_code)
    return report


def _compare_pair(
    loader: _Loader, a: "Journal", ev_a: Any, b: "Journal", ev_b: Any, tol: Tolerances,
    registry: Optional[CodecRegistry], seen: Set[Tuple[str, ...]],
) -> Tuple[str, Optional[Comparison], str]:
    state_a, value_a, detail_a = loader.load(a, ev_a, "A")
    state_b, value_b, detail_b = loader.load(b, ev_b, "B")
    if DAMAGED in (state_a, state_b):  # damage wins: it is never reported as a difference
        return DAMAGED, None, "; ".join(d for d, s in ((detail_a, state_a), (detail_b, state_b)) if s == DAMAGED)
    if state_a or state_b:
        return UNREADABLE, None, "; ".join(d for d in (detail_a, detail_b) if d)
    comparison, names = compare_values(value_a, value_b, tol, registry=registry)
    seen |= names
    return comparison.state, comparison, ""


def _tolerance(field: str, value: Any) -> Tolerance:
    if isinstance(value, Tolerance):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Tolerance(float(value), 0.0)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return Tolerance(float(value[0]), float(value[1]))
    raise DiffError(f"tolerance for {field!r} is {value!r}: give atol, (atol, rtol) or a Tolerance")


def _versions(scan: _Scan) -> Dict[str, Tuple[int, ...]]:
    return {tag: tuple(sorted(v)) for tag, v in sorted(scan.versions.items())}


def _notes(scan_a: _Scan, scan_b: _Scan) -> List[str]:
    notes = []
    va, vb = _versions(scan_a), _versions(scan_b)
    for tag in sorted(set(va) & set(vb)):
        if va[tag] != vb[tag]:
            notes.append(
                f"{tag} events are schema v{','.join(map(str, va[tag]))} in A and "
                f"v{','.join(map(str, vb[tag]))} in B; both are read as this stepjournal's current version"
            )
    for label, scan in (("A", scan_a), ("B", scan_b)):
        if scan.unreadable:
            notes.append(
                f"{label}: {len(scan.unreadable)} events (#{', #'.join(map(str, scan.unreadable[:5]))}"
                f"{' …' if len(scan.unreadable) > 5 else ''}) are of a newer schema this stepjournal cannot read: "
                "left out, what both can read is compared; upgrade stepjournal to compare them"
            )
        if scan.damaged:
            notes.append(
                f"{label}: {len(scan.damaged)} events (#{', #'.join(map(str, scan.damaged[:5]))}) are damaged "
                "and were left out; run `stepjournal verify`"
            )
    return notes
