"""`remote_status`: what a `push` would send to a remote and a `pull` would fetch from it, now.

Nothing is sent, written or committed: it reads the remote's manifest, its heads (and, for the
pull side, the segments not pulled yet) and the journal's log, and asks push's and pull's own
planning (`segments_to_push` / `payloads_of`, `incoming` / `planned_runs`) what they would do, so
it cannot tell another story than the verbs. A payload a push would send is looked up on the
remote as the push looks it up (`RemotePayloads`).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Set, Tuple, Union

import attrs

from ..base._errors import RemoteMissingError
from .._journal import Journal
from ..payloads._object_client import Remote, remote_url
from ._pull import incoming, planned_runs
from ._remote import Released, RemotePayloads, journal_id, payloads_of, pushed_head, segments_to_push
from ._remote_layout import MANIFEST, encode_segment
from ._remotes_config import resolve_remote
from ..base._secrets import public_url
from ..storage._appender import appender_of

__all__ = ["RemoteStatus", "remote_status"]


@attrs.frozen
class RemoteStatus:
    """What `push` would send to `url` and `pull` would fetch from it (`remote_status`).

    Attributes:
        url: the remote, without user info or query.
        to_push_events, to_push_payloads, to_push_bytes: events, payloads and bytes (payloads and
            segments, as `PushReport.bytes_sent`) a push would send.
        to_pull_events, to_pull_payloads, to_pull_bytes: events, payloads and payload bytes (as
            `PullReport.bytes_fetched`) a pull would bring in.
        to_pull_sources: the journals pushed there that have events this journal has not pulled.
    """

    url: str
    to_push_events: int
    to_push_payloads: int
    to_push_bytes: int
    to_pull_events: int
    to_pull_payloads: int
    to_pull_bytes: int
    to_pull_sources: Tuple[str, ...]


def remote_status(journal: Union[str, "os.PathLike[str]", Journal], remote: Optional[str] = None, *,
                  options: Optional[Dict[str, Any]] = None) -> RemoteStatus:
    """What a push of `journal` (a path or a `Journal`) to `remote` would send, and a pull would
    fetch, without sending or committing anything. `remote` is what `push` takes: a URL, a path, a
    remote's name, or None (the default remote). A remote nothing was pushed to yet (a missing
    ``file://`` folder, a bucket without a manifest) has everything to receive and nothing to give.

    Raises:
        RemoteError: as `push` and `pull` would (its subclasses say why and what to do).
    """
    if not isinstance(journal, Journal):
        with Journal(journal, readonly=True) as opened:
            return remote_status(opened, remote, options=options)
    url = resolve_remote(journal, remote)
    try:
        found: Optional[Remote] = Remote(url, options=options, create=False)
    except RemoteMissingError:
        if url.startswith(("s3://", "gs://", "az://")):
            raise  # a missing bucket fails a push too
        found = None  # a folder a push would create
    shown = public_url(remote_url(url))
    if found is not None and found.get(MANIFEST, limit=1 << 16) is None:  # a GET: a missing bucket is told apart
        found = None
    events, payloads, nbytes = _to_push(journal, found)
    pull_events, pull_payloads, pull_bytes, sources = _to_pull(journal, found)
    return RemoteStatus(shown, events, payloads, nbytes, pull_events, pull_payloads, pull_bytes, sources)


def _to_push(journal: Journal, remote: Optional[Remote]) -> Tuple[int, int, int]:
    if not journal.last_seq():
        return 0, 0, 0
    source = journal_id(journal)
    head = pushed_head(journal, remote, source)[0]
    known: Set[str] = set()
    local = appender_of(journal).local
    released = Released(journal)
    on_remote = RemotePayloads(remote) if remote is not None else None
    events = payloads = nbytes = 0
    for batch, _through in segments_to_push(journal, head["last_seq"], known):
        skipped: Set[str] = set()
        wanted = payloads_of(batch, known)
        if on_remote is not None:
            on_remote.prepare(len(wanted))
        for digest, (ref, _seq, _step) in wanted.items():
            known.add(digest)
            if on_remote is not None and on_remote.holds(digest):
                continue
            if digest in released and not local.has(bytes.fromhex(digest)):
                skipped.add(digest)  # the push sends the event without it
                continue
            payloads += 1
            nbytes += ref.stored_nbytes
        if batch:
            events += len(batch)
            nbytes += len(encode_segment(source, [(seq, raw) for seq, raw, _ in batch], skipped)[1])
    return events, payloads, nbytes


def _to_pull(journal: Journal, remote: Optional[Remote]) -> Tuple[int, int, int, Tuple[str, ...]]:
    if remote is None:
        return 0, 0, 0, ()
    _all, imports, wanted = incoming(remote, journal)
    events = payloads = nbytes = 0
    for run in planned_runs(remote, journal, wanted, imports, {}):
        fetched = [ref for digest, (ref, _steps) in run.wanted.items() if digest not in run.released]
        events += len(run.events)
        payloads += len(fetched)
        nbytes += sum(ref.stored_nbytes for ref in fetched)
    return events, payloads, nbytes, tuple(source for source, _segments in wanted)

