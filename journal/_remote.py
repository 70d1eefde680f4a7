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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple, TypeVar

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
from ._object_client import Remote
from ._object_store import ObjectPayloadStore
from ._payload_store import LmdbPayloadStore
from ._payloads import blob_intact
from ._projections import Projections
from ._remote_layout import (_MAX_HEAD, REMOTE_FORMAT, _head, _head_of, _manifest, _segment_events, call_refs,
                             encode_segment, new_head)
from ._undo import undone_on_failure

__all__ = ["REMOTE_FORMAT", "PushReport", "PullReport", "push", "pull", "clone", "journal_id"]

log = get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_SEGMENT_EVENTS = 4096
_BATCH_PAYLOAD_BYTES = 1 << 28  # payload bytes per pushed segment
# Payload bytes per pulled transaction: the next run is fetched while one commits, so a pull holds
# two of these (each may pass it by one payload); smaller runs overlap better, each costs a sync.
_PULL_RUN_BYTES = 1 << 26
# The most journals a pull reads the heads of: more is a remote to split (or not one stepjournal wrote).
_MAX_SOURCES = 100_000
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


class Released:
    """`released_digests` of a journal, read from its log the first time a digest is asked about.

    A push or bundle asks only when a payload is missing locally, so a journal retention never
    pruned is not scanned for releases at all.
    """

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._found: Optional[Set[str]] = None

    def __contains__(self, digest: object) -> bool:
        if self._found is None:
            self._found = released_digests(self._journal)
        return digest in self._found


_END = object()


def one_ahead(items: Iterable[T], work: Callable[[T], R]) -> Iterator[Tuple[T, R]]:
    """(item, work(item)) in order, `work` of the next item running on a worker thread while the
    caller handles this one: at most two results are held at once. What `work` raises is raised
    here, when its item comes up. `work` shares nothing with the caller, and in a pull it reads no
    LMDB (the commit it overlaps holds the environment's lock)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepjournal-remote") as pool:
        it = iter(items)
        current = next(it, _END)
        future = pool.submit(work, current) if current is not _END else None
        while current is not _END:
            following = next(it, _END)
            result = future.result()
            if following is not _END:
                future = pool.submit(work, following)
            yield current, result
            current = following


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
    # Payloads already on the remote (another journal's, or written through an ObjectPayloadStore) are
    # found by a HEAD of each one this push would send, not by listing them all: a push costs what it
    # sends, however many payloads the remote holds.
    known: Set[str] = set()
    sent = {"events": 0, "segments": 0, "payloads": 0, "bytes": 0}
    lmdb_payloads = journal._live()

    released = Released(journal)

    def flush(events: List[Tuple[int, bytes, Any]], through: Tuple[int, bytes]) -> None:
        skipped: Set[str] = set()
        wanted: Dict[str, Tuple[Any, int, int]] = {}
        for seq, _raw, event in events:
            for ref in call_refs(event):
                if ref.digest not in known:
                    wanted.setdefault(ref.digest, (ref, seq, event.step))
        # The next payload is looked up on the remote, and read and checked against its digest when
        # it is not there (None when it is), while this one is sent (one ahead).
        def read(item: Tuple[Any, int, int]) -> Optional[Tuple[Optional[bytes], Optional[str]]]:
            return None if remote.exists(f"payloads/{item[0].digest}") else local_payload(lmdb_payloads, item[0])

        for (ref, seq, step), found in one_ahead(wanted.values(), read):
            if found is None:
                known.add(ref.digest)
                continue
            blob, problem = found
            if problem == "missing" and ref.digest in released:
                skipped.add(ref.digest)  # retention released it: the event goes, its payload cannot
                continue
            if problem:
                raise IntegrityError(
                    f"payload {ref.digest[:16]}… of event #{seq} (step {step}) is "
                    f"{problem} in {journal.path!r}; run `stepjournal verify`", step=step)
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
    """Contiguous runs of source seqs (one `EventsImported` each), at most `_PULL_RUN_BYTES` of payloads."""
    run: List[Tuple[int, bytes, Any]] = []
    size = 0
    for item in events:
        extra = sum(r.stored_nbytes for r in call_refs(item[2]))
        if run and (item[0] != run[-1][0] + 1 or size + extra > _PULL_RUN_BYTES):
            yield run
            run, size = [], 0
        run.append(item)
        size += extra
    if run:
        yield run


@attrs.frozen
class _Run:
    """One pulled transaction to be: a journal's contiguous events and the payloads still to fetch."""

    source: str
    total: int  # events of this source this pull brings (for progress)
    events: List[Tuple[int, bytes, Any]]
    released: Set[str]
    wanted: Dict[str, Tuple[Any, List[int]]]  # digest -> (ref, the steps naming it)


def _fetch_run(objects: Any, run: _Run) -> Tuple[Dict[bytes, Any], Dict[str, Set[int]]]:
    """(fetched blobs by key, what is missing or damaged -> affected steps): network and digests only."""
    blobs: Dict[bytes, Any] = {}
    bad: Dict[str, Set[int]] = {}
    for digest, (ref, steps) in run.wanted.items():
        key = bytes.fromhex(digest)
        try:
            blobs[key] = objects.fetch(key, nbytes=ref.nbytes)[0]
        except PayloadMissingError:
            if digest not in run.released:  # retention released it before the push: not sent, not damage
                bad.setdefault(f"{digest[:16]}… (PayloadMissingError)", set()).update(steps)
        except IntegrityError as exc:  # missing, oversized, truncated or damaged: never stored
            bad.setdefault(f"{digest[:16]}… ({type(exc).__name__})", set()).update(steps)
    return blobs, bad


def _commit_run(journal: Journal, remote: Any, run: _Run, blobs: Dict[bytes, Any], bad: Dict[str, Set[int]],
                imports: ImportMap) -> Tuple[int, int]:
    events_in = run.events
    if bad:
        steps = sorted({s for found in bad.values() for s in found})
        raise IntegrityError(
            f"{len(bad)} payload(s) of journal {run.source} in {remote.url} are missing or damaged: "
            f"{', '.join(sorted(bad))}; affected steps {steps}; events {events_in[0][0]}-{events_in[-1][0]} "
            "were not pulled", step=steps[0], detail="remote payload")
    store = journal._live()
    local = LmdbPayloadStore(store)
    marker = EventsImported(source=run.source, origin=remote.url, source_first=events_in[0][0],
                            source_last=events_in[-1][0], ts=time.time())
    bodies = [encode_event(marker)] + [raw for _s, raw, _e in events_in]
    events = [marker] + [e for _s, _r, e in events_in]
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

    A pull creates nothing on the remote (not even a missing ``file://`` folder). A pull that fails
    into a journal it created removes it (`undone_on_failure`); an existing journal keeps the runs
    committed before the failure.

    Raises:
        RemoteError: the remote failed, is not a stepjournal remote, or misses a segment.
        RemoteFormatError: the remote was written by a newer stepjournal.
        IntegrityError: a segment or payload is damaged or missing (names the affected steps); the
            events that need it were not pulled.
    """
    if not isinstance(journal, Journal):
        with undone_on_failure(journal), Journal(journal, session=False) as opened:
            return pull(url, opened, progress=progress, options=options)
    remote = Remote(url, options=options, create=False)
    return pull_from(remote, ObjectPayloadStore._over(remote), journal, progress=progress)


def _planned(remote: Any, journal: Journal, sources: List[str], done: Dict[str, int]) -> Iterator[_Run]:
    """The runs a pull commits, in order, each with the payloads the journal lacks (reads LMDB: the
    caller's thread). A payload an earlier run fetches is not fetched again."""
    local = LmdbPayloadStore(journal._live())
    scheduled: Set[str] = set()
    for source in sources:
        head = _head(remote, source)
        if head is None:
            continue
        segments = [s for s in head["segments"] if s["last"] > done.get(source, 0)]
        total = sum(s.get("count", 0) for s in segments)
        for seg in segments:
            listed, released = _segment_events(remote, source, seg)
            for events in _runs([e for e in listed if e[0] > done.get(source, 0)]):
                wanted: Dict[str, Tuple[Any, List[int]]] = {}
                for _seq, _raw, event in events:
                    for ref in call_refs(event):
                        if ref.digest in wanted:
                            wanted[ref.digest][1].append(event.step)
                        elif ref.digest not in scheduled and not local.has(bytes.fromhex(ref.digest)):
                            wanted[ref.digest] = (ref, [event.step])
                scheduled.update(wanted)
                yield _Run(source, total, events, released, wanted)


def pull_from(remote: Any, objects: Any, journal: Journal, *, progress: Progress = None) -> PullReport:
    """`pull` from a remote-shaped source (`Remote`, or a bundle's reader) and its payload objects.

    The payloads of the next run are fetched and checked on a worker thread while this one commits
    (its durable write releases the GIL): two runs in memory at most.
    """
    _manifest(remote, create=False)
    own = journal_id(journal) if journal.last_seq() else None
    done = _pulled_through(journal)
    imports = ImportMap.of(journal.events(types=[EventsImported]))
    listed = remote.keys("heads/", most=_MAX_SOURCES)
    sources = sorted(k[len("heads/"):-len(".json")] for k in listed if k.endswith(".json"))
    sources = [s for s in sources if s != own]
    counts = {"events": 0, "payloads": 0, "bytes": 0}
    fetch = lambda run: _fetch_run(objects, run)  # noqa: E731
    for run, (blobs, bad) in one_ahead(_planned(remote, journal, sources, done), fetch):
        fetched, nbytes = _commit_run(journal, remote, run, blobs, bad, imports)
        counts["events"] += len(run.events)
        counts["payloads"] += fetched
        counts["bytes"] += nbytes
        if progress is not None:
            progress(f"pull {run.source[:8]}", counts["events"], run.total)
    report = PullReport(counts["events"], counts["payloads"], counts["bytes"], tuple(sources))
    log.info("journal_pulled", url=remote.url, events=report.events_pulled, payloads=report.payloads_fetched)
    return report


def clone(url: str, path: Any, *, progress: Progress = None, options: Optional[Dict[str, Any]] = None) -> PullReport:
    """A new journal at `path` holding everything pushed to `url` (`pull` into a folder that has none).

    A clone that fails leaves nothing: the folder it created is removed (an empty folder given stays
    empty), so the corrected clone can run into the same path.

    Raises:
        JournalError: `path` already holds something.
    """
    path = os.fspath(path)
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise JournalError(f"cannot clone into {path!r}: it exists and is not an empty folder; use pull")
    return pull(url, path, progress=progress, options=options)
