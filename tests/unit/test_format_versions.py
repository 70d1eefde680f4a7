"""Each on-disk format has its own version, apart from the library's `__version__`, and a reader refuses a
newer one with a typed error naming the version found, the version it reads, and what to do.

The journal's own ``format`` (meta) is tested in tests/integration/test_journal_format.py; here: the event
schema, the index key layout, the payload format and the remote layout, one version past this library's.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import msgpack
import pytest

from lmdb_raw import put_raw
from stepjournal import Journal
from stepjournal.errors import PayloadDecodeError, RemoteFormatError, UnsupportedSchemaVersionError
from stepjournal.events._convert import (  # private: the event codec under test
    _UPGRADES, checked_body, decode_event, encode_event,
)
from stepjournal.events._events import (  # private: the schema versions of the events
    EVENT_TYPES, GenerationRecorded, field_names,
)
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


# The keys each event type's schema version stores, as that version wrote them. Every reader refuses a key it does
# not know as damage (cattrs' forbid_extra_keys, msgspec's forbid_unknown_fields), so a field added to a class
# without a new version makes every event written since look damaged to the stepjournal of the day before (its
# `verify` says "journal is damaged ... reindex"); under a new version it says "upgrade stepjournal". A version's
# keys are history: add a line for a new one, never edit one.
_CALL = {"session", "run", "step", "gen_index", "mode", "policy", "reason", "ts"}
WRITTEN = {
    ("session_opened", 1): {"session", "run", "fingerprint", "host", "pid", "library_version", "ts"},
    ("generation_recorded", 1): _CALL | {"input_digest", "output", "input", "duration_s", "imported_from"},
    ("generation_recorded", 2): _CALL | {"input_digest", "output", "input", "duration_s", "imported_from", "stage"},
    ("generation_recorded", 3): _CALL | {"input_digest", "output", "input", "duration_s", "imported_from", "stage",
                                         "not_stored"},
    ("replay_served", 1): _CALL | {"input_digest", "source_seq", "source_run", "source_step", "source_gen_index",
                                   "output", "duration_s"},
    ("replay_served", 2): _CALL | {"input_digest", "source_seq", "source_run", "source_step", "source_gen_index",
                                   "output", "duration_s", "stage"},
    ("call_bypassed", 1): _CALL | {"duration_s"},
    ("call_bypassed", 2): _CALL | {"duration_s", "stage"},
    ("call_refused", 1): _CALL,
    ("call_refused", 2): _CALL | {"stage"},
    ("payloads_released", 1): {"run", "mode", "stage", "step", "gen_index", "record_seq", "released", "retained",
                               "rule", "reason", "ts"},
    ("events_imported", 1): {"source", "origin", "source_first", "source_last", "ts"},
    ("events_imported", 2): {"source", "origin", "source_first", "source_last", "ts", "runs"},
}


@pytest.mark.parametrize("cls", list(EVENT_TYPES), ids=lambda cls: cls.__name__)
def test_an_event_class_stores_the_keys_its_schema_version_always_stored(cls):
    """A field added to (or dropped from) an event class comes with a new schema version and its upgrade."""
    tag, version = EVENT_TYPES[cls]
    assert field_names(cls)[0] == WRITTEN[(tag, version)], f"{tag} v{version}: add v{version + 1} and its upgrade"


def test_every_older_version_is_lifted_to_the_current_one():
    for (tag, version) in WRITTEN:
        current = next(v for c, (t, v) in EVENT_TYPES.items() if t == tag)
        assert version == current or (tag, version) in _UPGRADES, (tag, version)


def test_a_generation_recorded_body_as_written_before_not_stored_reads_with_it_none():
    """A v2 body (no `not_stored` key) reads on the checked path and the fast one, lifted with the field None."""
    event = GenerationRecorded(session="s", run="r", step=3, gen_index=0, mode="train", input_digest=None,
                               output=None, input=None, duration_s=0.0, policy="cache", reason="miss; why", ts=1.0)
    body = msgpack.unpackb(encode_event(event))
    del body["not_stored"], body["crc32"]
    body["v"] = 2
    body["crc32"] = zlib.crc32(msgpack.packb(body, use_bin_type=True))
    raw = msgpack.packb(body, use_bin_type=True)
    assert decode_event(raw) == event and decode_event(raw).not_stored is None
    cls, lifted = checked_body(raw)
    assert cls is GenerationRecorded and lifted["not_stored"] is None


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
