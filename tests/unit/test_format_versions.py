"""Each on-disk format has its own version, apart from the library's `__version__`, and a reader refuses a
newer one with a typed error naming the version found, the version it reads, and what to do.

The journal's own ``format`` (meta) is tested in tests/integration/test_journal_format.py; here: the event
schema, the index key layout, the payload format and the remote layout, one version past this library's.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgpack
import pytest

from lmdb_raw import put_raw
from stepjournal import Journal
from stepjournal.errors import PayloadDecodeError, RemoteFormatError, UnsupportedSchemaVersionError
from stepjournal.events._convert import decode_event, encode_event  # private: the event codec under test
from stepjournal.events._events import EVENT_TYPES, GenerationRecorded  # private: the schema versions of the events
from stepjournal.events._keys import LAYOUT_VERSION, META_LAYOUT  # private: the key layout's version
from stepjournal.payloads._codec import (  # private: the payload format's version
    FORMAT_VERSION, decode_payload, encode_payload,
)
from stepjournal.sharing._remote_layout import REMOTE_FORMAT, check_format  # private: the remote layout's version

ROOT = Path(__file__).resolve().parents[2]


def _says_both(message: str, found: int, reads: int) -> None:
    assert str(found) in message and str(reads) in message, message
    assert "upgrade" in message.lower(), message  # what to do


def test_a_newer_event_schema_version_is_refused_naming_both_versions(tmp_path):
    with Journal(str(tmp_path / "j"), run="exp") as journal:
        journal.record(1, b"x")
        raw = [bytes(r) for _seq, r in journal.raw_events()][-1]
    body = msgpack.unpackb(raw)
    current = EVENT_TYPES[GenerationRecorded][1]
    body["v"] = current + 1
    with pytest.raises(UnsupportedSchemaVersionError) as caught:
        decode_event(msgpack.packb(body), seq=2)
    _says_both(str(caught.value), current + 1, current)
    assert decode_event(encode_event(decode_event(raw))) == decode_event(raw)  # the current one reads


def test_a_newer_index_key_layout_is_refused_naming_both_versions(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path, run="exp") as journal:
        journal.record(1, b"x")
    put_raw(path, "meta", META_LAYOUT, str(LAYOUT_VERSION + 1).encode())
    with pytest.raises(UnsupportedSchemaVersionError) as caught:
        Journal(path, run="exp").close()
    _says_both(str(caught.value), LAYOUT_VERSION + 1, LAYOUT_VERSION)


def test_a_newer_payload_format_is_refused_naming_both_versions():
    data = bytearray(encode_payload({"a": 1}))
    assert data[4] == FORMAT_VERSION  # the version byte follows the 4-byte magic
    data[4] = FORMAT_VERSION + 1
    with pytest.raises(PayloadDecodeError) as caught:
        decode_payload(bytes(data))
    _says_both(str(caught.value), FORMAT_VERSION + 1, FORMAT_VERSION)


class _Remote:
    url = "file:///remote"


def test_a_newer_remote_layout_is_refused_naming_both_versions():
    with pytest.raises(RemoteFormatError) as caught:
        check_format(_Remote(), "manifest.json", {"format": REMOTE_FORMAT + 1})
    _says_both(str(caught.value), REMOTE_FORMAT + 1, REMOTE_FORMAT)
    check_format(_Remote(), "manifest.json", {"format": REMOTE_FORMAT})


# A library version named beside a format ("a 0.1.0 journal") ties the format to the package version.
_LIBRARY_VERSION_IN_TEXT = re.compile(r"\b0\.1\.0\b")


def test_no_code_names_a_format_by_the_library_version():
    """The formats' versions are their own constants; the code's comments and messages never say "a 0.1.0
    journal" (the package version changes without the formats changing, and the other way round)."""
    found = [f"{path.relative_to(ROOT)}:{n}" for folder in ("journal", "policies", "adapters")
             for path in sorted((ROOT / folder).rglob("*.py")) if path.name != "_version.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if _LIBRARY_VERSION_IN_TEXT.search(line)]
    assert found == []


def test_the_library_version_check_finds_a_planted_one():
    assert _LIBRARY_VERSION_IN_TEXT.search('log.info("upgraded", note="0.1.0 index rebuilt")')
