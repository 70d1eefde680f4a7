"""The text of audit rows as ``stepjournal audit --json`` prints them: the one writer of that text.

The verb prints a JSON array laid out as ``json.dumps(rows, indent=2)`` lays it out. A row's *compact
text* is the same JSON object without the layout (``{"schema_version":1,"seq":2,...}``): what the rows
projection (`_rows_index`) keeps of each row. `layout` lays stored rows out as the verb prints them
(msgspec's formatter, which refuses text that is not JSON, raw control characters included), so the
output is the same, byte for byte, however the rows were read.

What a terminal would act on is escaped: `JSON_RAW` (DEL, C1 controls, bidi overrides and isolates)
as ``\\u`` escapes; JSON escapes the C0 controls itself. A lone surrogate, which no decoded journal
holds, is written as an escape.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional

__all__ = ["JSON_RAW", "SURROGATE", "rows_text", "compact_texts", "compact_text", "layout"]

SURROGATE = re.compile("[\ud800-\udfff]")
# What JSON leaves raw but a terminal acts on: DEL, C1 controls (\x9b is CSI), bidi overrides and isolates.
JSON_RAW = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: "re.Match[str]") -> str:
    return f"\\u{ord(match.group()):04x}"


def _escape_raw(data: bytes) -> bytes:
    """`data` (JSON, UTF-8) with `JSON_RAW`'s characters as escapes; a regex only over text that is not plain
    ASCII or holds DEL (it costs more than the encoding)."""
    if data.isascii() and b"\x7f" not in data:
        return data
    text = data.decode("utf-8")
    return JSON_RAW.sub(_escaped, text).encode("utf-8") if JSON_RAW.search(text) else data


def rows_text(rows: List[Any]) -> str:
    """The rows (`_native_rows.Row` s or dict rows) as the body of the printed array, between its brackets:
    msgspec's encoder writes the batch (`_native_rows.encode_rows`); a batch it cannot write as Python
    would goes through the standard library's C encoder, row by row."""
    from ._native_rows import Row, as_dicts, as_row, encode_rows  # msgspec: imported when rows are written

    batch = [row if type(row) is Row else as_row(row) for row in rows]
    data = encode_rows(batch)
    if data is None:
        return ",\n".join(_json_row(row) for row in as_dicts(batch))
    return _escape_raw(data).decode("utf-8")


def compact_texts(rows: List[Any]) -> List[bytes]:
    """Each row's compact text, UTF-8: msgspec's encoder, one call for the batch (a small float as Python writes
    it), or row by row, the standard library's for a row msgspec cannot write as Python would."""
    from ._native_rows import Row, as_dicts, as_row, encode_lines, encode_row  # msgspec: imported when rows are written

    natives = [row if type(row) is Row else as_row(row) for row in rows]
    data = encode_lines(natives)
    if data is not None:  # JSON's text holds no raw newline: one line a row
        return _escape_raw(data).split(b"\n")[:-1]
    texts = []
    for native in natives:
        data = encode_row(native)
        texts.append(_escape_raw(data) if data is not None else compact_text(as_dicts([native])[0]))
    return texts


def compact_text(row: Dict[str, Any]) -> bytes:
    """One dict row's compact text, UTF-8, through the standard library's encoder (no msgspec): for an append."""
    return _stdlib(row, indented=False).encode("utf-8")


def layout(texts: List[bytes]) -> Optional[bytes]:
    """Compact texts laid out as the body of the printed array (rows joined by ``,\\n``, UTF-8), or None when
    they are not JSON objects this module writes: not JSON, a raw control character, a character a terminal
    acts on (`JSON_RAW`), or not one object each."""
    import msgspec  # with the rows' reader, not at import

    joined = b",".join(texts)
    if b"\x7f" in joined or not joined.isascii() and JSON_RAW.search(joined.decode("utf-8", "replace")):
        return None
    try:
        data = msgspec.json.format(b"[" + joined + b"]", indent=2)
    except msgspec.DecodeError:
        return None
    body = data[2:-2]
    # Each stored text is one object, with fields: as many as the texts, each opening a line of its own.
    if not body.startswith(b"  {\n") or body.count(b"\n  {\n") + 1 != len(texts):
        return None
    return body


def _json_row(row: Dict[str, Any]) -> str:
    """One row as ``json.dumps([row], indent=2)`` lays it out inside the array (``  {...}``)."""
    return "  {\n    " + _stdlib(row, indented=True)[1:-1] + "\n  }"


# The standard library's C encoders: a row's fields one a line (the array's layout) or compact; characters
# as they are, or (a lone surrogate, which no decoded journal holds) as escapes.
_ENCODERS = {(indented, ascii): json.JSONEncoder(ensure_ascii=ascii, allow_nan=False,
                                                  separators=(",\n    ", ": ") if indented else (",", ":"))
             for indented in (False, True) for ascii in (False, True)}


def _stdlib(row: Dict[str, Any], *, indented: bool) -> str:
    """`row` as JSON through the standard library, `JSON_RAW`'s characters escaped."""
    text = _ENCODERS[indented, False].encode(row)
    if text.isascii() and "\x7f" not in text:
        return text
    if SURROGATE.search(text):
        text = _ENCODERS[indented, True].encode(row)
    return JSON_RAW.sub(_escaped, text)
