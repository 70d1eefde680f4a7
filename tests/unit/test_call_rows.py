"""``audit --json`` rows straight from the stored maps, or decoded natively (msgspec), equal the event path's,
byte for byte, errors included."""

from __future__ import annotations

import io
import shutil
import zlib
from contextlib import redirect_stdout
from pathlib import Path

import msgpack
import pytest

from stepjournal import Journal
from stepjournal.sharing import pull, push
from stepjournal.upkeep import Retention, prune
from stepjournal.index._audit import AUDIT_FIELDS, call_records, AUDIT_EVENT_TYPES  # private: the audit's internals
from stepjournal.tools import json_rows
from stepjournal.storage._eventlog import EventLog  # private: the event log below the journal
from stepjournal.adapters.cli._audit import _print_json_rows  # private: a CLI helper under test
from stepjournal.adapters.cli._render import print_json  # private: a CLI helper under test
from stepjournal.policies import StepRanges

DATA = Path(__file__).parent.parent / "data"
DIGEST = "ab" * 32


def event_path(journal, run=None, steps=None, mode=None, actions=None, stage=None):
    """The rows as the event path gives them (decode every event, build records): the reference."""
    out = []
    for r in call_records(journal.events(types=AUDIT_EVENT_TYPES)):
        if (run is not None and r.run != run) or (steps is not None and r.step not in steps):
            continue
        if (mode is not None and r.mode != mode) or (stage is not None and r.stage != stage):
            continue
        if not actions or r.action in actions:
            out.append(r.to_json())
    return out


def outcome(fn):
    try:
        return "ok", fn()
    except Exception as exc:  # the same error, type and words
        return type(exc).__name__, str(exc)


def packed(body: dict, *, crc: bool = True) -> bytes:
    if crc:
        body = {**body, "crc32": zlib.crc32(msgpack.packb(body, use_bin_type=True))}
    return msgpack.packb(body, use_bin_type=True)


class Packed(bytes):
    """A value's msgpack bytes, put into `raw_map` as they are."""


def raw_map(entries, *, crc_entries=None, header=None) -> bytes:
    """A msgpack map of `entries` (pairs, a key may come twice) ending in the ``crc32`` entry that
    `checked_body` accepts: the CRC of the map header for the distinct keys and the entries' bytes."""
    distinct = len(dict(entries)) if crc_entries is None else crc_entries
    body = b"".join(msgpack.packb(k) + (v if isinstance(v, Packed) else msgpack.packb(v, use_bin_type=True))
                    for k, v in entries)
    crc_header = bytes([0x80 | distinct]) if distinct < 16 else b"\xde" + distinct.to_bytes(2, "big")
    checksum = zlib.crc32(body, zlib.crc32(crc_header))
    count = len(entries) + 1
    head = header if header is not None else (bytes([0x80 | count]) if count < 16 else b"\xde" + count.to_bytes(2, "big"))
    return head + body + msgpack.packb("crc32") + msgpack.packb(checksum)


def small_checksum(body: dict, below: int) -> bytes:
    """`body` packed with a checksum under `below` (its reason varied until the CRC falls there)."""
    for n in range(1 << 22):
        candidate = {**body, "reason": f"r{n}"}
        checksum = zlib.crc32(msgpack.packb(candidate, use_bin_type=True))
        if checksum < below:
            return msgpack.packb({**candidate, "crc32": checksum}, use_bin_type=True)
    raise AssertionError("no checksum found")


def append_raw(journal: Journal, bodies) -> None:
    store = journal._live()
    store.write(lambda txn: EventLog.append_in(txn, store, bodies))


def varied(path: str, remote: str) -> None:
    """Every kind of audit row: records with and without output, replays, bypasses, refusals, stages,
    modes, imported records, releases by retention and pulled calls with their provenance."""
    with Journal(path + "-other", run="other", sync=False) as other:
        other.record(1, b"o")
        other.record_replay(2, other.lookup(1))
    push(path + "-other", remote)
    with Journal(path, run="exp", sync=False) as journal:
        for step in range(1, 7):
            journal.record(step, b"x" * step, policy="cache", reason="miss", duration_s=0.25)
            journal.record(step, b"r", stage="reward", input=b"in" * step)
        journal.record(7, b"y", store_output=False, reason="not kept")
        journal.record_replay(8, journal.lookup(2), policy="repeat", reason="8 -> 2")
        journal.record_bypass(8, reason="validation ünïcode \u2028 \x1b[31m", duration_s=3)
        journal.record_refusal(9, reason="replay miss", stage="reward")
        prune(journal, Retention(keep_last=2))
    pull(remote, path)
    with Journal(path, run="late", sync=False) as journal:
        journal.record(3, b"z", mode="validate", gen_index=2)


call = {"type": "call_bypassed", "v": 2, "session": "s", "run": "exp", "step": 4, "gen_index": 0, "mode": "train",
        "policy": "p", "reason": "r", "ts": 1.5, "duration_s": 0.0, "stage": "generate"}
ref = {"digest": DIGEST, "nbytes": 3, "stored_nbytes": 3, "compression": None}
record = {**call, "type": "generation_recorded", "input_digest": None, "output": ref, "input": None,
          "imported_from": None}
served = {**call, "type": "replay_served", "input_digest": "i", "source_seq": 2, "source_run": "exp",
          "source_step": 1, "source_gen_index": 0, "output": ref}
refused = {k: v for k, v in {**call, "type": "call_refused"}.items() if k != "duration_s"}
HOSTILE = {
    "int ts and duration": {**call, "ts": 2, "duration_s": 1},
    "no optional fields": {k: v for k, v in call.items() if k not in ("duration_s", "stage")},
    "v1 call without a stage": {**{k: v for k, v in call.items() if k != "stage"}, "v": 1},
    "v1 call with a stage": {**call, "v": 1},
    "negative step": {**call, "step": -1},
    "step past 2**63": {**call, "step": 1 << 63},
    "bool step": {**call, "step": True},
    "float step": {**call, "step": 4.0},
    "gen_index 2**32": {**call, "gen_index": 1 << 32},
    "nan ts": {**call, "ts": float("nan")},
    "ts after year 9999": {**call, "ts": 1e12},
    "negative duration": {**call, "duration_s": -1.0},
    "infinite duration": {**call, "duration_s": float("inf")},
    "empty run": {**call, "run": ""},
    "run with NUL": {**call, "run": "a\x00b"},
    "mode too long": {**call, "mode": "m" * 600},
    "stage too long for this run": {**call, "run": "r" * 480, "stage": "s" * 40},
    "int policy": {**call, "policy": 3},
    "bytes reason": {**call, "reason": b"r"},
    "extra key": {**call, "extra": 1},
    "missing reason": {k: v for k, v in call.items() if k != "reason"},
    "refused with a duration": {**refused, "duration_s": 1.0},
    "refused": refused,
    "record": record,
    "record without output": {**record, "output": None},
    "record of a zstd payload": {**record, "output": {**ref, "compression": "zstd", "stored_nbytes": 1}},
    "record with an imported_from": {**record, "imported_from": "verl:/dump/1.pkl"},
    "record with a bad digest": {**record, "output": {**ref, "digest": "zz" * 32}},
    "record with a short digest": {**record, "output": {**ref, "digest": "ab"}},
    "record with bad compression": {**record, "output": {**ref, "compression": "lz4"}},
    "record with an extra ref key": {**record, "output": {**ref, "x": 1}},
    "record with negative nbytes": {**record, "output": {**ref, "nbytes": -1}},
    "record with a bad input ref": {**record, "input": {"digest": 1}},
    "record with an int input_digest": {**record, "input_digest": 5},
    "served": served,
    "served without output": {**served, "output": None},
    "served from seq 0": {**served, "source_seq": 0},
    "served from an empty run": {**served, "source_run": ""},
    "served with a float source step": {**served, "source_step": 1.0},
    "unknown type": {**call, "type": "call_teleported"},
    "newer version": {**call, "v": 3},
    "bool version": {**call, "v": True},
    "session with a bad pid": {"type": "session_opened", "v": 1, "session": "s", "run": "exp", "fingerprint": {},
                               "library_version": "x", "host": "h", "pid": -1, "ts": 1.0},
    # What the native decoder (msgspec) might take differently: each must give the event path's row or error.
    "tiny floats": {**call, "ts": 5e-05, "duration_s": 1e-07},
    "negative zero ts": {**call, "ts": -0.0, "duration_s": -0.0},
    "largest ts": {**call, "ts": 253402300799.0},
    "ts a hair past the largest": {**call, "ts": 253402300799.00003},
    "bool ts": {**call, "ts": True},
    "string ts": {**call, "ts": "1.5"},
    "stage None": {**call, "stage": None},
    "type last": {**{k: v for k, v in call.items() if k != "type"}, "type": "call_bypassed"},
    "record with a digest and a newline": {**record, "output": {**ref, "digest": "ab" * 31 + "a\n"}},
    "record with upper-case hex": {**record, "output": {**ref, "digest": "AB" * 32}},
    "record with compression absent": {**record, "output": {k: v for k, v in ref.items() if k != "compression"}},
    "record with a float nbytes": {**record, "output": {**ref, "nbytes": 3.0}},
    "record with nbytes 2**63": {**record, "output": {**ref, "nbytes": 1 << 63}},
    "record with an input ref": {**record, "input": ref, "input_digest": "abc"},
    "record v3 with a why": {**record, "v": 3, "output": None, "not_stored": "the output cannot be stored"},
    "record v3 without not_stored": {**record, "v": 3},
    "record v2 holding not_stored": {**record, "output": None, "not_stored": "why"},
    "record v3 with an int why": {**record, "v": 3, "not_stored": 5},
    "record v4": {**record, "v": 4, "not_stored": None},
    "record with a stage and an imported_from": {**record, "stage": "reward", "imported_from": None},
    "record without a stage": {k: v for k, v in record.items() if k != "stage"},
    "record with a bin session": {**record, "session": b"s"},
    "served from seq 2**64 - 1": {**served, "source_seq": (1 << 64) - 1},
    "served with an imported_from": {**served, "imported_from": None},
    "served from a run with NUL": {**served, "source_run": "a\x00"},
    "served with a duration and no stage": {k: v for k, v in {**served, "duration_s": 2}.items() if k != "stage"},
    "bypassed with C1 and bidi text": {**call, "reason": "a\x9b31m \u202egnp.exe \x7f \u2066", "policy": "\x85"},
    "refused without a stage": {k: v for k, v in refused.items() if k != "stage"},
    "crc32 not an int": {**call, "crc32": "x"},
}
# Stored bytes msgpack's own packer would not write: a key twice, another header, crc32 not last.
RAW = {
    "a key twice, the checksum over the distinct keys": raw_map([*call.items(), ("reason", "second")]),
    "a key twice, the checksum over every entry": raw_map([*call.items(), ("reason", "second")],
                                                          crc_entries=len(call) + 1),
    "crc32 first": msgpack.packb({"crc32": zlib.crc32(msgpack.packb(call)), **call}),
    "a 16-bit map header for a small map": raw_map(list(call.items()), header=b"\xde\x00" + bytes([len(call) + 1])),
    "a 32-bit map header": raw_map(list(call.items()), header=b"\xdf\x00\x00\x00" + bytes([len(call) + 1])),
    "a checksum under 2**16": small_checksum(call, 1 << 16),
    "a checksum packed as uint64": packed(call)[:-5] + b"\xcf\x00\x00\x00\x00" + packed(call)[-4:],
    "a float32 ts": packed(call).replace(msgpack.packb(1.5), b"\xca" + __import__("struct").pack(">f", 1.5)),
    "trailing bytes": packed(call) + b"\x00",
    "a record's output map with a key twice": raw_map([(k, Packed(b"\x85" + b"".join(
        msgpack.packb(rk) + msgpack.packb(rv) for rk, rv in [*ref.items(), ("nbytes", 4)])) if k == "output" else v)
        for k, v in record.items()]),
}


@pytest.fixture(scope="module")
def journal_path(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("audit-rows")
    path = str(base / "j")
    varied(path, (base / "remote").resolve().as_uri())
    return path


FILTERS = [
    {}, {"run": "exp"}, {"run": "other"}, {"steps": StepRanges.parse("2-4,8")}, {"mode": "validate"},
    {"stage": "reward"}, {"actions": {"replayed", "released"}}, {"run": "exp", "steps": {8}, "actions": {"bypassed"}},
]


def as_dicts(rows):
    """Native rows as dicts (a small float given back as the float it carries as text)."""
    from stepjournal.index._native_rows import Row, as_dicts as row_dicts  # private: the fast decoder under test

    return [row_dicts([row])[0] if isinstance(row, Row) else row for row in rows]


@pytest.mark.parametrize("native, plain", [(False, False), (True, False), (True, True)], ids=["maps", "native", "plain"])
@pytest.mark.parametrize("filters", FILTERS, ids=[str(sorted(f)) for f in FILTERS])
def test_rows_from_the_stored_maps_equal_the_event_paths_rows(journal_path, filters, native, plain):
    with Journal(journal_path, readonly=True) as journal:
        given = list(json_rows(journal.raw_events(), native=native, plain=plain, **filters))
        rows = given if plain else as_dicts(given)
        assert rows == event_path(journal, **filters)
        assert all(tuple(row) == AUDIT_FIELDS for row in rows)
        if plain:  # dicts as the event path's, their floats floats
            assert all(type(row) is dict and type(row["ts"]) is float for row in given)
        elif native and not filters:  # the call events came through msgspec, the others through the maps
            assert sum(not isinstance(row, dict) for row in given) > len(given) // 2
    if not filters:
        assert {r["action"] for r in rows} == {"generated", "replayed", "bypassed", "refused", "released"}
        assert any(r["origin_journal"] for r in rows) and any(not r["stored"] for r in rows)


def printed(given, reference):
    """What `_print_json_rows` streams of `given` rows, and what `print_json` prints of the `reference` list."""
    streamed, listed = io.StringIO(), io.StringIO()
    with redirect_stdout(streamed):
        _print_json_rows(iter(given))
    with redirect_stdout(listed):
        print_json(reference)
    return streamed.getvalue(), listed.getvalue()


def test_the_streamed_json_array_is_byte_identical_to_the_printed_list(journal_path):
    with Journal(journal_path, readonly=True) as journal:
        rows = list(json_rows(journal.raw_events()))
        native = list(json_rows(journal.raw_events(), native=True))
    for selection, given in ((rows, native), (rows[:1], native[:1]), ([], []), (rows * 300, native * 300)):
        streamed, listed = printed(given, selection)
        assert streamed == listed


def test_a_batch_msgspec_cannot_write_as_python_does_is_written_by_the_standard_encoder():
    row = {key: None for key in AUDIT_FIELDS}
    rows = [{**row, "seq": 1, "reason": "fine"}, {**row, "seq": 1 << 70, "reason": "\u202e"}]  # past 64 bits
    streamed, listed = printed(rows, rows)
    assert streamed == listed
    rows = [{**row, "reason": "a\udc80b", "ts": 1e-05}]  # a lone surrogate: spelled as an escape
    streamed, listed = printed(rows, rows)
    assert streamed == listed and "\\udc80" in streamed


def stored(name: str) -> bytes:
    """The stored bytes of a `HOSTILE` event or a `RAW` layout."""
    return packed(HOSTILE[name]) if name in HOSTILE else RAW[name]


@pytest.mark.parametrize("name", sorted(HOSTILE) + sorted(RAW))
def test_an_odd_or_hostile_event_gives_the_event_paths_row_or_its_error(journal_path, tmp_path, name):
    path = tmp_path / "j"
    shutil.copytree(journal_path, path)
    with Journal(str(path), session=False) as journal:
        append_raw(journal, [stored(name)])
    with Journal(str(path), readonly=True) as journal:
        fast = outcome(lambda: list(json_rows(journal.raw_events())))
        assert fast == outcome(lambda: event_path(journal))
        assert outcome(lambda: as_dicts(json_rows(journal.raw_events(), native=True))) == fast
        if fast[0] == "ok":
            streamed, listed = printed(json_rows(journal.raw_events(), native=True), fast[1])
            assert streamed == listed


@pytest.mark.parametrize("damage", ["no checksum", "wrong checksum", "not msgpack", "a list"])
def test_a_damaged_event_raises_the_event_paths_error(journal_path, tmp_path, damage):
    path = tmp_path / "j"
    shutil.copytree(journal_path, path)
    bodies = {"no checksum": packed(call, crc=False), "wrong checksum": packed(call)[:-1] + b"\x00",
              "not msgpack": b"\xc1 no", "a list": msgpack.packb([1, 2])}
    with Journal(str(path), session=False) as journal:
        append_raw(journal, [bodies[damage]])
    with Journal(str(path), readonly=True) as journal:
        assert outcome(lambda: list(json_rows(journal.raw_events()))) == outcome(lambda: event_path(journal))
        assert outcome(lambda: as_dicts(json_rows(journal.raw_events(), native=True))) == outcome(
            lambda: event_path(journal))


def test_the_release_journal_gives_the_event_paths_rows(tmp_path):
    target = tmp_path / "journal-0.1.0"
    target.mkdir(mode=0o700)
    shutil.copy2(DATA / "journal-0.1.0" / "data.mdb", target / "data.mdb")
    with Journal(str(target), readonly=True) as journal:
        rows = list(json_rows(journal.raw_events()))
        assert rows and rows == event_path(journal) == as_dicts(json_rows(journal.raw_events(), native=True))


def test_the_key_rule_remembers_only_what_passed_and_only_for_exact_strings():
    from stepjournal.errors import InvalidKeyError
    from stepjournal.vocabulary import check_key

    check_key("remembered", "train", "generate")
    check_key("remembered", "train", "generate")  # from the cache
    for bad in (("remembered", b"train", "generate"), ("", "train", "generate"), ("r" * 600, "train", "generate")):
        for _ in range(2):  # a refusal is never remembered
            with pytest.raises(InvalidKeyError):
                check_key(*bad)


@pytest.mark.parametrize("name", sorted(HOSTILE) + sorted(RAW))
def test_reindex_projects_an_odd_event_as_the_event_path_would_or_raises_its_error(journal_path, tmp_path, name,
                                                                                    monkeypatch):
    import stepjournal.index._call_rows as call_rows  # private: the row decoder under test
    import stepjournal.index._native_rows as native_rows  # private: the fast decoder under test

    path = tmp_path / "j"
    shutil.copytree(journal_path, path)

    def rebuilt(journal):
        result = outcome(journal.reindex)
        store = journal._live()
        with store.read() as txn:
            runs = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=store.db("runs"))]
        rows = journal.stored_audit_rows()
        return result, journal.index_items(), journal.rank_items(), runs, None if rows is None else list(rows)

    with Journal(str(path), session=False) as journal:
        append_raw(journal, [stored(name)])
        fast = rebuilt(journal)
        monkeypatch.setattr(call_rows, "call_row", lambda *a, **k: None)
        assert fast == rebuilt(journal)  # the events msgspec does not take through decode_event
        monkeypatch.setattr(native_rows, "row_of", lambda *a, **k: None)  # every event through decode_event
        assert fast == rebuilt(journal)
