"""What a pull or an import checks before it commits anything: claims, conflicts and renames.

A bundle or a remote is someone else's writing. Its segments are checked against their digests and
every event decodes through the journal's one converter (`_remote_layout`), but what the events
*claim* is checked here, over every event the import would take, before the first one is committed:

- a segment never carries provenance: an `EventsImported` in it is refused (the importer writes the
  markers itself, from what it actually pulls);
- a payload a segment lists as ``released`` is accepted as absent only where that journal's own log
  (in the target already, or in the same bundle or remote) holds a `PayloadsReleased` of the record
  that names it;
- an incoming record never changes what the target already replays: one with the run, mode, stage,
  step and index of a record the target serves, from another journal and with other bytes, is a
  conflict, refused unless the caller chose to keep the target's records (``keep="ours"``) or to
  import under other run keys (``runs=``).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple, TypeVar, Union

import attrs

from ..base._errors import ImportClaimError, ImportConflictError, JournalError
from ..events._events import (Event, EventsImported, GenerationRecorded, PayloadRef, PayloadsReleased, ReplayServed,
                              call_refs)
from ..index._import_map import ImportMap
from ..events._keys import check_key

__all__ = ["KEEP_RULES", "Renames", "IncomingChecks", "check_options", "rename", "renames_of"]

KEEP_RULES = (None, "ours")
AnEvent = TypeVar("AnEvent", bound=Event)
_SHOWN = 100  # conflicts an error names one by one

Renames = Union[None, str, Mapping[str, str]]
Key = Tuple[str, str, str, int, int]  # run, mode, stage, step, gen_index


def check_options(runs: Renames, keep: Optional[str]) -> None:
    """Refuse a rename or a keep rule that cannot be used, before anything is read.

    Raises:
        InvalidKeyError: a run key of `runs` is not a valid key.
        JournalError: `keep` is not one of the rules.
    """
    if keep not in KEEP_RULES:
        raise JournalError(f"keep={keep!r} is not a merge rule; use keep='ours' (the journal's records stay "
                           "served, the incoming ones are imported and audited) or leave it out")
    if isinstance(runs, str):
        check_key(runs, "train")
    elif runs is not None:
        if not isinstance(runs, Mapping):
            raise JournalError(f"runs={runs!r} is not a run key nor a mapping of run keys to new ones")
        for old, new in runs.items():
            check_key(old, "train")
            check_key(new, "train")


def _renamed_run(runs: Renames, run: str) -> str:
    if runs is None:
        return run
    if isinstance(runs, str):
        return runs
    return runs.get(run, run)


def rename(event: AnEvent, runs: Renames) -> AnEvent:
    """`event` with its run keys (`run`, a replay's `source_run`) renamed by `runs`; as is when none is."""
    if runs is None or isinstance(event, EventsImported):
        return event
    changes: Dict[str, str] = {}
    new = _renamed_run(runs, event.run)
    if new != event.run:
        changes["run"] = new
    if isinstance(event, ReplayServed):
        source_run = _renamed_run(runs, event.source_run)
        if source_run != event.source_run:
            changes["source_run"] = source_run
    # mypy's attrs plugin cannot evolve a union of classes by field names known only at run time.
    return attrs.evolve(event, **changes) if changes else event  # type: ignore[arg-type]


def renames_of(runs: Renames, seen: Iterable[str]) -> Dict[str, str]:
    """The renames `runs` makes of the run keys `seen`, as an `EventsImported` records them."""
    return {old: _renamed_run(runs, old) for old in sorted(set(seen)) if _renamed_run(runs, old) != old}


@attrs.frozen
class _Claim:
    segment: str
    seq: int
    digest: str
    record: bool  # named by a GenerationRecorded (a replay's output is proven by any release of it)


class IncomingChecks:
    """The checks of one import, fed every event it would take (in each source's seq order), then `finish`ed.

    Args:
        journal: the target `Journal`, or None (`verify_bundle`: the claims alone are checked).
        imports: the target's pulled blocks (`ImportMap`).
        runs: the renames the import makes (None, a run key for every incoming run, or old -> new).
        keep: None (a conflict is refused) or ``"ours"`` (the target's records stay served).
        exists: ``exists(digest)``: whether the bundle or remote holds that payload.
        several: whether more than one journal's events come in (only then are incoming keys held,
            to find two of them that conflict: memory grows with the records of such an import).
    """

    def __init__(self, journal: Any, imports: ImportMap, runs: Renames, keep: Optional[str], exists: Any,
                 *, several: bool) -> None:
        self._journal = journal
        self._imports = imports
        self._runs = runs
        self._keep = keep
        self._exists = exists
        self._empty = journal is None or journal.last_seq() == 0
        self._claims: Dict[str, List[_Claim]] = {}
        self._releases: Dict[str, List[Tuple[str, int, PayloadsReleased]]] = {}
        self._released: Dict[str, Set[Tuple[int, str]]] = {}  # source -> (record seq, digest) released there
        self._incoming: Dict[Key, Tuple[str, str, Optional[str]]] = {}  # key -> (source, output digest, input digest)
        self._several = several
        self._conflicts: List[str] = []
        self._conflict_keys: List[Key] = []
        self._count = 0
        self.seen_runs: Set[str] = set()

    @property
    def count(self) -> int:
        """How many incoming records conflict (kept for the audit only under ``keep="ours"``)."""
        return self._count

    def segment(self, source: str, name: str, events: List[Tuple[int, bytes, Any]], released: Set[str]) -> None:
        """Check the events of segment `name` of `source` that the import takes, with its released list."""
        for seq, _raw, event in events:
            if isinstance(event, EventsImported):
                raise ImportClaimError(
                    f"{name} of journal {source} holds an EventsImported marker (event #{seq}, claiming events "
                    f"{event.source_first}-{event.source_last} of journal {event.source[:40]} follow it): provenance "
                    "is written by the importer, never taken from a segment; nothing was imported",
                    segment=name, claim=f"EventsImported at #{seq}")
            self.seen_runs.add(event.run)
            if isinstance(event, PayloadsReleased):
                if event.record_seq >= seq:
                    raise ImportClaimError(
                        f"{name} of journal {source} holds a release (event #{seq}) of event #{event.record_seq}, "
                        "which does not come before it: a release follows its record; nothing was imported",
                        segment=name, claim=f"PayloadsReleased at #{seq}")
                self._releases.setdefault(source, []).append((name, seq, event))
                self._released.setdefault(source, set()).update((event.record_seq, d) for d in event.released)
            if isinstance(event, GenerationRecorded) and event.output is not None:
                self._record(source, seq, rename(event, self._runs), event.output)
            for ref in call_refs(event):
                if ref.digest in released:
                    self._claims.setdefault(source, []).append(
                        _Claim(name, seq, ref.digest, isinstance(event, GenerationRecorded)))

    def _record(self, source: str, seq: int, event: GenerationRecorded, output: PayloadRef) -> None:
        key = (event.run, event.mode, event.stage, event.step, event.gen_index)
        digests = (output.digest, event.input_digest)
        if not self._empty:
            held = self._journal.lookup(event.step, event.gen_index, mode=event.mode, run=event.run, stage=event.stage)
            if held is not None:
                origin = self._imports.origin(held.seq)
                same = origin is not None and origin[0] == source
                if not same and (held.event.output.digest, held.event.input_digest) != digests:
                    self._conflict(key, f"event #{held.seq} here", source, seq)
        if not self._several:
            return
        other = self._incoming.get(key)
        if other is not None and other[0] != source and (other[1], other[2]) != digests:
            self._conflict(key, f"journal {other[0]}", source, seq)
        if other is None or other[0] == source:
            self._incoming[key] = (source,) + digests

    def _conflict(self, key: Key, held: str, source: str, seq: int) -> None:
        if len(self._conflicts) < _SHOWN:
            run, mode, stage, step, index = key
            self._conflicts.append(f"{run}/{mode}/{stage} step {step} index {index} ({held}; incoming: journal "
                                   f"{source} event #{seq})")
            self._conflict_keys.append(key)
        self._count += 1

    def finish(self, record: Any = None) -> None:
        """Raise what the events fed in do not allow; return when the import may go ahead.

        Args:
            record: ``record(source, seq)``: the event `seq` of journal `source`, from the import or the
                journal (None when neither holds it), to check each release against the record it names.

        Raises:
            ImportClaimError: a released payload no release of that journal names (the first one).
            ImportConflictError: incoming records would change what the target replays (and keep is None).
            JournalError: one new run key was given for an import that holds several runs.
        """
        if record is not None:
            for source, releases in self._releases.items():
                for name, seq, event in releases:
                    self._check_release(source, name, seq, event, record(source, event.record_seq))
        if self._claims:
            known = self._released_here()
            for source, claims in self._claims.items():
                proofs = self._released.get(source, set()) | known.get(source, set())
                digests = {d for _s, d in proofs}
                for claim in claims:
                    proven = (claim.seq, claim.digest) in proofs if claim.record else claim.digest in digests
                    if not proven and not self._exists(claim.digest):
                        raise ImportClaimError(
                            f"{claim.segment} of journal {source} lists payload {claim.digest[:16]}… of event "
                            f"#{claim.seq} as released, but no release of that journal names it, and the payload "
                            "is not there: the record would come without its bytes; nothing was imported",
                            segment=claim.segment, claim=f"payload {claim.digest} released")
        if isinstance(self._runs, str) and len(self.seen_runs) > 1:
            runs = ", ".join(sorted(self.seen_runs)[:10])
            raise JournalError(f"the import holds several runs ({runs}); one new key for all would merge them: "
                               "name each, as OLD=NEW")
        count = self._count
        if count and self._keep != "ours":
            shown = "; ".join(self._conflicts[:10]) + (f"; and {count - 10} more" if count > 10 else "")
            raise ImportConflictError(
                f"{count} incoming record(s) hold calls this journal already serves, with other bytes: {shown}. "
                "Nothing was imported. Import them under another run key (--as NEW or --as OLD=NEW; runs= in "
                "Python), or keep this journal's records served and import the others for the audit only "
                "(--keep ours; keep='ours')", conflicts=tuple(self._conflict_keys), count=count)

    @staticmethod
    def _check_release(source: str, name: str, seq: int, event: PayloadsReleased, named: Any) -> None:
        """A release names a record of its journal, of its own call, and only that record's payloads."""
        problem = None
        if not isinstance(named, GenerationRecorded):
            problem = "which is not a recorded call there" if named is not None else "which neither holds"
        elif (named.run, named.mode, named.stage, named.step, named.gen_index) != (
                event.run, event.mode, event.stage, event.step, event.gen_index):
            problem = f"a record of another call (step {named.step} index {named.gen_index})"
        else:
            refs = {r.digest for r in (named.output, named.input) if r is not None}
            if not refs.issuperset(event.released) or not refs.issuperset(event.retained):
                problem = "whose payloads are not the ones it lists"
        if problem:
            raise ImportClaimError(
                f"{name} of journal {source} holds a release (event #{seq}, step {event.step}) of event "
                f"#{event.record_seq}, {problem}: the release would delete or hide what it does not own; "
                "nothing was imported", segment=name, claim=f"PayloadsReleased at #{seq}")

    def _released_here(self) -> Dict[str, Set[Tuple[int, str]]]:
        """(source record seq, digest) of every release the target already pulled, by source journal."""
        found: Dict[str, Set[Tuple[int, str]]] = {}
        if self._journal is None:
            return found
        for seq, event in self._journal.events(types=[PayloadsReleased]):
            origin = self._imports.origin(seq)
            if origin is not None:
                found.setdefault(origin[0], set()).update((event.record_seq, d) for d in event.released)
        return found

