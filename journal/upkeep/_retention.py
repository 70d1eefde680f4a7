"""Retention rules and the plan they make: which recorded generations' payloads go, and why.

Pure: `RetentionState` is a fold over ``(seq, event)`` pairs (the event log), `plan` a function of
that state and the rules. Nothing here reads or writes storage; `_prune` carries a plan out.

A rule set (`Retention`) applies to each *group* of records it selects: a group is one
(run, mode, stage) (`group_of`); every rule selects records through `group_of` and
`Retention.selects` (by run, mode and stage; each stage is its own group, so ``keep_last=50``
keeps 50 steps of every stage it selects). Within a group the unit is the
step: a step is kept (all its records keep their payloads) or released (all its records are).

- ``keep_last=N``: the N largest recorded steps are kept (None: no limit by count);
- ``pin``: steps in this container (a set, range or `StepRanges`) are always kept;
- ``keep_replayed`` (default on): a step some session replayed from is always kept;
- ``max_bytes``: the group's stored bytes (each distinct payload once) are capped: the smallest
  steps neither pinned nor replayed from are released until the rest fits.

A payload that a kept record (of any group) still uses is never released: the same digest can serve
several steps, outputs and inputs alike.
"""

from __future__ import annotations

import bisect
from typing import Any, Container, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

import attrs

from ..base._errors import RetentionConflictError, RetentionError
from ..events._events import CallEvent, Event, EventsImported, GenerationRecorded, PayloadsReleased, ReplayServed
from ..index._import_map import ImportMap

__all__ = [
    "Retention",
    "RetentionError",
    "RetentionConflictError",
    "RetentionState",
    "RetentionPlan",
    "PlannedRelease",
    "group_of",
    "plan_retention",
    "parse_size",
]

# What groups records (see the module docstring).
Group = Tuple[str, str, str]  # run, mode, stage

_LARGEST_SIZE = (1 << 63) - 1
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def group_of(event: CallEvent) -> Group:
    """The group a call event's record belongs to: its (run, mode, stage)."""
    return (event.run, event.mode, event.stage)


def parse_size(text: Union[str, int]) -> int:
    """A byte count from ``"10G"``, ``"512M"``, ``"4096"`` (binary units; K, M, G, T with optional B/iB).

    Raises:
        RetentionError: the text is not a size.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        raw = str(text).strip().upper().replace(" ", "")
        digits = raw.rstrip("KMGTIB")
        unit = raw[len(digits):]
        try:
            number = float(digits)
        except ValueError:
            number = -1.0
        if unit not in _UNITS or not digits or number != number or number < 0:
            raise RetentionError(("max_bytes", text), " is not a size: use a byte count like 4096, 512M or 10G",
                                 option="max_bytes", value=text)
        scaled = number * _UNITS[unit]  # 1e400 and a 5 000-digit count are infinite as floats
        value = int(scaled) if scaled <= _LARGEST_SIZE else _LARGEST_SIZE + 1
    if value > _LARGEST_SIZE:
        raise RetentionError(("max_bytes", text), " is past any size (at most 2**63-1 bytes): use "
                             "a byte count like 4096, 512M or 10G", option="max_bytes", value=text)
    if value < 0:
        raise RetentionError(("max_bytes", text),
                             " is negative: use a byte count like 4096, 512M or 10G", option="max_bytes", value=text)
    return value


def _check_count(value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise RetentionError(("keep_last", value),
                             " is not valid: use a whole number of steps (0 or more) or None", option="keep_last",
                             value=value)


def _size_or_none(value: Any) -> Optional[int]:
    return None if value is None else parse_size(value)


def _pin_text(pin: Any) -> str:
    if pin is None:
        return ""
    if isinstance(pin, (set, frozenset, list, tuple)):
        return ",".join(str(s) for s in sorted(pin))
    if isinstance(pin, range):
        return f"{pin.start}-{pin.stop - 1}" + (f":{pin.step}" if pin.step != 1 else "")
    return str(pin)


@attrs.frozen
class Retention:
    """Which recorded steps keep their payloads (see the module docstring for each rule).

    Args:
        keep_last: keep the N largest recorded steps of each group (None: no limit by count).
        pin: steps always kept: any container of ints (a set, range, or `stepjournal.policies.StepRanges`).
        keep_replayed: always keep a step that some session replayed from.
        max_bytes: cap on each group's stored payload bytes (an int, or text like ``"10G"``).
        run: only the group(s) of this run key (None: every run).
        mode: only the group(s) of this mode (None: every mode).
        allow_release_all: let a plan release every record of a group (refused otherwise).
        stage: only the group(s) of this stage (``"generate"``, ``"reward"`` ...; None: every stage).

    Raises:
        RetentionError: a value is malformed, or no rule limits anything (nothing would ever go).
    """

    keep_last: Optional[int] = attrs.field(default=None, validator=lambda _i, _a, v: _check_count(v))
    pin: Optional[Container[int]] = None
    keep_replayed: bool = True
    max_bytes: Optional[int] = attrs.field(default=None, converter=_size_or_none)
    run: Optional[str] = None
    mode: Optional[str] = None
    allow_release_all: bool = False
    stage: Optional[str] = None

    def __attrs_post_init__(self) -> None:
        if self.keep_last is None and self.max_bytes is None:
            raise RetentionError("retention without ", ("keep_last", None), " or ", ("max_bytes", None),
                                 " keeps everything: give ", ("keep_last", None), " and/or ", ("max_bytes", None))
        if self.pin is not None and not hasattr(self.pin, "__contains__"):
            raise RetentionError(("pin", self.pin),
                                 " is not a container of steps: use a set, range or StepRanges", option="pin",
                                 value=self.pin)

    def selects(self, group: Group) -> bool:
        """Whether this rule set applies to the records of `group`."""
        run, mode, stage = group
        return ((self.run is None or self.run == run) and (self.mode is None or self.mode == mode)
                and (self.stage is None or self.stage == stage))

    def describe(self) -> str:
        """The rules as one line (what a `PayloadsReleased` event names as its rule)."""
        parts = []
        if self.keep_last is not None:
            parts.append(f"keep_last={self.keep_last}")
        if self.pin is not None:
            parts.append(f"pin={_pin_text(self.pin)}")
        if self.max_bytes is not None:
            parts.append(f"max_bytes={self.max_bytes}")
        parts.append("keep_replayed" if self.keep_replayed else "no keep_replayed")
        if self.run is not None:
            parts.append(f"run={self.run}")
        if self.mode is not None:
            parts.append(f"mode={self.mode}")
        if self.stage is not None:
            parts.append(f"stage={self.stage}")
        return " ".join(parts)


@attrs.frozen
class _Record:
    seq: int
    group: Group
    step: int
    gen_index: int
    refs: Tuple[Tuple[str, int], ...]  # (digest, stored bytes) of the output and input


@attrs.frozen
class PlannedRelease:
    """One recorded generation whose payloads a plan releases.

    Attributes:
        record_seq: the seq of its `GenerationRecorded`.
        run, mode, step, gen_index, stage: which call it recorded.
        released: digests deleted with it.
        retained: its digests that stay because a kept record uses them (or another release names them).
        reason: why its step goes.
    """

    record_seq: int
    run: str
    mode: str
    step: int
    gen_index: int
    released: Tuple[str, ...]
    retained: Tuple[str, ...]
    reason: str
    stage: str = "generate"


@attrs.frozen
class RetentionPlan:
    """What applying retention would do: releases, and digests an earlier release left behind.

    Attributes:
        releases: one per record released, in log order.
        leftover: digests an earlier `PayloadsReleased` named that no live record uses (a second run
            finishes what an interrupted prune started).
        kept_steps: per group, how many steps stay.
        released_bytes: stored bytes of the released digests (each once).
        rule: the rules, as `Retention.describe` writes them.
        warnings: rules that could not be met (e.g. pinned steps over the byte cap, live use).
    """

    releases: Tuple[PlannedRelease, ...]
    leftover: Tuple[str, ...]
    kept_steps: Dict[Group, int]
    released_bytes: int
    rule: str
    warnings: Tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.releases and not self.leftover


class RetentionState:
    """The fold of the event log that retention plans from: live records, replay sources, releases.

    Feed it ``(seq, event)`` pairs in log order with `apply` (each seq once; `last_seq` says how far
    it got). Held by a journal applying retention while it records, caught up from the log each time.
    """

    def __init__(self) -> None:
        self.last_seq = 0
        self.records: Dict[int, _Record] = {}
        self.by_group: Dict[Group, Dict[int, List[int]]] = {}  # group -> step -> record seqs
        self.steps: Dict[Group, List[int]] = {}  # group -> sorted steps with live records
        self.users: Dict[str, Set[int]] = {}  # digest -> live record seqs using it
        self.replayed_steps: Dict[Group, Set[int]] = {}  # group -> steps some session replayed from
        self.released: Set[str] = set()  # digests some release named
        self.imports = ImportMap()  # pulled events name others by their source journal's seqs

    def apply(self, seq: int, event: Event) -> None:
        if seq <= self.last_seq:
            return
        self.last_seq = seq
        if isinstance(event, EventsImported):
            self.imports.marker(seq, event)
        event = self.imports.translate(seq, event)
        if isinstance(event, GenerationRecorded):
            refs = tuple((r.digest, r.stored_nbytes) for r in (event.output, event.input) if r is not None)
            if refs:
                self._add(_Record(seq, group_of(event), event.step, event.gen_index, refs))
        elif isinstance(event, ReplayServed):
            source = self.records.get(event.source_seq)
            if source is not None:
                self.replayed_steps.setdefault(source.group, set()).add(source.step)
        elif isinstance(event, PayloadsReleased):
            self.released.update(event.released)
            self._remove(event.record_seq)

    def _add(self, record: _Record) -> None:
        self.records[record.seq] = record
        steps = self.by_group.setdefault(record.group, {})
        if record.step not in steps:
            steps[record.step] = []
            bisect.insort(self.steps.setdefault(record.group, []), record.step)
        steps[record.step].append(record.seq)
        for digest, _ in record.refs:
            self.users.setdefault(digest, set()).add(record.seq)

    def _remove(self, seq: int) -> None:
        record = self.records.pop(seq, None)
        if record is None:
            return
        steps = self.by_group[record.group]
        steps[record.step].remove(seq)
        if not steps[record.step]:
            del steps[record.step]
            ordered = self.steps[record.group]
            del ordered[bisect.bisect_left(ordered, record.step)]
        for digest, _ in record.refs:
            users = self.users.get(digest)
            if users is not None:
                users.discard(seq)
                if not users:
                    del self.users[digest]

    # -- planning ----------------------------------------------------------------------------------
    def _protected(self, rules: Retention, group: Group, steps: Sequence[int]) -> Set[int]:
        keep = {s for s in steps if s in rules.pin} if rules.pin is not None else set()
        if rules.keep_replayed:
            keep.update(self.replayed_steps.get(group, ()))
        return keep

    def plan_group(self, rules: Retention, group: Group, warnings: List[str]) -> Tuple[Set[int], Dict[int, str]]:
        """(kept steps, released step -> reason) of one group under `rules`."""
        steps = self.steps.get(group, [])
        protected = self._protected(rules, group, steps)
        reasons: Dict[int, str] = {}
        kept = set(steps)
        if rules.keep_last is not None and len(steps) > rules.keep_last:
            window = set(steps[len(steps) - rules.keep_last:]) if rules.keep_last else set()
            for step in steps:
                if step not in window and step not in protected:
                    kept.discard(step)
                    reasons[step] = f"step {step} is not among the last {rules.keep_last} recorded steps"
        if rules.max_bytes is not None:
            uses: Dict[str, int] = {}
            sizes: Dict[str, int] = {}
            for step in kept:
                for seq in self.by_group[group][step]:
                    for digest, nbytes in self.records[seq].refs:
                        uses[digest] = uses.get(digest, 0) + 1
                        sizes[digest] = nbytes
            total = sum(sizes.values())
            for step in sorted(kept):
                if total <= rules.max_bytes:
                    break
                if step in protected:
                    continue
                kept.discard(step)
                reasons[step] = f"released to keep run {group[0]!r} mode {group[1]!r} under {rules.max_bytes} bytes"
                for seq in self.by_group[group][step]:
                    for digest, _ in self.records[seq].refs:
                        uses[digest] -= 1
                        if not uses[digest]:
                            total -= sizes[digest]
            if total > rules.max_bytes:
                warnings.append(
                    f"run {group[0]!r} mode {group[1]!r}: the steps that must stay (pinned or replayed from) "
                    f"hold {total} bytes, over max_bytes={rules.max_bytes}; raise max_bytes or pin fewer steps"
                )
        return kept, reasons

    def leftover_plan(self) -> RetentionPlan:
        """A plan that releases nothing: only the digests earlier releases named that no live record uses."""
        leftover = tuple(sorted(d for d in self.released if d not in self.users))
        return RetentionPlan(releases=(), leftover=leftover, kept_steps={}, released_bytes=0,
                             rule="none (leftovers only)")

    def plan(
        self, rules: Union[Retention, Sequence[Retention]], *, groups: Optional[Iterable[Group]] = None
    ) -> RetentionPlan:
        """What `rules` release now (see `plan_retention`); `groups` limits the groups looked at."""
        sets = (rules,) if isinstance(rules, Retention) else tuple(rules)
        if not sets or not all(isinstance(r, Retention) for r in sets):
            raise RetentionError(f"retention {rules!r} is not a Retention (or a list of them)")
        warnings: List[str] = []
        releases: List[PlannedRelease] = []
        kept_steps: Dict[Group, int] = {}
        chosen = list(self.steps) if groups is None else [g for g in groups if g in self.steps]
        released_seqs: Dict[int, str] = {}
        for group in chosen:
            matching = [r for r in sets if r.selects(group)]
            if len(matching) > 1:
                raise RetentionConflictError(
                    f"run {group[0]!r} mode {group[1]!r} is selected by {len(matching)} retention rule sets "
                    f"({'; '.join(r.describe() for r in matching)}): give each its own run or mode"
                )
            if not matching:
                continue
            rule = matching[0]
            kept, reasons = self.plan_group(rule, group, warnings)
            kept_steps[group] = len(kept)
            if not kept and reasons and not rule.allow_release_all:
                raise RetentionError(
                    f"would release every recorded step of run {group[0]!r} mode {group[1]!r} ({len(reasons)} "
                    "steps): keep some (", ("keep_last", None), ", ", ("pin", None), ", a larger ",
                    ("max_bytes", None), "), or allow it explicitly (", ("allow_release_all", True), ")",
                    rule=rule.describe(),
                )
            for step, why in reasons.items():
                for seq in self.by_group[group][step]:
                    released_seqs[seq] = why
        claimed: Set[str] = set()
        sizes: Dict[str, int] = {}
        for seq in sorted(released_seqs):
            record = self.records[seq]
            gone, stay = [], []
            for digest, nbytes in record.refs:
                if digest in claimed or any(user not in released_seqs for user in self.users.get(digest, ())):
                    stay.append(digest)
                else:
                    claimed.add(digest)
                    sizes[digest] = nbytes
                    gone.append(digest)
            releases.append(PlannedRelease(
                record_seq=seq, run=record.group[0], mode=record.group[1], step=record.step,
                gen_index=record.gen_index, released=tuple(gone), retained=tuple(stay), reason=released_seqs[seq],
                stage=record.group[2],
            ))
        leftover = tuple(sorted(d for d in self.released if d not in self.users and d not in claimed))
        return RetentionPlan(
            releases=tuple(releases), leftover=leftover, kept_steps=kept_steps,
            released_bytes=sum(sizes.values()), rule="; ".join(r.describe() for r in sets),
            warnings=tuple(warnings),
        )


def plan_retention(events: Iterable[Tuple[int, Event]], rules: Union[Retention, Sequence[Retention]]) -> RetentionPlan:
    """What `rules` would release from a journal whose log is `events` (pure: nothing is changed).

    Args:
        events: ``(seq, event)`` pairs in log order (``journal.events()``).
        rules: a `Retention`, or several selecting different groups (run, mode).

    Raises:
        RetentionError: a rule would release every step of a group without `allow_release_all`.
        RetentionConflictError: two rule sets select one group.
    """
    state = RetentionState()
    for seq, event in events:
        state.apply(seq, event)
    return state.plan(rules)
