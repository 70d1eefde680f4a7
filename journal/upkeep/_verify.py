"""Verification: every event decodes, every payload matches its digest, the index matches the log."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import attrs
import msgpack

from ..index._call_rows import KeyRuleCache, call_row
from ..events._convert import checked_body, decode_event
from ..base._errors import IntegrityError, StepJournalError, UnsafePathError
from ..events._events import (CallBypassed, CallRefused, EventsImported, GenerationRecorded, PayloadsReleased,
                              ReplayServed)
from ..index._import_map import ImportMap
from ..events._keys import LAYOUT_VERSION, gen_key, parse_gen_key
from ..payloads._file_store import FilePayloadStore
from ..payloads._payload_store import PayloadStore
from ._verify_rows import rows_problems

__all__ = ["VerifyProblem", "verify", "live_digests"]

# Salvaging the step of an undecodable event reads at most this many field names, this long.
_SALVAGE_FIELDS = 64
_SALVAGE_STR = 256
# Payloads checked per read transaction (at most this many, or about this many bytes).
_BATCH = 256
_BATCH_BYTES = 256 << 20
# Events between two progress reports.
_PROGRESS_EVERY = 256
_CALLS = (GenerationRecorded, ReplayServed, CallBypassed, CallRefused)
_CALL = object()  # `_checked_record`: a call event whose rules hold and that references no payload


@attrs.frozen
class VerifyProblem:
    """One thing `Journal.verify` found broken.

    Attributes:
        kind: ``event``, ``payload``, ``index``, ``rows`` (an audit row kept by the appends that is not
            the one the log gives), ``missing_payload``, ``released_payload`` (a payload
            retention released is still stored), ``orphan_file`` (a payload file no event names),
            ``partial_file`` (a payload file a write left half done) or ``unsafe_path`` (something other
            than the journal's own folder or plain file at a path of ``payloads/``: a link, a FIFO, a file
            in place of a folder; nothing behind it is read).
        where: the event sequence number, payload digest or index key concerned.
        steps: the train steps affected, when known.
        detail: what is wrong.
    """

    kind: str
    where: str
    steps: Tuple[int, ...]
    detail: str


def verify(
    raw_events: Iterable[Tuple[int, bytes]],
    index_items: Callable[[], List[Tuple[bytes, int]]],
    last_seq: Callable[[], int],
    payloads: PayloadStore,
    *,
    progress: Optional[Callable[[int, int], Any]] = None,
    layout: int = LAYOUT_VERSION,
    stored_rows: Optional[Callable[[], Optional[Iterable[Tuple[int, bytes]]]]] = None,
) -> List[VerifyProblem]:
    """Check the log, the step index and the payload store against each other (see `Journal.verify`).

    Three passes: the log (each event decodes; what each record uses and which index entry it implies),
    the index against what the log implies, then every stored payload against its digest.

    Args:
        raw_events: (seq, stored bytes) of every event.
        index_items: reads the ``gen`` index as (key, seq) pairs (called after the log was read).
        last_seq: reads the newest sequence number now.
        payloads: the payload store the events reference.
        progress: called as ``progress(done, total)`` in bytes checked: the events' stored bytes, then
            the payloads'. `total` grows once the log is read (the payloads' sizes are known then).
        layout: the key layout of the index on disk (1: an index without stages, read as it is, read-only).
        stored_rows: reads the rows projection as (seq, text) pairs, or None when it does not hold the log
            (`_verify_rows`: compared with the rows the log gives, when no writer appended meanwhile).
    """
    raw = list(raw_events)
    fold = _LogFold(layout)
    total = sum(len(body) for _, body in raw)
    done = 0
    for count, (seq, body) in enumerate(raw, 1):
        done += len(body)
        if progress is not None and (count % _PROGRESS_EVERY == 0 or count == len(raw)):
            progress(done, total)
        fold.add(seq, body)
    # A live writer may have appended (and indexed) events since the log was read: those are not
    # checked; an entry pointing past the end of the log still is.
    checked_up_to = raw[-1][0] if raw else 0
    rows = rows_problems(raw, stored_rows()) if stored_rows is not None else []
    del raw
    problems = fold.problems + _index_problems(fold.expected, dict(index_items()), checked_up_to, last_seq())
    if last_seq() == checked_up_to:  # a release appended meanwhile rewrites a row the log read had not seen
        problems += [VerifyProblem("rows", where, (), detail) for where, detail in rows]
    try:
        problems += _payload_problems(payloads, fold, progress, done)
        return problems + _left_files(payloads, fold, settled=lambda: last_seq() == checked_up_to)
    except UnsafePathError as exc:  # a folder of payloads/ is not the journal's own: nothing in it is read
        files = payloads.files  # the journal's payload files, the one store that raises it
        folder = files.folder if isinstance(files, FilePayloadStore) else ""
        return problems + [VerifyProblem("unsafe_path", folder, (), str(exc))]


def live_digests(bodies: Iterable[Tuple[int, bytes]]) -> set:
    """The payload digests (hex) a record of the log uses that no release released: what a whole copy of the
    journal must hold, as `verify` folds it (pulled releases translated, shared digests kept while used)."""
    fold = _LogFold(LAYOUT_VERSION)
    for seq, body in bodies:
        fold.add(seq, body)
    return fold.live()


@attrs.define
class _LogFold:
    """What the log says, event by event: the index entries it implies (`expected`), each payload's users,
    sizes and steps, the releases, and the events that do not decode (`problems`)."""

    layout: int
    problems: List[VerifyProblem] = attrs.field(factory=list)
    expected: Dict[bytes, int] = attrs.field(factory=dict)  # gen key -> seq of the record it should hold
    steps_of_digest: Dict[str, List[int]] = attrs.field(factory=dict)
    size_of_digest: Dict[str, int] = attrs.field(factory=dict)
    stored_size: Dict[str, int] = attrs.field(factory=dict)
    users: Dict[str, List[int]] = attrs.field(factory=dict)  # digest -> seqs of the records using it
    released_records: set = attrs.field(factory=set)
    released_by: Dict[str, int] = attrs.field(factory=dict)  # digest -> seq of the release that deleted it
    imports: ImportMap = attrs.field(factory=ImportMap)
    keys: KeyRuleCache = attrs.field(factory=KeyRuleCache)

    def add(self, seq: int, body: bytes) -> None:
        record = _checked_record(seq, body, self.keys)
        if record is _CALL:  # another call event that passes its class's rules: nothing to check here
            return
        if record is not None:  # a GenerationRecorded that passes every rule its class checks
            refs = [(r["digest"], r["nbytes"], r["stored_nbytes"]) for r in (record["output"], record["input"]) if r]
            self._recorded(seq, record["run"], record["mode"], record["stage"], record["step"], record["gen_index"],
                           refs, record["output"] is not None)
            return
        try:
            event = decode_event(body, seq=seq)
        except StepJournalError as exc:
            self.problems.append(VerifyProblem("event", f"#{seq}", _salvage_steps(body), str(exc)))
            return
        if isinstance(event, EventsImported):
            self.imports.marker(seq, event)
        event = self.imports.translate(seq, event)  # a pulled release names its record by this journal's seq
        if isinstance(event, GenerationRecorded):
            refs = [(r.digest, r.nbytes, r.stored_nbytes) for r in (event.output, event.input) if r is not None]
            self._recorded(seq, event.run, event.mode, event.stage, event.step, event.gen_index, refs,
                           event.output is not None)
        elif isinstance(event, PayloadsReleased):
            self.released_records.add(event.record_seq)
            self.released_by.update(dict.fromkeys(event.released, seq))
            key = gen_key(event.run, event.mode, event.step, event.gen_index, event.stage, layout=self.layout)
            if self.expected.get(key) == event.record_seq:
                del self.expected[key]

    def _recorded(self, seq: int, run: str, mode: str, stage: str, step: int, gen_index: int,
                  refs: List[Tuple[str, int, int]], has_output: bool) -> None:
        for digest, nbytes, stored in refs:
            self.steps_of_digest.setdefault(digest, []).append(step)
            self.size_of_digest[digest] = nbytes
            self.stored_size[digest] = stored
            self.users.setdefault(digest, []).append(seq)
        if has_output:
            key = gen_key(run, mode, step, gen_index, stage, layout=self.layout)
            if self.imports.replaces(seq, self.expected.get(key)):
                self.expected[key] = seq

    def steps(self, digest: str) -> Tuple[int, ...]:
        return tuple(sorted(set(self.steps_of_digest.get(digest, ()))))

    def live(self) -> set:
        """The payloads a record that was not released uses: they must be there, whole."""
        return {d for d, seqs in self.users.items() if any(s not in self.released_records for s in seqs)}


def _index_problems(expected: Dict[bytes, int], found: Dict[bytes, int], checked_up_to: int,
                    now: int) -> List[VerifyProblem]:
    """Each index entry that differs from what the log implies (entries a writer added after the log was
    read, up to `now`, are not judged)."""
    problems = []
    for key in sorted(set(expected) | set(found)):
        if checked_up_to < (found.get(key) or 0) <= now:
            continue
        if expected.get(key) != found.get(key):
            parsed = parse_gen_key(key)
            problems.append(VerifyProblem(
                "index", key.hex(), (parsed.step,) if parsed is not None else (),
                f"index has {found.get(key)}, event log says {expected.get(key)}; run `stepjournal reindex`"))
    return problems


def _payload_problems(payloads: PayloadStore, fold: _LogFold, progress: Optional[Callable[[int, int], Any]],
                      done: int) -> List[VerifyProblem]:
    """Every stored payload checked against its digest (in batches of at most `_BATCH` or about
    `_BATCH_BYTES`), in digest order; then the live payloads that are not stored."""
    live, seen = fold.live(), set()
    total = done + sum(fold.stored_size.values())
    stored: List[Tuple[int, VerifyProblem]] = []  # (place in digest order, problem): reported in that order

    def check(batch: List[Tuple[int, bytes, str]]) -> None:
        nonlocal done
        items = [(key, fold.size_of_digest.get(hexd)) for _, key, hexd in batch]
        outcomes = payloads.check_many(items)  # one read transaction, side by side, where the store declares so
        for (place, _, hexd), exc in zip(batch, outcomes):
            done += fold.stored_size.get(hexd, 0)
            if exc is None:
                continue
            if isinstance(exc, UnsafePathError):  # a payload file's name holds a link, a FIFO ...
                stored.append((place, VerifyProblem("unsafe_path", hexd, fold.steps(hexd), str(exc))))
                continue
            if not isinstance(exc, IntegrityError):
                raise exc
            detail = "bytes do not match the digest" if exc.detail == "digest mismatch" else str(exc)
            stored.append((place, VerifyProblem("payload", hexd, fold.steps(hexd), detail)))
        if progress is not None:
            progress(min(done, total), total)

    batch: List[Tuple[int, bytes, str]] = []
    batch_bytes = 0
    for place, key in enumerate(payloads.digests()):
        hexd = key.hex()
        seen.add(hexd)
        if hexd in fold.released_by and hexd not in live:
            stored.append((place, VerifyProblem(
                "released_payload", hexd, fold.steps(hexd),
                f"released by event #{fold.released_by[hexd]} but still stored; `stepjournal prune JOURNAL` (no rule: "
                "it releases nothing new) deletes it",
            )))
            continue
        batch.append((place, key, hexd))
        batch_bytes += fold.stored_size.get(hexd, 0)
        if len(batch) >= _BATCH or batch_bytes >= _BATCH_BYTES:
            check(batch)
            batch, batch_bytes = [], 0
    if batch:
        check(batch)
    if progress is not None:
        progress(total, total)
    problems = [problem for _, problem in sorted(stored, key=lambda found: found[0])]
    return problems + [VerifyProblem("missing_payload", hexd, fold.steps(hexd), "payload is missing")
                       for hexd in fold.steps_of_digest if hexd not in seen and hexd in live]


def _left_files(payloads: PayloadStore, fold: _LogFold, settled: Callable[[], bool]) -> List[VerifyProblem]:
    """The journal's payload files no event names, and half-written ones: what a record a crash cut short
    leaves. Judged only when no event was appended meanwhile (a record in flight has its file first)."""
    files = payloads.files
    if not isinstance(files, FilePayloadStore):  # None, or a store with no half-written files to leave
        return []
    partial = files.partial_files()
    orphans = [d.hex() for d in files.digests()
               if d.hex() not in fold.steps_of_digest and d.hex() not in fold.released_by]
    if not settled():
        return []
    fix = ("`stepjournal compact JOURNAL` removes it once no process has the journal open (a record being "
           "written right now has one too: verify again if a writer is running)")
    return ([VerifyProblem("orphan_file", hexd, (), f"no event names this payload file; {fix}") for hexd in orphans]
            + [VerifyProblem("partial_file", path, (), f"a payload file a write left half done; {fix}")
               for path in partial])


def _checked_record(seq: int, body: bytes, keys: KeyRuleCache) -> Any:
    """Without building the event: the fields verify reads of a `GenerationRecorded` (run, mode, stage,
    step, gen_index, output, input maps) whose map passes every rule of its class (the rules
    ``audit --json`` checks, `call_row`), `_CALL` for another call event that does, else None (the
    event is then decoded, and any problem is the decoder's)."""
    found = checked_body(body)
    if found is None or found[0] not in _CALLS:
        return None
    row = call_row(seq, found[0], found[1], keys, timed=False)
    if row is None:
        return None
    if found[0] is not GenerationRecorded:
        return _CALL
    fields = found[1]
    return {"run": row["run"], "mode": row["mode"], "stage": row["stage"], "step": row["step"],
            "gen_index": row["gen_index"], "output": fields["output"], "input": fields["input"]}


def _salvage_steps(body: Any) -> Tuple[int, ...]:
    """The step an undecodable event names, read leniently from its msgpack map (for verify's report).

    Only the top-level map's field names and its ``step`` value are built; every other value is
    skipped in place, so an event of nested empty arrays (a byte each on disk, a Python list each
    once unpacked) costs no memory, and at most `_SALVAGE_FIELDS` names are looked at.
    """
    try:
        unpacker = msgpack.Unpacker(
            raw=False, max_buffer_size=max(len(body), 1), max_str_len=_SALVAGE_STR, max_bin_len=_SALVAGE_STR,
            max_array_len=0, max_map_len=0, max_ext_len=0,
        )
        unpacker.feed(body)
        for _ in range(min(unpacker.read_map_header(), _SALVAGE_FIELDS)):
            if unpacker.unpack() == "step":
                step = unpacker.unpack()
                return (step,) if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else ()
            unpacker.skip()
    except Exception:  # damaged bytes may fail in any way; the step is then unknown
        return ()
    return ()
