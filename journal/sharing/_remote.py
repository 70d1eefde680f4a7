"""`push`: a journal's events and payloads replicated to object storage (`_pull` brings them back).

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
names); nothing is listed before what it needs exists. A second push sends nothing. Also here, for
`_pull` and `_bundle`: a journal's id on a remote, the payloads retention released, and reading
one item ahead on a worker thread.
"""

from __future__ import annotations

import json
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple, TypeVar, Union

import attrs

from ..events._convert import decode_event
from ..base._digest import digest_bytes
from ..base._errors import IntegrityError, JournalError, RemoteError
from ..events._events import Event, EventsImported, PayloadRef, PayloadsReleased, call_refs
from .._journal import Journal
from ..events._keys import META_CREATED
from ..base._log import get_logger
from ..base._progress import Progress, report_progress
from ..payloads._object_client import Remote
from ..payloads._payloads import blob_intact
from ._remote_layout import MAX_HEAD, REMOTE_FORMAT, check_manifest, encode_segment, new_head, parse_head
from ._remotes_config import resolve_remote
from ..storage._appender import appender_of

__all__ = ["REMOTE_FORMAT", "PushReport", "push", "journal_id", "Released", "RemotePayloads", "in_parallel",
           "local_payload", "one_ahead", "pushed_head", "segments_to_push", "payloads_of"]

log = get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_SEGMENT_EVENTS = 4096
_BATCH_PAYLOAD_BYTES = 1 << 28  # payload bytes per pushed segment
_SENDS_AT_ONCE = 8  # payloads a push sends at once
# A push that looks up this many payloads or more lists the remote's payloads once instead of a HEAD of each,
# when the remote holds at most `_LISTED_AT_MOST` of them (one page of an S3 listing, or two).
_LIST_FROM = 8
_LISTED_AT_MOST = 1000


@attrs.frozen
class PushReport:
    """What one `push` sent: events, segments, payloads, bytes; `last_seq` is how far the log is pushed."""

    source: str
    events_sent: int
    segments_sent: int
    payloads_sent: int
    bytes_sent: int
    last_seq: int


def journal_id(journal: Journal) -> str:
    """A journal's id on a remote: a digest of its creation time and its first event (stable, no write)."""
    store = appender_of(journal).store
    with store.read() as txn:
        created = bytes(txn.get(META_CREATED, db=store.db("meta")) or b"")
    first = next(iter(journal.raw_events()), None)
    if first is None:
        raise JournalError(f"journal {journal.path!r} has no events to share")
    return digest_bytes(b"stepjournal journal id\0" + created + b"\0" + bytes(first[1]))[:16].hex()


def released_digests(journal: Journal) -> Set[str]:
    """The digests whose payloads retention released from `journal` (its `PayloadsReleased` events)."""
    return {d for _seq, event in journal.events(types=[PayloadsReleased]) if isinstance(event, PayloadsReleased)
            for d in event.released}  # each event is one: the narrowing is for the type


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


def one_ahead(items: Iterable[T], work: Callable[[T], R]) -> Iterator[Tuple[T, R]]:
    """(item, work(item)) in order, `work` of the next item running on a worker thread while the
    caller handles this one: at most two results are held at once. What `work` raises is raised
    here, when its item comes up. `work` shares nothing with the caller, and in a pull it reads no
    LMDB (the commit it overlaps holds the environment's lock)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepjournal-remote") as pool:
        ahead: Optional[Tuple[T, Future[R]]] = None  # the item worked on, and its work
        for following in items:
            if ahead is None:
                ahead = (following, pool.submit(work, following))
                continue
            current, future = ahead
            result = future.result()
            ahead = (following, pool.submit(work, following))
            yield current, result
        if ahead is not None:
            yield ahead[0], ahead[1].result()


def in_parallel(items: List[T], work: Callable[[T], R], workers: int) -> Iterator[Tuple[T, R]]:
    """``(item, work(item))`` for each of `items`, in their order, up to `workers` of them worked on at
    once on threads. An error is raised in its item's place once the running ones have finished, and
    the items not started yet never are (nor when the caller stops reading)."""
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="stepjournal-remote")
    try:
        futures = [(item, pool.submit(work, item)) for item in items]
        for item, future in futures:
            yield item, future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class RemotePayloads:
    """Which payloads a remote already holds, as one push (or `remote_status`, for it) asks.

    Found by a HEAD of each, or, once the push looks up `_LIST_FROM` or more at once (`prepare`), by one
    listing of ``payloads/`` when the remote holds at most `_LISTED_AT_MOST`: a push costs what it sends (one
    or two listing pages more on a larger remote), however many payloads the remote holds. A payload another
    push writes after the listing is sent again, which is harmless: content-addressed, the same bytes."""

    def __init__(self, remote: Remote) -> None:
        self._remote = remote
        self._listed: Optional[Set[str]] = None
        self._tried = False

    def prepare(self, count: int) -> None:
        """Before `count` payloads are looked up at once (in this thread; `holds` may then run on several). A
        listing that fails leaves each to its HEAD, which says what is wrong with the remote if anything is."""
        if not self._tried and count >= _LIST_FROM:
            self._tried = True
            try:
                self._listed = self._remote.few_keys("payloads/", _LISTED_AT_MOST)
            except RemoteError as exc:
                log.info("push_looks_up_payloads_one_by_one", url=self._remote.url, reason=str(exc))

    def holds(self, digest: str) -> bool:
        key = f"payloads/{digest}"
        return key in self._listed if self._listed is not None else self._remote.exists(key)


def local_payload(payloads: Any, ref: PayloadRef) -> Tuple[Optional[Union[bytes, mmap.mmap]], Optional[str]]:
    """(stored bytes, None) of the payload `ref` names in a journal's own store (`Appender.local`),
    checked against its digest (bytes, or a payload file's read-only mapping); (None, ``"missing"`` or
    ``"damaged"``) when it cannot be sent."""
    key = bytes.fromhex(ref.digest)
    blob = payloads.stored(key)
    if blob is None:
        return None, "missing"
    return (blob, None) if blob_intact(blob, key, ref.nbytes) else (None, "damaged")


# -- push ------------------------------------------------------------------------------------------
def push(journal: Union[str, "os.PathLike[str]", Journal], url: Optional[str] = None, *, progress: Progress = None,
         options: Optional[Dict[str, Any]] = None, segment_events: int = _SEGMENT_EVENTS) -> PushReport:
    """Send what `journal` (a path or an open `Journal`) recorded since its last push to `url`.

    `url` is a URL, a plain path (a folder), the name of one of the journal's remotes, or None: its
    default remote (`add_remote`). Only the journal's own events are sent (events it pulled from
    another journal stay with theirs), in segments of at most `segment_events` events. `progress` is told
    after each segment: ``progress("push", events done, events in all)``, and the bytes sent so far when it
    asks for them (`stepjournal.base._progress`; docs/sharing.md, "Progress").

    Raises:
        RemoteError: the remote failed, or holds another history for this journal (it diverged); its
            subclasses say why and what to do (docs/sharing.md, "When the object store refuses").
        RemoteConflictError: another push of this journal to `url` ran meanwhile (its head moved);
            what this one wrote is harmless, and pushing again continues from there.
        RemoteFormatError: the remote was written by a newer stepjournal.
        RemoteConfigError: no URL given and no default remote, or an unknown name.
        IntegrityError: a local payload is missing or damaged (names the step); nothing of its
            segment was listed.
    """
    if not isinstance(journal, Journal):
        with Journal(journal, readonly=True) as opened:
            return push(opened, url, progress=progress, options=options, segment_events=segment_events)
    remote = Remote(resolve_remote(journal, url), options=options)
    check_manifest(remote, create=True)
    source = journal_id(journal)
    with remote.push_lock(f"heads/{source}.lock"):
        return _push(journal, remote, source, progress, segment_events)


def pushed_head(journal: Journal, remote: Optional[Remote], source: str) -> Tuple[Dict[str, Any], Optional[str]]:
    """(the head of `source` on `remote`, its version): what a push continues from, a new head when
    nothing was pushed (`remote` None: nothing is there yet).

    Raises:
        RemoteError: the remote holds another history for this journal (it diverged).
    """
    if remote is None:
        return new_head(source), None
    data, etag = remote.get_tagged(f"heads/{source}.json", limit=MAX_HEAD)
    head = parse_head(remote, source, data) or new_head(source)
    if head["last_seq"]:
        seq, raw = next(iter(journal.raw_events(since=head["last_seq"] - 1)), (None, b""))
        if seq != head["last_seq"] or digest_bytes(bytes(raw)).hex() != head.get("last_digest"):
            raise RemoteError(
                f"{remote.url} holds another history for journal {source} at event #{head['last_seq']}: "
                "this journal diverged from the one pushed (a copied folder recorded on?); push it to another URL"
            )
    return head, etag


Batch = Tuple[List[Tuple[int, bytes, Any]], Tuple[int, bytes]]


def segments_to_push(journal: Journal, since: int, known: Set[str], segment_events: int = _SEGMENT_EVENTS
                     ) -> Iterator[Batch]:
    """The segments a push after event `since` sends, in order: (the journal's own events, the last
    event they take the head to), cut at `segment_events` events or at the payload bytes a segment
    carries (payloads in `known`, which the caller adds to as it goes, not counted). Pulled events
    are passed over; a last batch with no event of its own still moves the head on."""
    pending: List[Tuple[int, bytes, Any]] = []
    pending_bytes, through = 0, since
    last: Optional[Tuple[int, bytes]] = None
    for seq, raw, event in _events_after(journal, since):
        last = (seq, raw)
        if event is None:
            continue
        pending.append((seq, raw, event))
        pending_bytes += sum(r.stored_nbytes for r in call_refs(event) if r.digest not in known)
        if len(pending) >= segment_events or pending_bytes >= _BATCH_PAYLOAD_BYTES:
            yield pending, last
            pending, pending_bytes, through = [], 0, seq
    if last is not None and (pending or last[0] > through):
        yield pending, last


def _events_after(journal: Journal, since: int) -> Iterator[Tuple[int, bytes, Any]]:
    """(seq, stored bytes, event) of every event after `since`, the event None where it is not the journal's
    own (an `EventsImported` and the pulled events it covers go back to no one)."""
    skip = 0
    for seq, raw in journal.raw_events(since=since):
        raw = bytes(raw)
        event: Optional[Event] = decode_event(raw, seq=seq)
        if isinstance(event, EventsImported):
            skip = event.source_last - event.source_first + 1
            event = None
        elif skip:
            skip -= 1
            event = None
        yield seq, raw, event


def payload_bytes_after(journal: Journal, since: int) -> int:
    """The stored bytes of the payloads the journal's own events after `since` name, each once: what a push
    sends at most (the progress bar's "of"; those the remote holds already, or retention released, are not
    sent). One read of the events to push, before the push reads them again."""
    sizes: Dict[str, int] = {}
    for _seq, _raw, event in _events_after(journal, since):
        if event is not None:
            sizes.update((ref.digest, ref.stored_nbytes) for ref in call_refs(event))
    return sum(sizes.values())


def payloads_of(events: List[Tuple[int, bytes, Any]], known: Set[str]) -> Dict[str, Tuple[Any, int, int]]:
    """digest -> (ref, seq, step) of the first event naming it, for each payload of `events` not in `known`."""
    wanted: Dict[str, Tuple[Any, int, int]] = {}
    for seq, _raw, event in events:
        for ref in call_refs(event):
            if ref.digest not in known:
                wanted.setdefault(ref.digest, (ref, seq, event.step))
    return wanted


def _push(journal: Journal, remote: Remote, source: str, progress: Progress, segment_events: int) -> PushReport:
    head, etag = pushed_head(journal, remote, source)
    total = journal.last_seq()
    if head["last_seq"] >= total:
        return PushReport(source, 0, 0, 0, 0, head["last_seq"])
    # Payloads already on the remote (another journal's, or written through an ObjectPayloadStore) are not sent
    # again (`RemotePayloads`: a HEAD of each, or one listing of a remote that holds few).
    on_remote = RemotePayloads(remote)
    known: Set[str] = set()
    sent = {"events": 0, "segments": 0, "payloads": 0, "bytes": 0}
    own_payloads = appender_of(journal).local
    # All the push moves, for the bar: its payloads at most, less those found not to need sending, and
    # each segment as it goes (`report_progress`'s moved_total).
    planned = {"bytes": payload_bytes_after(journal, head["last_seq"]) if progress is not None else 0}

    released = Released(journal)

    def flush(events: List[Tuple[int, bytes, Any]], through: Tuple[int, bytes]) -> None:
        skipped: Set[str] = set()
        # Each payload is looked up on the remote and, when it is not there, read, checked against its
        # digest and sent; several at once (`in_parallel`), since a request's latency, not the
        # bandwidth, bounds a push of many payloads. None: it was there; else (bytes sent, problem).
        def send(item: Tuple[Any, int, int]) -> Optional[Tuple[int, Optional[str]]]:
            ref = item[0]
            if on_remote.holds(ref.digest):
                return None
            blob, problem = local_payload(own_payloads, ref)
            if blob is None:  # missing or damaged: `problem` says which
                return 0, problem
            remote.put(f"payloads/{ref.digest}", blob)
            return len(blob), None

        wanted = list(payloads_of(events, known).values())
        on_remote.prepare(len(wanted))
        for (ref, seq, step), found in in_parallel(wanted, send, _SENDS_AT_ONCE):
            if found is None:
                known.add(ref.digest)
                planned["bytes"] -= ref.stored_nbytes  # on the remote already: not sent
                continue
            size, problem = found
            if problem == "missing" and ref.digest in released:
                skipped.add(ref.digest)  # retention released it: the event goes, its payload cannot
                planned["bytes"] -= ref.stored_nbytes
                continue
            if problem:  # what was sent meanwhile is harmless: content-addressed, and no segment lists it
                raise IntegrityError(
                    f"payload {ref.digest[:16]}… of event #{seq} (step {step}) is "
                    f"{problem} in {journal.path!r}; run `stepjournal verify`", step=step)
            known.add(ref.digest)
            sent["payloads"] += 1
            sent["bytes"] += size
        if events:
            name, body, entry = encode_segment(source, [(seq, raw) for seq, raw, _ in events], skipped)
            remote.put(name, body)
            head["segments"].append(entry)
            sent["events"] += len(events)
            sent["segments"] += 1
            sent["bytes"] += len(body)
            planned["bytes"] += len(body)
        head["last_seq"], head["last_digest"] = through[0], digest_bytes(through[1]).hex()
        nonlocal etag  # last: it lists what now exists, and only if no other push moved it meanwhile
        etag = remote.put_if(f"heads/{source}.json", json.dumps(head).encode(), etag=etag)
        report_progress(progress, "push", through[0], total, moved=sent["bytes"],
                        moved_total=max(planned["bytes"], sent["bytes"]))

    for events, through in segments_to_push(journal, head["last_seq"], known, segment_events):
        flush(events, through)
    report = PushReport(source, sent["events"], sent["segments"], sent["payloads"], sent["bytes"], head["last_seq"])
    log.info("journal_pushed", url=remote.url, source=source, events=report.events_sent, payloads=report.payloads_sent)
    return report
