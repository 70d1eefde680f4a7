"""`push`, `pull` and `clone`: a journal's events and payloads replicated to object storage and back.

The remote layout (under the URL's prefix; docs/sharing.md says more):

- ``stepjournal-remote.json``: ``{"kind": "stepjournal-remote", "format": 1}``, written once. A
  remote of a higher format is refused (`RemoteFormatError`).
- ``payloads/<hex digest>``: each payload's stored bytes, content-addressed (the same objects an
  `ObjectPayloadStore` on that URL writes).
- ``segments/<journal id>/<first seq>-<last seq>.msgpack``: an append-only run of one journal's own
  events, ``{"format": 1, "source": id, "events": [[seq, stored event bytes], ...]}``, never rewritten.
- ``heads/<journal id>.json``: which segments of that journal exist (name, seq range, size, BLAKE3),
  how far its log was pushed, and the digest of the event there.

A push writes the payloads a segment references, then the segment, then the head that lists it: a
push killed anywhere leaves objects no head names yet, which the next push writes again (same
names); nothing is listed before what it needs exists. A pull trusts nothing it reads: sizes are
bounded, every segment and payload is checked against its digest, every event decodes through the
journal's one converter, and the events of a run come in with their payloads and an `EventsImported`
(their provenance) in one write transaction. A second push or pull sends or fetches nothing.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import attrs

from ._convert import decode_event, encode_event
from ._digest import digest_bytes
from ._errors import IntegrityError, JournalError, PayloadMissingError, RemoteError
from ._eventlog import EventLog
from ._import_map import ImportMap
from ._events import EventsImported, PayloadsReleased
from ._journal import Journal
from ._keys import META_CREATED
from ._log import get_logger
from ._object_store import ObjectPayloadStore, Remote
from ._payload_store import LmdbPayloadStore
from ._payloads import blob_intact
from ._projections import Projections
from ._remote_layout import (_MAX_HEAD, REMOTE_FORMAT, _head, _head_of, _manifest, _segment_events, call_refs,
                             encode_segment, new_head)

__all__ = ["REMOTE_FORMAT", "PushReport", "PullReport", "push", "pull", "clone", "journal_id"]

log = get_logger(__name__)

_SEGMENT_EVENTS = 4096
_BATCH_PAYLOAD_BYTES = 1 << 28  # payload bytes per pulled transaction (and pushed segment)
Progress = Optional[Callable[[str, int, int], None]]


@attrs.frozen
class PushReport:
    """What one `push` sent: events, segments, payloads, bytes; `last_seq` is how far the log is pushed."""

    source: str
    events_sent: int
    segments_sent: int
    payloads_sent: int
    bytes_sent: int
    last_seq: int


@attrs.frozen
class PullReport:
    """What one `pull` (or `clone`) brought in: events, payloads and their bytes, from which journals."""

    events_pulled: int
    payloads_fetched: int
    bytes_fetched: int
    sources: Tuple[str, ...]


def journal_id(journal: Journal) -> str:
    """A journal's id on a remote: a digest of its creation time and its first event (stable, no write)."""
    store = journal._live()
    with store.read() as txn:
        created = bytes(txn.get(META_CREATED, db=store.db("meta")) or b"")
    first = next(iter(journal.raw_events()), None)
    if first is None:
        raise JournalError(f"journal {journal.path!r} has no events to share")
    return digest_bytes(b"stepjournal journal id\0" + created + b"\0" + bytes(first[1]))[:16].hex()


def released_digests(journal: Journal) -> Set[str]:
    """The digests whose payloads retention released from `journal` (its `PayloadsReleased` events)."""
    return {d for _seq, event in journal.events(types=[PayloadsReleased]) for d in event.released}


def local_payload(store: Any, ref: Any) -> Tuple[Optional[bytes], Optional[str]]:
    """(stored bytes, None) of the payload `ref` names in a journal's LMDB table, checked against its
    digest; (None, ``"missing"`` or ``"damaged"``) when it cannot be sent."""
    key = bytes.fromhex(ref.digest)
    with store.read() as txn:
        blob = txn.get(key, db=store.db("payloads"))
        blob = bytes(blob) if blob is not None else None
    if blob is None:
        return None, "missing"
    return (blob, None) if blob_intact(blob, key, ref.nbytes) else (None, "damaged")


# -- push ------------------------------------------------------------------------------------------
def push(journal: Any, url: str, *, progress: Progress = None, options: Optional[Dict[str, Any]] = None,
         segment_events: int = _SEGMENT_EVENTS) -> PushReport:
    """Send what `journal` (a path or an open `Journal`) recorded since its last push to `url`.

    Only the journal's own events are sent (events it pulled from another journal stay with theirs),
    in segments of at most `segment_events` events.

    Raises:
        RemoteError: the remote failed, or holds another history for this journal (it diverged).
        RemoteConflictError: another push of this journal to `url` ran meanwhile (its head moved);
            what this one wrote is harmless, and pushing again continues from there.
        RemoteFormatError: the remote was written by a newer stepjournal.
        IntegrityError: a local payload is missing or damaged (names the step); nothing of its
            segment was listed.
    """
    if not isinstance(journal, Journal):
        with Journal(journal, readonly=True) as opened:
            return push(opened, url, progress=progress, options=options, segment_events=segment_events)
    remote = Remote(url, options=options)
    _manifest(remote, create=True)
    source = journal_id(journal)
    with remote.push_lock(f"heads/{source}.lock"):
        return _push(journal, remote, source, progress, segment_events)


def _push(journal: Journal, remote: Remote, source: str, progress: Progress, segment_events: int) -> PushReport:
    data, etag = remote.get_tagged(f"heads/{source}.json", limit=_MAX_HEAD)
    head = _head_of(remote, source, data) or new_head(source)
    if head["last_seq"]:
        raw = journal._log.get_raw(head["last_seq"])
        if raw is None or digest_bytes(bytes(raw)).hex() != head.get("last_digest"):
            raise RemoteError(
                f"{remote.url} holds another history for journal {source} at event #{head['last_seq']}: "
                "this journal diverged from the one pushed (a copied folder recorded on?); push it to another URL"
            )
    total = journal.last_seq()
    if head["last_seq"] >= total:
        return PushReport(source, 0, 0, 0, 0, head["last_seq"])
    known: Set[str] = {k[len("payloads/"):] for k in remote.keys("payloads/")}
    sent = {"events": 0, "segments": 0, "payloads": 0, "bytes": 0}
    lmdb_payloads = journal._live()

    released = released_digests(journal)

    def flush(events: List[Tuple[int, bytes, Any]], through: Tuple[int, bytes]) -> None:
        skipped: Set[str] = set()
        for seq, _raw, event in events:
            for ref in call_refs(event):
                if ref.digest in known:
                    continue
                blob, problem = local_payload(lmdb_payloads, ref)
                if problem == "missing" and ref.digest in released:
                    skipped.add(ref.digest)  # retention released it: the event goes, its payload cannot
                    continue
                if problem:
                    raise IntegrityError(
                        f"payload {ref.digest[:16]}… of event #{seq} (step {event.step}) is "
                        f"{problem} in {journal.path!r}; run `stepjournal verify`", step=event.step)
                remote.put(f"payloads/{ref.digest}", blob)
                known.add(ref.digest)
                sent["payloads"] += 1
                sent["bytes"] += len(blob)
        if events:
            name, body, entry = encode_segment(source, [(seq, raw) for seq, raw, _ in events], skipped)
            remote.put(name, body)
            head["segments"].append(entry)
            sent["events"] += len(events)
            sent["segments"] += 1
            sent["bytes"] += len(body)
        head["last_seq"], head["last_digest"] = through[0], digest_bytes(through[1]).hex()
        nonlocal etag  # last: it lists what now exists, and only if no other push moved it meanwhile
        etag = remote.put_if(f"heads/{source}.json", json.dumps(head).encode(), etag=etag)
        if progress is not None:
            progress("push", through[0], total)

    pending: List[Tuple[int, bytes, Any]] = []
    pending_bytes, skip = 0, 0
    last: Optional[Tuple[int, bytes]] = None
    for seq, raw in journal.raw_events(since=head["last_seq"]):
        raw = bytes(raw)
        event = decode_event(raw, seq=seq)
        last = (seq, raw)
        if isinstance(event, EventsImported):
            skip = event.source_last - event.source_first + 1  # pulled events go back to no one
            continue
        if skip:
            skip -= 1
            continue
        pending.append((seq, raw, event))
        pending_bytes += sum(r.stored_nbytes for r in call_refs(event) if r.digest not in known)
        if len(pending) >= segment_events or pending_bytes >= _BATCH_PAYLOAD_BYTES:
            flush(pending, last)
            pending, pending_bytes = [], 0
    if last is not None and (pending or last[0] > head["last_seq"]):
        flush(pending, last)
    report = PushReport(source, sent["events"], sent["segments"], sent["payloads"], sent["bytes"], head["last_seq"])
    log.info("journal_pushed", url=remote.url, source=source, events=report.events_sent, payloads=report.payloads_sent)
    return report


# -- pull ------------------------------------------------------------------------------------------
def _pulled_through(journal: Journal) -> Dict[str, int]:
    done: Dict[str, int] = {}
    for _seq, event in journal.events(types=[EventsImported]):
        done[event.source] = max(done.get(event.source, 0), event.source_last)
    return done


def _runs(events: List[Tuple[int, bytes, Any]]) -> Iterator[List[Tuple[int, bytes, Any]]]:
    """Contiguous runs of source seqs (one `EventsImported` each), at most `_BATCH_PAYLOAD_BYTES` of payloads."""
    run: List[Tuple[int, bytes, Any]] = []
    size = 0
    for item in events:
        extra = sum(r.stored_nbytes for r in call_refs(item[2]))
        if run and (item[0] != run[-1][0] + 1 or size + extra > _BATCH_PAYLOAD_BYTES):
            yield run
            run, size = [], 0
        run.append(item)
        size += extra
    if run:
        yield run


def _commit_run(journal: Journal, remote: Any, objects: Any, source: str,
                run: List[Tuple[int, bytes, Any]], released: Set[str], imports: ImportMap) -> Tuple[int, int]:
    store = journal._live()
    local = LmdbPayloadStore(store)
    blobs: Dict[bytes, bytes] = {}
    bad: Dict[str, Set[int]] = {}
    for _seq, _raw, event in run:
        for ref in call_refs(event):
            key = bytes.fromhex(ref.digest)
            if key in blobs or local.has(key):
                continue
            try:
                blobs[key] = objects.fetch(key, nbytes=ref.nbytes)[0]
            except PayloadMissingError:
                if ref.digest not in released:  # retention released it before the push: not sent, not damage
                    bad.setdefault(f"{ref.digest[:16]}… (PayloadMissingError)", set()).add(event.step)
            except IntegrityError as exc:  # missing, oversized, truncated or damaged: never stored
                bad.setdefault(f"{ref.digest[:16]}… ({type(exc).__name__})", set()).add(event.step)
    if bad:
        steps = sorted({s for found in bad.values() for s in found})
        raise IntegrityError(
            f"{len(bad)} payload(s) of journal {source} in {remote.url} are missing or damaged: "
            f"{', '.join(sorted(bad))}; affected steps {steps}; events {run[0][0]}-{run[-1][0]} were not pulled",
            step=steps[0], detail="remote payload")
    marker = EventsImported(source=source, origin=remote.url, source_first=run[0][0], source_last=run[-1][0],
                            ts=time.time())
    bodies = [encode_event(marker)] + [raw for _s, raw, _e in run]
    events = [marker] + [e for _s, _r, e in run]
    items = list(blobs.items())

    def fn(txn: Any) -> None:
        local.put_in(txn, items)
        for seq, event in zip(EventLog.append_in(txn, store, bodies), events):
            if isinstance(event, EventsImported):
                imports.marker(seq, event)
            Projections.apply_in(txn, store, seq, imports.translate(seq, event))

    with journal._lock:
        store.write(fn, needed=sum(len(b) for b in bodies) + sum(len(b) for _k, b in items), buffers=True)
    return len(items), sum(len(b) for _k, b in items)


def pull(url: str, journal: Any, *, progress: Progress = None, options: Optional[Dict[str, Any]] = None) -> PullReport:
    """Bring every journal's events pushed to `url` (and their payloads) into `journal` (a path or a `Journal`).

    Events already pulled are not fetched again; a pull that was killed resumes after the last run it
    committed. The journal's own events (pushed from it) are not pulled back.

    Raises:
        RemoteError: the remote failed, is not a stepjournal remote, or misses a segment.
        RemoteFormatError: the remote was written by a newer stepjournal.
        IntegrityError: a segment or payload is damaged or missing (names the affected steps); the
            events that need it were not pulled.
    """
    if not isinstance(journal, Journal):
        with Journal(journal, session=False) as opened:
            return pull(url, opened, progress=progress, options=options)
    remote = Remote(url, options=options)
    return pull_from(remote, ObjectPayloadStore(url, options=options), journal, progress=progress)


def pull_from(remote: Any, objects: Any, journal: Journal, *, progress: Progress = None) -> PullReport:
    """`pull` from a remote-shaped source (`Remote`, or a bundle's reader) and its payload objects."""
    _manifest(remote, create=False)
    own = journal_id(journal) if journal.last_seq() else None
    done = _pulled_through(journal)
    imports = ImportMap.of(journal.events(types=[EventsImported]))
    sources = sorted(k[len("heads/"):-len(".json")] for k in remote.keys("heads/") if k.endswith(".json"))
    counts = {"events": 0, "payloads": 0, "bytes": 0}
    for source in sources:
        if source == own:
            continue
        head = _head(remote, source)
        if head is None:
            continue
        segments = [s for s in head["segments"] if s["last"] > done.get(source, 0)]
        total = sum(s.get("count", 0) for s in segments)
        for seg in segments:
            listed, released = _segment_events(remote, source, seg)
            events = [e for e in listed if e[0] > done.get(source, 0)]
            for run in _runs(events):
                fetched, nbytes = _commit_run(journal, remote, objects, source, run, released, imports)
                done[source] = run[-1][0]
                counts["events"] += len(run)
                counts["payloads"] += fetched
                counts["bytes"] += nbytes
                if progress is not None:
                    progress(f"pull {source[:8]}", counts["events"], total)
    report = PullReport(counts["events"], counts["payloads"], counts["bytes"], tuple(s for s in sources if s != own))
    log.info("journal_pulled", url=remote.url, events=report.events_pulled, payloads=report.payloads_fetched)
    return report


def clone(url: str, path: Any, *, progress: Progress = None, options: Optional[Dict[str, Any]] = None) -> PullReport:
    """A new journal at `path` holding everything pushed to `url` (`pull` into a folder that has none).

    Raises:
        JournalError: `path` already holds something.
    """
    path = os.fspath(path)
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise JournalError(f"cannot clone into {path!r}: it exists and is not an empty folder; use pull")
    return pull(url, path, progress=progress, options=options)
