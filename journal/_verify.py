"""Verification: every event decodes, every payload matches its digest, the index matches the log."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import attrs
import msgpack

from ._convert import decode_event
from ._errors import IntegrityError, StepJournalError
from ._events import EventsImported, GenerationRecorded, PayloadsReleased
from ._import_map import ImportMap
from ._keys import LAYOUT_VERSION, gen_prefix, parse_gen_key
from ._payload_store import PayloadStore

__all__ = ["VerifyProblem", "verify"]

# Salvaging the step of an undecodable event reads at most this many field names, this long.
_SALVAGE_FIELDS = 64
_SALVAGE_STR = 256


@attrs.frozen
class VerifyProblem:
    """One thing `Journal.verify` found broken.

    Attributes:
        kind: ``event``, ``payload``, ``index``, ``missing_payload`` or ``released_payload`` (a payload
            retention released is still stored).
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
) -> List[VerifyProblem]:
    """Check the log, the step index and the payload store against each other (see `Journal.verify`).

    Args:
        raw_events: (seq, stored bytes) of every event.
        index_items: reads the ``gen`` index as (key, seq) pairs (called after the log was read).
        last_seq: reads the newest sequence number now.
        payloads: the payload store the events reference.
        progress: called as ``progress(done, total)`` as events are checked.
        layout: the key layout of the index on disk (1: a 0.1.0 index read as it is, read-only).
    """
    problems: List[VerifyProblem] = []
    expected: Dict[bytes, int] = {}
    steps_of_digest: Dict[str, List[int]] = {}
    size_of_digest: Dict[str, int] = {}
    users: Dict[str, List[int]] = {}  # digest -> seqs of the records using it
    released_records: set = set()
    released_by: Dict[str, int] = {}  # digest -> seq of the release that deleted it
    imports = ImportMap()
    raw = list(raw_events)
    total = len(raw)
    for done, (seq, body) in enumerate(raw, 1):
        try:
            event = decode_event(body, seq=seq)
        except StepJournalError as exc:
            problems.append(VerifyProblem("event", f"#{seq}", _salvage_steps(body), str(exc)))
            continue
        if isinstance(event, EventsImported):
            imports.marker(seq, event)
        event = imports.translate(seq, event)  # a pulled release names its record by this journal's seq
        if isinstance(event, GenerationRecorded):
            for ref in (event.output, event.input):
                if ref is not None:
                    steps_of_digest.setdefault(ref.digest, []).append(event.step)
                    size_of_digest[ref.digest] = ref.nbytes
                    users.setdefault(ref.digest, []).append(seq)
            if event.output is not None:
                prefix = gen_prefix(event.run, event.mode, event.stage, layout=layout)
                expected[prefix + event.step.to_bytes(8, "big") + event.gen_index.to_bytes(4, "big")] = seq
        elif isinstance(event, PayloadsReleased):
            released_records.add(event.record_seq)
            released_by.update(dict.fromkeys(event.released, seq))
            prefix = gen_prefix(event.run, event.mode, event.stage, layout=layout)
            key = prefix + event.step.to_bytes(8, "big") + event.gen_index.to_bytes(4, "big")
            if expected.get(key) == event.record_seq:
                del expected[key]
        if progress is not None:
            progress(done, total)
    found = dict(index_items())
    # A live writer may have appended (and indexed) events since the log was read: those are not
    # checked; an entry pointing past the end of the log still is.
    checked_up_to, now = (raw[-1][0] if raw else 0), last_seq()
    for key in sorted(set(expected) | set(found)):
        if checked_up_to < (found.get(key) or 0) <= now:
            continue
        if expected.get(key) != found.get(key):
            parsed = parse_gen_key(key)
            problems.append(
                VerifyProblem(
                    "index",
                    key.hex(),
                    (parsed.step,) if parsed is not None else (),
                    f"index has {found.get(key)}, event log says {expected.get(key)}; run `stepjournal reindex`",
                )
            )
    # A payload is live while a record that was not released uses it: it must be there, whole.
    live = {d for d, seqs in users.items() if any(s not in released_records for s in seqs)}
    seen = set()
    for key in payloads.digests():
        hexd = key.hex()
        seen.add(hexd)
        if hexd in released_by and hexd not in live:
            problems.append(VerifyProblem(
                "released_payload", hexd, tuple(sorted(set(steps_of_digest.get(hexd, ())))),
                f"released by event #{released_by[hexd]} but still stored; run `stepjournal prune` again to delete it",
            ))
            continue
        steps = tuple(sorted(set(steps_of_digest.get(hexd, ()))))
        try:
            payloads.check(key, nbytes=size_of_digest.get(hexd))
        except IntegrityError as exc:
            detail = "bytes do not match the digest" if exc.detail == "digest mismatch" else str(exc)
            problems.append(VerifyProblem("payload", hexd, steps, detail))
    for hexd, steps_list in steps_of_digest.items():
        if hexd not in seen and hexd in live:
            problems.append(
                VerifyProblem("missing_payload", hexd, tuple(sorted(set(steps_list))), "payload is missing")
            )
    return problems


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
