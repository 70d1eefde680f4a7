"""`pull` and `clone`: the events and payloads pushed to a remote (or held in a bundle), brought in.

A pull trusts nothing it reads: sizes are bounded, every segment and payload is checked against its
digest, every event decodes through the journal's one converter, and what the events claim
(provenance, releases, the calls they record) is checked before the first one is committed
(`_import_checks`). The events of a run then come in with their payloads and an `EventsImported`
(their provenance, written here) in one write transaction; a pulled release deletes the bytes it
releases in that transaction, as a local prune does. Events already pulled are known by (journal,
seq), so selections come in in any order, and a second pull fetches nothing.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

import attrs
import lmdb

from ..events._convert import encode_event
from ..base._errors import IntegrityError, JournalError, PayloadMissingError, StepJournalError
from ..events._events import Event, EventsImported, PayloadsReleased, call_refs
from ._import_checks import IncomingChecks, Renames, check_options, rename, renames_of
from ..index._import_map import ImportMap
from .._journal import Journal
from ..base._log import get_logger
from ..base._progress import Progress, report_progress
from ..payloads._object_client import Remote, remote_url
from ..payloads._object_store import ObjectPayloadStore
from ..payloads._payload_store import LmdbPayloadStore
from ..index._projections import Projections
from ..upkeep._release import catch_up_in, delete_released
from ._remote import in_parallel, journal_id, one_ahead
from ._remote_layout import RemoteReader, check_manifest, event_in, read_head, read_segment
from ._remotes_config import add_remote, list_remotes, resolve_remote
from ..upkeep._retention import RetentionState
from ..base._secrets import public_url
from ..base._undo import undone_on_failure
from ..storage._appender import appender_of
from ..storage._store import Store, open_in_this_process

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["PullReport", "pull", "pull_from", "clone", "incoming", "planned_runs", "PlannedRun", "written_by_others"]

log = get_logger("stepjournal.sharing._remote")

# Payload bytes per pulled transaction: the next run is fetched while one commits, so a pull holds
# two of these (each may pass it by one payload); smaller runs overlap better, each costs a sync.
_PULL_RUN_BYTES = 1 << 26
_FETCHES_AT_ONCE = 8  # payloads a pull fetches at once
# The most journals a pull reads the heads of: more is a remote to split (or not one stepjournal wrote).
_MAX_SOURCES = 100_000


@attrs.frozen
class PullReport:
    """What one `pull` (or `clone`) brought in: events, payloads and their bytes, from which journals."""

    events_pulled: int
    payloads_fetched: int
    bytes_fetched: int
    sources: Tuple[str, ...]
    kept: int = 0  # incoming records of calls this journal serves, imported for the audit only (keep="ours")



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
class PlannedRun:
    """One pulled transaction to be: a journal's contiguous events and the payloads still to fetch."""

    source: str
    total: int  # events of this source this pull brings (for progress)
    events: List[Tuple[int, bytes, Any]]
    released: Set[str]
    wanted: Dict[str, Tuple[Any, List[int]]]  # digest -> (ref, the steps naming it)


def _fetch_run(objects: ObjectPayloadStore, run: PlannedRun) -> Tuple[Dict[bytes, Any], Dict[str, Set[int]]]:
    """(fetched blobs by key, what is missing or damaged -> affected steps): network and digests only,
    several payloads at once (`in_parallel`: a request's latency, not the bandwidth, bounds many)."""
    blobs: Dict[bytes, Any] = {}
    bad: Dict[str, Set[int]] = {}

    def fetch(digest: str) -> Tuple[Any, Optional[Exception]]:
        try:
            return objects.fetch(bytes.fromhex(digest), nbytes=run.wanted[digest][0].nbytes)[0], None
        except IntegrityError as exc:  # PayloadMissingError is one: told apart below
            return None, exc

    for digest, (blob, error) in in_parallel(list(run.wanted), fetch, _FETCHES_AT_ONCE):
        steps = run.wanted[digest][1]
        if error is None:
            blobs[bytes.fromhex(digest)] = blob
        elif isinstance(error, PayloadMissingError):
            if digest not in run.released:  # retention released it before the push: not sent, not damage
                bad.setdefault(f"{digest[:16]}… (PayloadMissingError)", set()).update(steps)
        else:  # oversized, truncated or damaged: never stored
            bad.setdefault(f"{digest[:16]}… ({type(error).__name__})", set()).update(steps)
    return blobs, bad


class _PulledReleases:
    """Deletes, in the pull's transaction, the bytes a pulled `PayloadsReleased` released, as a local
    prune does: each digest no live record of this journal still uses (its own records included).

    The fold of the log it decides from is built at the first pulled release and caught up after;
    a transaction that did not commit makes it start again.
    """

    def __init__(self) -> None:
        self._state: Optional[RetentionState] = None
        self._dirty = False
        self._files: List[bytes] = []  # payload files to delete once the transaction commits
        self._after = 0  # the seq of the transaction's last event
        self._local: Optional[LmdbPayloadStore] = None
        self._store: Optional[Store] = None

    def delete_in(self, txn: lmdb.Transaction[Any], store: Store, local: LmdbPayloadStore,
                  appended: List[Tuple[int, Event]]) -> None:
        self._files = []  # a transaction that did not commit deleted nothing
        releases = [e for _, e in appended if isinstance(e, PayloadsReleased)]
        if not releases:
            return
        if self._state is None or self._dirty:
            self._state = RetentionState()
        self._dirty = True
        catch_up_in(txn, store, self._state)  # this run's events included: the transaction sees them
        gone = {d for e in releases for d in e.released if d not in self._state.users}
        self._files = local.delete_in(txn, [bytes.fromhex(d) for d in sorted(gone)])
        self._local, self._store, self._after = local, store, appended[-1][0]

    def committed(self) -> None:
        self._dirty = False
        files, self._files = self._files, []
        if files and self._local is not None and self._store is not None:  # `delete_in` sets both
            delete_released(self._store, self._local, files, self._after)


def _commit_run(journal: Journal, remote: RemoteReader, run: PlannedRun, blobs: Dict[bytes, Any],
                bad: Dict[str, Set[int]],
                imports: ImportMap, runs: Renames, renamed: Dict[str, str],
                releases: _PulledReleases) -> Tuple[int, int]:
    events_in = run.events
    if bad:
        steps = sorted({s for found in bad.values() for s in found})
        raise IntegrityError(
            f"{len(bad)} payload(s) of journal {run.source} in {remote.url} are missing or damaged: "
            f"{', '.join(sorted(bad))}; affected steps {steps}; events {events_in[0][0]}-{events_in[-1][0]} "
            "were not pulled", step=steps[0], detail="remote payload")
    appender = appender_of(journal)
    store, local = appender.store, appender.local
    marker = EventsImported(source=run.source, origin=remote.url, source_first=events_in[0][0],
                            source_last=events_in[-1][0], ts=time.time(),
                            runs={o: n for o, n in renamed.items() if any(getattr(e, "run", None) == o
                                                                          for _s, _r, e in events_in)})
    events = [marker] + [rename(e, runs) for _s, _r, e in events_in]
    bodies = [encode_event(marker)] + [raw if new is old else encode_event(new)
                                       for (_s, raw, old), new in zip(events_in, events[1:])]
    items = list(blobs.items())
    # What the journal held when the run was planned, so not fetched: still there when it commits?
    held = {bytes.fromhex(r.digest) for _s, _r, e in events_in for r in call_refs(e)
            if r.digest not in run.released} - blobs.keys()

    def fn(txn: lmdb.Transaction[Any]) -> None:
        gone = sorted(key.hex() for key in held if not local.has_in(txn, key))
        if gone:  # released by another process (a prune) since the run was planned
            raise IntegrityError(
                f"{len(gone)} payload(s) this journal held when the pull began were released meanwhile "
                f"({gone[0][:16]}…); events {events_in[0][0]}-{events_in[-1][0]} of journal {run.source} were not "
                "pulled: pull again to fetch them", detail="released meanwhile")
        local.put_in(txn, items)
        appended = Projections.append_and_project_in(txn, store, events, bodies, imports=imports)
        releases.delete_in(txn, store, local, appended)

    appender.write(fn, needed=sum(len(b) for b in bodies) + sum(len(b) for _k, b in items), buffers=True,
                   after=releases.committed)
    return len(items), sum(len(b) for _k, b in items)


def pull(url: Optional[str], journal: Union[str, "os.PathLike[str]", Journal], *, progress: Progress = None,
         options: Optional[Dict[str, Any]] = None, runs: Renames = None, keep: Optional[str] = None) -> PullReport:
    """Bring every journal's events pushed to `url` (and their payloads) into `journal` (a path or a `Journal`).

    `url` is a URL, a plain path (a folder), the name of one of the journal's remotes, or None: its
    default remote (`add_remote`).

    Events already pulled are not fetched again, whatever order they came in; a pull that was
    killed resumes after the last run it committed. The journal's own events (pushed from it) are
    not pulled back. Every event it would take is checked before the first is committed
    (docs/sharing.md, "What an import checks").

    A pull creates nothing on the remote (not even a missing ``file://`` folder). A pull that fails
    into a journal it created removes it (`undone_on_failure`), unless another process has it open or
    recorded into it meanwhile; an existing journal keeps the runs committed before the failure.

    Args:
        progress: told after each run of events committed: ``progress("pull <source>", events done, events of
            that source)``, and the bytes fetched so far when it asks for them (docs/sharing.md, "Progress").
        runs: import under other run keys: a run key for every incoming run, or ``{old: new}``.
        keep: ``"ours"``: an incoming record of a call this journal already serves (other bytes, another
            journal) is imported for the audit, and this journal's record stays served.

    Raises:
        RemoteError: the remote failed, is not a stepjournal remote, or misses a segment.
        RemoteFormatError: the remote was written by a newer stepjournal.
        RemoteConfigError: no URL given and no default remote, or an unknown name.
        IntegrityError: a segment or payload is damaged or missing (names the affected steps); the
            events that need it were not pulled.
        ImportClaimError: a segment claims provenance or a release its journal's log does not prove.
        ImportConflictError: incoming records would change what this journal replays (keep is None).
    """
    check_options(runs, keep)
    url = resolve_remote(journal, url)  # before a journal it creates: no name to resolve there then
    if not isinstance(journal, Journal):
        with undone_on_failure(journal, kept=written_by_others), Journal(journal, session=False) as opened:
            return pull(url, opened, progress=progress, options=options, runs=runs, keep=keep)
    remote = Remote(url, options=options, create=False)
    return pull_from(remote, ObjectPayloadStore.over(remote), journal, progress=progress, runs=runs, keep=keep)


def written_by_others(path: str) -> bool:
    """Whether another process has the journal at `path` open, or it holds an event no import brought (a
    record of another process while a pull or import that created the journal ran): then a failing pull
    leaves it (`undone_on_failure`)."""
    folder = os.path.realpath(path)
    if open_in_this_process(folder) or _locked_elsewhere(folder):
        return True
    covered = 0  # events left of the last `EventsImported`'s run
    try:
        with Journal(path, readonly=True) as journal:
            for _seq, event in journal.events():
                if covered:
                    covered -= 1
                elif isinstance(event, EventsImported):
                    covered = event.source_last - event.source_first + 1
                else:
                    return True
    except StepJournalError:
        return True  # it cannot be told: kept
    return False


def _locked_elsewhere(folder: str) -> bool:
    """Whether another process has the journal at `folder` open: LMDB holds a lock on the first byte of its
    ``lock.mdb`` while it does (as `compact` finds). Only for a journal this process does not hold open:
    closing the probe drops every lock this process holds on the file."""
    if fcntl is None:  # pragma: no cover
        return False
    try:
        fd = os.open(os.path.join(folder, "lock.mdb"), os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


_CACHED_SEGMENT_BYTES = 1 << 23  # segments the checks read are kept (decoded) for the pull up to this many bytes


def _new_segments(remote: RemoteReader, sources: List[str],
                  imports: ImportMap) -> List[Tuple[str, List[Dict[str, Any]]]]:
    """Per source, the segments of its head holding an event not pulled yet (in seq order: a head
    listing them otherwise is refused when read, `_remote_layout`)."""
    out = []
    for source in sources:
        head = read_head(remote, source)
        if head is None:
            continue
        segments = [s for s in head["segments"] if not imports.covers(source, s["first"], s["last"])]
        if segments:
            out.append((source, segments))
    return out


def incoming(remote: RemoteReader,
             journal: Journal) -> Tuple[List[str], ImportMap, List[Tuple[str, List[Dict[str, Any]]]]]:
    """What a pull from `remote` into `journal` starts from: (the journals pushed there but this one,
    this journal's `ImportMap`, per journal the segments holding an event not pulled yet). Reads the
    manifest, the listing of ``heads/`` and the heads; nothing else.

    Raises:
        RemoteError: not a stepjournal remote, or one listing more journals than a pull reads.
        RemoteFormatError: the remote was written by a newer stepjournal.
    """
    check_manifest(remote, create=False)
    own = journal_id(journal) if journal.last_seq() else None
    imports = ImportMap.of(journal.events(types=[EventsImported]))
    listed = remote.keys("heads/", most=_MAX_SOURCES)
    sources = sorted(k[len("heads/"):-len(".json")] for k in listed if k.endswith(".json"))
    sources = [s for s in sources if s != own]
    return sources, imports, _new_segments(remote, sources, imports)


def _checked(remote: RemoteReader, journal: Journal, wanted: List[Tuple[str, List[Dict[str, Any]]]],
             imports: ImportMap, runs: Renames, keep: Optional[str],
             sizes: Dict[str, int]) -> Tuple[IncomingChecks, Dict[str, Any]]:
    """Read every new segment once and check all it would bring (`IncomingChecks`) before anything is
    committed; returns the checks and the segments kept for the pull (up to `_CACHED_SEGMENT_BYTES`), and
    fills `sizes` with the stored size of every payload the new events name (but those released)."""
    checks = IncomingChecks(journal, imports, runs, keep, lambda d: remote.exists(f"payloads/{d}"),
                            several=len(wanted) > 1)
    cache: Dict[str, Any] = {}
    held = 0
    for source, segments in wanted:
        for seg in segments:
            listed, released = read_segment(remote, source, seg)
            new = [e for e in listed if imports.local(source, e[0]) is None]
            checks.segment(source, seg["name"], new, released)
            sizes.update((r.digest, r.stored_nbytes) for e in new for r in call_refs(e[2]) if r.digest not in released)
            if held + seg["nbytes"] <= _CACHED_SEGMENT_BYTES:
                cache[seg["name"]] = (listed, released)
                held += seg["nbytes"]
    checks.finish(_record_reader(remote, journal, wanted, imports, cache))
    return checks, cache


def _record_reader(remote: RemoteReader, journal: Journal, wanted: List[Tuple[str, List[Dict[str, Any]]]],
                   imports: ImportMap, cache: Dict[str, Any]) -> Callable[[str, int], Any]:
    """``record(source, seq)``: event `seq` of journal `source`, from the journal when it was pulled
    already, else from the segment of the import that holds it (kept, or read again); None when
    neither has it. Releases are few: each names one record."""
    segments = {source: segs for source, segs in wanted}

    def record(source: str, seq: int) -> Any:
        local = imports.local(source, seq)
        if local is not None:
            return journal.event(local)
        return event_in(remote, source, segments.get(source, ()), seq, cache)

    return record


def planned_runs(remote: RemoteReader, journal: Journal, wanted: List[Tuple[str, List[Dict[str, Any]]]],
                 imports: ImportMap, cache: Dict[str, Any]) -> Iterator[PlannedRun]:
    """The runs a pull commits, in order, each with the payloads the journal lacks (reads LMDB: the
    caller's thread). A payload an earlier run fetches is not fetched again."""
    local = appender_of(journal).local
    scheduled: Set[str] = set()
    for source, segments in wanted:
        total = sum(s.get("count", 0) for s in segments)
        for seg in segments:
            listed, released = cache.pop(seg["name"], None) or read_segment(remote, source, seg)
            for events in _runs([e for e in listed if imports.local(source, e[0]) is None]):
                wanted_refs: Dict[str, Tuple[Any, List[int]]] = {}
                for _seq, _raw, event in events:
                    for ref in call_refs(event):
                        if ref.digest in wanted_refs:
                            wanted_refs[ref.digest][1].append(event.step)
                        elif ref.digest not in scheduled and not local.has(bytes.fromhex(ref.digest)):
                            wanted_refs[ref.digest] = (ref, [event.step])
                scheduled.update(wanted_refs)
                yield PlannedRun(source, total, events, released, wanted_refs)


def pull_from(remote: RemoteReader, objects: ObjectPayloadStore, journal: Journal, *, progress: Progress = None,
              runs: Renames = None, keep: Optional[str] = None) -> PullReport:
    """`pull` from a remote-shaped source (`Remote`, or a bundle's reader) and its payload objects.

    The payloads of the next run are fetched and checked on a worker thread while this one commits
    (its durable write releases the GIL): two runs in memory at most.
    """
    check_options(runs, keep)
    sources, imports, wanted = incoming(remote, journal)
    sizes: Dict[str, int] = {}
    checks, cache = _checked(remote, journal, wanted, imports, runs, keep, sizes)
    local = appender_of(journal).local
    to_fetch = sum(n for d, n in sizes.items() if not local.has(bytes.fromhex(d)))  # the bar's "of"
    renamed = renames_of(runs, checks.seen_runs)
    releases = _PulledReleases()
    counts = {"events": 0, "payloads": 0, "bytes": 0}
    fetch = lambda run: _fetch_run(objects, run)  # noqa: E731
    for run, (blobs, bad) in one_ahead(planned_runs(remote, journal, wanted, imports, cache), fetch):
        fetched, nbytes = _commit_run(journal, remote, run, blobs, bad, imports, runs, renamed, releases)
        counts["events"] += len(run.events)
        counts["payloads"] += fetched
        counts["bytes"] += nbytes
        report_progress(progress, f"pull {run.source[:8]}", counts["events"], run.total, moved=counts["bytes"],
                        moved_total=max(to_fetch, counts["bytes"]))
    report = PullReport(counts["events"], counts["payloads"], counts["bytes"], tuple(sources), checks.count)
    log.info("journal_pulled", url=remote.url, events=report.events_pulled, payloads=report.payloads_fetched,
             kept=report.kept)
    return report


def clone(url: str, path: Union[str, "os.PathLike[str]"], *, progress: Progress = None,
          options: Optional[Dict[str, Any]] = None, runs: Renames = None, keep: Optional[str] = None) -> PullReport:
    """A new journal at `path` holding everything pushed to `url` (`pull` into a folder that has none).

    `url` is a URL or a plain path (a folder); there is no journal yet whose remote names could be
    used. The new journal names it ``origin``, its default remote (without any user info or query),
    before anything is transferred: a clone interrupted (Ctrl-C, a kill) is a journal that ``pull``
    with no remote resumes, and a second clone into the folder is told so.

    A clone that fails leaves nothing: the folder it created is removed (an empty folder given stays
    empty), so the corrected clone can run into the same path. An interrupted one (a
    `KeyboardInterrupt`, a kill) keeps what it committed.

    Raises:
        JournalError: `path` already holds something (a journal: pull into it instead, which resumes an
            interrupted clone).
    """
    path = os.fspath(path)
    if os.path.lexists(path) and (not os.path.isdir(path) or os.listdir(path)):  # a link to nowhere too
        raise JournalError(_not_empty(path))
    url = remote_url(os.fspath(url))
    remote = Remote(url, options=options, create=False)
    with undone_on_failure(path, kept=written_by_others):  # a remote that is not there leaves no journal
        Journal(path, session=False).close()
        add_remote(path, "origin", public_url(url), default=True)
        log.info("clone_named_origin", path=path, url=public_url(url))
        with Journal(path, session=False) as opened:
            return pull_from(remote, ObjectPayloadStore.over(remote), opened, progress=progress, runs=runs, keep=keep)


def _not_empty(path: str) -> str:
    """Why a clone refuses `path`, and what to run instead: a journal there (an interrupted clone, or one
    brought up to date by pulling) is pulled into."""
    if not os.path.isfile(os.path.join(path, "data.mdb")):
        return f"cannot clone into {path!r}: it exists and is not an empty folder; use pull into a journal"
    named = next((r for r in list_remotes(path) if r.default), None) if os.path.isdir(path) else None
    source = f" from its default remote {named.name!r} ({named.url})" if named else ""
    return (f"cannot clone into {path!r}: it holds a journal already (an interrupted clone resumes there); use "
            f"pull{source}: stepjournal pull {path}")
