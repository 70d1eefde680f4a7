"""Bounded parsers for the objects a remote or a bundle hands over: JSON documents and msgpack segments.

Everything here reads untrusted bytes whose size a caller already bounded, and costs a small, fixed
multiple of that size whatever the bytes say:

- **JSON** (the manifest, the heads) is checked before `json.loads` builds anything: its nesting
  (strings taken out, brackets paired off one level per pass, in C) must not pass `MAX_JSON_DEPTH`,
  and it may open at most one object or array per `_JSON_BYTES_PER_CONTAINER` bytes. A document
  60 000 levels deep is refused in microseconds instead of ending in a `RecursionError`.
- **Segments** are read with a `msgpack.Unpacker` that expects their shape, field by field: a map of
  at most four known fields, ``events`` an array of ``[seq, bytes]`` pairs, ``released`` an array of
  strings. No other array or map is ever built (the unpacker's array and map limits are 0), so a
  segment of nested empty arrays (a byte each on disk, a 64-byte Python list each once unpacked) is
  refused at its first wrong header, and a segment costs its events' bytes once more, no more.

Both raise `ValueError` with what is wrong; the callers (`_remote_layout`) say which object.
"""

from __future__ import annotations

import io
import json
from typing import Any, Dict, List, Tuple

import msgpack

from ..events._convert import MAX_EVENT_BYTES

__all__ = ["MAX_JSON_DEPTH", "json_document", "segment_body"]

# The layout's documents need 3 levels (a head: object -> segment list -> segment); room to grow.
MAX_JSON_DEPTH = 8
# A head spends about 250 bytes per object it opens and 16 per string; `[]` spends 3 bytes (and costs
# Python 64), `""` 2 (and a list slot here). The constants leave the manifest's 45 bytes room.
_JSON_BYTES_PER_CONTAINER = 16
_JSON_BYTES_PER_STRING = 8
_JSON_SLACK = 16
_QUOTES_AND_BRACKETS = bytes(b for b in range(256) if b not in b'"[]{}')
_SAME_BRACKET = bytes.maketrans(b"{}", b"[]")

_SEGMENT_FIELDS = ("format", "source", "events", "released")
_SEGMENT_STR = 64  # the longest string a segment holds: a released payload's hex digest
_SEGMENT_READ = 1 << 20


def json_document(data: bytes) -> Any:
    """`json.loads` of UTF-8 `data`, after checking without building anything that its nesting is bounded.

    Raises:
        ValueError: not UTF-8 JSON, nested deeper than `MAX_JSON_DEPTH`, or more strings, objects
            and arrays for its size than a document of the layout holds (the message says which).
    """
    text = data.decode("utf-8")  # UTF-8 only: no byte of a multi-byte character is a quote or a bracket
    strings = data.count(b'"') // 2
    if strings > len(data) // _JSON_BYTES_PER_STRING + _JSON_SLACK:
        raise ValueError(f"{strings} strings in {len(data)} bytes, more than a document of the layout holds")
    # Escapes out first (a run of backslashes pairs off from its left, as JSON reads it), so every quote
    # left opens or closes a string; then every other piece between quotes is outside the strings.
    bare = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(_SAME_BRACKET, _QUOTES_AND_BRACKETS)
    skeleton = b"".join(bare.split(b'"')[::2])
    containers = skeleton.count(b"[")
    if containers > len(data) // _JSON_BYTES_PER_CONTAINER + _JSON_SLACK:
        raise ValueError(f"{containers} objects and arrays in {len(data)} bytes, more than a document of the "
                         "layout holds")
    # Each pass takes the innermost level off (every `[]` left): a well-nested document is empty after
    # as many passes as it is deep. Anything left then is deeper than allowed, or not paired at all.
    for _ in range(MAX_JSON_DEPTH):
        if not skeleton:
            break
        skeleton = skeleton.replace(b"[]", b"")
    if skeleton:
        raise ValueError(f"brackets nested deeper than {MAX_JSON_DEPTH} levels, or not paired")
    try:
        return json.loads(text)
    except RecursionError:  # not reached after the check above; a parser's recursion never gets out
        raise ValueError("nested too deeply") from None


def segment_body(body: bytes, source: str, newest_format: int) -> Tuple[List[Tuple[int, bytes]], List[str]]:
    """(``[seq, event bytes]`` pairs, released digests) of a segment's msgpack body, read to its shape.

    The pairs are not checked for order or decoded: the caller does, against the segment's head.

    Raises:
        ValueError: anything but ``{"format": n, "source": source, "events": [[int, bytes] ...],
            "released": [str ...]}`` (fields in any order, ``format`` and ``released`` optional),
            with nothing after it; the message says what was found instead.
    """
    unpacker = msgpack.Unpacker(
        io.BytesIO(body), raw=False, read_size=_SEGMENT_READ, max_buffer_size=MAX_EVENT_BYTES + 2 * _SEGMENT_READ,
        max_str_len=_SEGMENT_STR, max_bin_len=MAX_EVENT_BYTES, max_array_len=0, max_map_len=0, max_ext_len=0,
        strict_map_key=True,
    )
    fields = unpacker.read_map_header()
    if fields > len(_SEGMENT_FIELDS):
        raise ValueError(f"a map of {fields} fields, not at most {len(_SEGMENT_FIELDS)}")
    found: Dict[str, Any] = {}
    for _ in range(fields):
        name = unpacker.unpack()
        if name not in _SEGMENT_FIELDS or name in found:
            raise ValueError(f"an unknown or repeated field {str(name)[:40]!r}")
        if name == "events":
            found[name] = _pairs(unpacker)
        elif name == "released":
            found[name] = [_digest(unpacker.unpack()) for _ in range(unpacker.read_array_header())]
        else:
            found[name] = unpacker.unpack()
    try:
        unpacker.unpack()
    except msgpack.OutOfData:
        pass
    else:
        raise ValueError("bytes after the segment's map")
    version = found.get("format", 1)
    if type(version) is not int or not 1 <= version <= newest_format:
        raise ValueError(f"format {str(version)[:20]}, not 1 to {newest_format}")
    if found.get("source") != source:
        raise ValueError(f"source {str(found.get('source'))[:40]!r}, not the head's journal {source}")
    if "events" not in found:
        raise ValueError("no events field")
    return found["events"], found.get("released", [])


def _pairs(unpacker: Any) -> List[Tuple[int, bytes]]:
    pairs: List[Tuple[int, bytes]] = []
    for index in range(unpacker.read_array_header()):
        if unpacker.read_array_header() != 2:
            raise ValueError(f"event {index} is not a [seq, bytes] pair")
        seq, raw = unpacker.unpack(), unpacker.unpack()
        if type(seq) is not int or type(raw) is not bytes:
            raise ValueError(f"event {index} is not a [seq, bytes] pair ({type(seq).__name__}, {type(raw).__name__})")
        pairs.append((seq, raw))
    return pairs


def _digest(value: Any) -> str:
    if type(value) is not str or len(value) != 64 or value.strip("0123456789abcdef"):
        raise ValueError(f"a released digest {str(value)[:20]!r} that is not 64 hex digits")
    return value
