"""The remote layout's objects, written and read: the manifest, the heads and the segments.

Shared by `_remote` (push and pull against object storage) and `_bundle` (the same objects in one
file). The layout itself is described in `_remote` and docs/sharing.md. Everything read is
untrusted: sizes are bounded, JSON is checked for its shape, segments against their head's digest,
and events decode through the journal's one converter.
"""

from __future__ import annotations

import json
import re
from typing import Any, Collection, Dict, List, Optional, Protocol, Set, Tuple

import msgpack

from ._bounded_parse import json_document, segment_body
from ..events._convert import decode_event
from ..base._digest import digest_bytes
from ..base._errors import EventDecodeError, IntegrityError, RemoteError, RemoteFormatError

__all__ = ["REMOTE_FORMAT", "MANIFEST", "MAX_HEAD", "RemoteReader", "check_format", "check_manifest",
           "encode_segment", "event_in", "manifest_bytes", "new_head", "parse_head", "read_head", "read_json",
           "read_segment", "segment_name"]

REMOTE_FORMAT = 1
MANIFEST = "stepjournal-remote.json"
_MAX_MANIFEST = 1 << 16
MAX_HEAD = 1 << 26
_MAX_SEGMENT = 1 << 28
_JOURNAL_ID = re.compile(r"[0-9a-f]{32}")


class RemoteReader(Protocol):
    """What a pull reads a remote through: a `Remote`, or a bundle read as one (`_bundle`)."""

    url: str

    def get(self, key: str, *, limit: int) -> Optional[bytes]: ...

    def exists(self, key: str) -> bool: ...

    def keys(self, prefix: str, *, most: Optional[int] = None) -> List[str]: ...


# -- the remote's small JSON objects ---------------------------------------------------------------
def read_json(remote: RemoteReader, key: str, limit: int) -> Optional[Dict[str, Any]]:
    """The JSON object at `key` (None: no such object), read within `limit` bytes; anything else is damage."""
    return _parsed(remote, key, remote.get(key, limit=limit))


def _parsed(remote: RemoteReader, key: str, data: Optional[bytes]) -> Optional[Dict[str, Any]]:
    if data is None:
        return None
    try:
        value = json_document(data)
    except ValueError as exc:  # UnicodeDecodeError too
        raise IntegrityError(f"{remote.url}/{key} is not a JSON document of the layout ({str(exc)[:200]}); "
                             "the remote is damaged: push it again from the journal", detail="bad document") from None
    if not isinstance(value, dict):
        raise IntegrityError(f"{remote.url}/{key} is not a JSON object; the remote is damaged")
    return value


def check_format(remote: RemoteReader, key: str, value: Dict[str, Any]) -> None:
    """Refuse an object of the layout whose format version is missing, or newer than this stepjournal reads."""
    found = value.get("format")
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        raise IntegrityError(f"{remote.url}/{key} has no valid format version ({str(found)[:40]})")
    if found > REMOTE_FORMAT:
        raise RemoteFormatError(
            f"{remote.url} has format {found}; this stepjournal reads up to {REMOTE_FORMAT}: upgrade stepjournal"
        )


def manifest_bytes() -> bytes:
    """The body of ``stepjournal-remote.json`` this stepjournal writes."""
    return json.dumps({"kind": "stepjournal-remote", "format": REMOTE_FORMAT}).encode()


def check_manifest(remote: Any, *, create: bool) -> None:  # Any: a RemoteReader; a `Remote` to `create`
    """Check the remote's manifest (a writer's `create` writes it when missing); no manifest is no remote."""
    found = read_json(remote, MANIFEST, _MAX_MANIFEST)
    if found is None and create:
        remote.put(MANIFEST, manifest_bytes(), create=True)
        found = read_json(remote, MANIFEST, _MAX_MANIFEST)
    if found is None:
        raise RemoteError(f"no stepjournal remote at {remote.url} ({MANIFEST} is missing); push to it first")
    check_format(remote, MANIFEST, found)


def read_head(remote: RemoteReader, source: str) -> Optional[Dict[str, Any]]:
    """Journal `source`'s head on the remote, checked (`parse_head`); None when it pushed nothing there."""
    return parse_head(remote, source, remote.get(f"heads/{source}.json", limit=MAX_HEAD))


def parse_head(remote: RemoteReader, source: str, data: Optional[bytes]) -> Optional[Dict[str, Any]]:
    """A head's bytes as read (`data`, None: absent), checked: its format and every field the layout gives it."""
    key = f"heads/{source}.json"
    head = _parsed(remote, key, data)
    if head is None:
        return None
    check_format(remote, key, head)
    problem = _head_problem(source, head)
    if problem:
        raise IntegrityError(f"{remote.url}/{key} is not a valid head ({problem}); the remote is damaged: "
                             "push the journal again", detail="bad head")
    return head


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _head_problem(source: str, head: Dict[str, Any]) -> Optional[str]:
    """What is wrong with a head's shape (None when nothing): the fields a pull or a push relies on."""
    if not _JOURNAL_ID.fullmatch(source) or head.get("source") != source:
        return f"its source is not the journal id {source[:40]!r} it is named after"
    if not _count(head.get("last_seq")) or not isinstance(head.get("last_digest", ""), (str, type(None))):
        return "last_seq or last_digest is not valid"
    segments = head.get("segments")
    if not isinstance(segments, list):
        return "segments is not a list"
    previous = -1
    for i, s in enumerate(segments):
        if not (isinstance(s, dict) and isinstance(s.get("digest"), str) and all(
                _count(s.get(f)) for f in ("first", "last", "nbytes")) and _count(s.get("count", 0))):
            return f"segment {i} lacks a name, digest, first, last or nbytes of the right type"
        if not previous < s["first"] <= s["last"]:
            return f"segment {i} (events {s['first']}-{s['last']}) is out of order or overlaps the one before"
        if s.get("name") != segment_name(source, s["first"], s["last"]):  # never a key of another's choosing
            return f"segment {i} is not named {segment_name(source, s['first'], s['last'])}"
        previous = s["last"]
    return None


def new_head(source: str) -> Dict[str, Any]:
    """The head of a journal nothing of which is on the remote yet."""
    return {"format": REMOTE_FORMAT, "source": source, "last_seq": 0, "last_digest": None, "segments": []}


def encode_segment(source: str, events: List[Tuple[int, bytes]],
                   released: Collection[str] = ()) -> Tuple[str, bytes, Dict[str, Any]]:
    """(object name, body, head entry) of the segment holding `events` ((seq, stored bytes), in order).

    `released`: digests its events name whose payloads retention released before the push, so
    were not sent (a reader accepts their absence; any other missing payload is damage).
    """
    first, last = events[0][0], events[-1][0]
    data: Dict[str, Any] = {"format": REMOTE_FORMAT, "source": source, "events": [[s, r] for s, r in events]}
    if released:
        data["released"] = sorted(released)
    body = msgpack.packb(data, use_bin_type=True)
    name = segment_name(source, first, last)
    return name, body, {"name": name, "first": first, "last": last, "count": len(events),
                        "nbytes": len(body), "digest": digest_bytes(body).hex()}


def segment_name(source: str, first: int, last: int) -> str:
    """The object name of journal `source`'s segment holding its events `first` to `last`."""
    return f"segments/{source}/{first:020d}-{last:020d}.msgpack"



def read_segment(remote: RemoteReader, source: str,
                 seg: Dict[str, Any]) -> Tuple[List[Tuple[int, bytes, Any]], Set[str]]:
    """(seq, stored bytes, event) of every event of a segment, checked; and the digests it says were released."""
    where = f"segment {seg['name']} (events {seg['first']}-{seg['last']} of journal {source})"
    body = remote.get(seg["name"], limit=min(seg["nbytes"], _MAX_SEGMENT))
    if body is None:
        raise RemoteError(f"{where} is missing from {remote.url}; nothing of it was pulled")
    if len(body) != seg["nbytes"] or digest_bytes(body).hex() != seg["digest"]:
        raise IntegrityError(f"{where} in {remote.url} does not match its digest: the remote is damaged; "
                             "nothing of it was pulled", detail="digest mismatch")
    try:
        pairs, released = segment_body(body, source, REMOTE_FORMAT)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise IntegrityError(f"{where} in {remote.url} is not a segment ({str(exc)[:200]}): the remote is damaged; "
                             "nothing of it was pulled", detail="bad segment") from None
    out: List[Tuple[int, bytes, Any]] = []
    previous = seg["first"] - 1
    for seq, raw in pairs:
        if not previous < seq <= seg["last"]:
            raise IntegrityError(f"{where} in {remote.url} lists event {seq} after {previous}, out of order or "
                                 "outside its range: the remote is damaged; nothing of it was pulled",
                                 detail="bad segment")
        previous = seq
        try:
            out.append((seq, raw, decode_event(raw, seq=seq)))
        except EventDecodeError as exc:
            raise type(exc)(f"{where} in {remote.url}: {exc}", step=exc.step, detail=exc.detail) from None
    return out, set(released)


def event_in(remote: RemoteReader, source: str, segments: Any, seq: int, cache: Optional[Dict[str, Any]] = None) -> Any:
    """Event `seq` of journal `source`, read from whichever of its `segments` holds it (a segment
    `cache` kept decoded first), checked as any segment is; None when none holds it."""
    for seg in segments:
        if seg["first"] <= seq <= seg["last"]:
            listed = (cache or {}).get(seg["name"]) or read_segment(remote, source, seg)
            return next((event for found, _raw, event in listed[0] if found == seq), None)
    return None
