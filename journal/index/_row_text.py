"""The text of audit rows as ``stepjournal audit --json`` prints them: the one writer of that text.

The verb prints a JSON array laid out as ``json.dumps(rows, indent=2)`` lays it out: ``[``, then each
row as ``  {``, its fields one a line (``    "schema_version": 1,`` ...), ``  }``, rows joined by
``,``; then ``]``. A row's *inner text* is its field lines alone (between ``  {\\n`` and ``\\n  }``):
what the rows projection (`_rows_index`) keeps of each row, so that the verb prints stored rows by
joining them (`SEAM`, `OPEN`, `CLOSE`) and its output stays the same, byte for byte, however it was read.

What a terminal would act on is escaped: `JSON_RAW` (DEL, C1 controls, bidi overrides and isolates)
as ``\\u`` escapes; JSON escapes the C0 controls itself. A lone surrogate, which no decoded journal
holds, is written as an escape.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List

__all__ = ["JSON_RAW", "SURROGATE", "OPEN", "SEAM", "CLOSE", "rows_text", "inner_texts", "inner_text"]

SURROGATE = re.compile("[\ud800-\udfff]")
# What JSON leaves raw but a terminal acts on: DEL, C1 controls (\x9b is CSI), bidi overrides and isolates.
JSON_RAW = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# The array around inner texts: OPEN + SEAM.join(inner texts) + CLOSE is the printed array's body with
# its brackets' lines (``[\n`` before OPEN, ``\n]\n`` after CLOSE).
OPEN, SEAM, CLOSE = b"  {\n", b"\n  },\n  {\n", b"\n  }"


def _escaped(match: "re.Match[str]") -> str:
    return f"\\u{ord(match.group()):04x}"


def rows_text(rows: List[Any]) -> str:
    """The rows (`_native_rows.Row` s or dict rows) as the body of the printed array, between its brackets."""
    return _body(rows).decode("utf-8", "surrogatepass")


def _body(rows: List[Any]) -> bytes:
    """`rows_text`, UTF-8: msgspec's encoder writes the batch (`_native_rows.encode_rows`); a batch it cannot
    write as Python would goes through the standard library's C encoder, row by row."""
    from ._native_rows import Row, as_dicts, as_row, encode_rows  # msgspec: imported when rows are written

    batch = [row if type(row) is Row else as_row(row) for row in rows]
    data = encode_rows(batch)
    if data is None:
        return ",\n".join(_json_row(row) for row in as_dicts(batch)).encode("utf-8", "surrogatepass")
    if not data.isascii() or b"\x7f" in data:
        # a regex over the batch costs more than its encoding: asked only when the text is not plain
        # ASCII or holds DEL
        text = data.decode("utf-8")
        if JSON_RAW.search(text):
            data = JSON_RAW.sub(_escaped, text).encode("utf-8")
    return data


def inner_texts(rows: List[Any]) -> List[bytes]:
    """Each row's inner text, UTF-8: the batch's text (`rows_text`), cut at the seams between its rows.

    A row's text holds no raw newline inside a string (JSON escapes it), so `SEAM` is only ever the
    seam between two rows of the array.
    """
    if not rows:
        return []
    parts = _body(rows)[len(OPEN):-len(CLOSE)].split(SEAM)
    if len(parts) != len(rows):  # JSON escapes a newline in a string: a seam more would be this module's bug
        raise RuntimeError(f"{len(rows)} audit rows were written as {len(parts)}: a bug in stepjournal")
    return parts


def inner_text(row: Dict[str, Any]) -> bytes:
    """One dict row's inner text, UTF-8, through the standard library's encoder (no msgspec): for an append."""
    return _json_row(row)[len(OPEN):-len(CLOSE)].encode("utf-8", "surrogatepass")


_UNICODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",\n    ", ": "))
_ESCAPED = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",\n    ", ": "))


def _json_row(row: Dict[str, Any]) -> str:
    """One row as ``json.dumps([row], indent=2)`` lays it out inside the array (``  {...}``)."""
    text = _UNICODE.encode(row)
    if not text.isascii():
        if SURROGATE.search(text):  # not UTF-8 (never from a decoded journal): spelled as escapes
            text = _ESCAPED.encode(row)
        if JSON_RAW.search(text):
            text = JSON_RAW.sub(_escaped, text)
    elif "\x7f" in text:
        text = text.replace("\x7f", "\\u007f")
    return "  {\n    " + text[1:-1] + "\n  }"
