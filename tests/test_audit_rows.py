"""``audit --json`` rows straight from the stored maps equal the event path's, byte for byte, errors included."""

from __future__ import annotations

import io
import shutil
import zlib
from contextlib import redirect_stdout
from pathlib import Path

import msgpack
import pytest

from stepjournal import Journal, Retention, prune, pull, push
from stepjournal._audit import AUDIT_FIELDS, call_records, AUDIT_EVENT_TYPES
from stepjournal._audit_rows import json_rows
from stepjournal._eventlog import EventLog
from stepjournal.adapters.cli._audit import _print_json_rows
from stepjournal.adapters.cli._render import print_json
from stepjournal.policies import StepRanges

DATA = Path(__file__).parent / "data"
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


@pytest.mark.parametrize("filters", FILTERS, ids=[str(sorted(f)) for f in FILTERS])
def test_rows_from_the_stored_maps_equal_the_event_paths_rows(journal_path, filters):
    with Journal(journal_path, readonly=True) as journal:
        rows = list(json_rows(journal.raw_events(), **filters))
        assert rows == event_path(journal, **filters)
        assert all(tuple(row) == AUDIT_FIELDS for row in rows)
    if not filters:
        assert {r["action"] for r in rows} == {"generated", "replayed", "bypassed", "refused", "released"}
        assert any(r["origin_journal"] for r in rows) and any(not r["stored"] for r in rows)


def test_the_streamed_json_array_is_byte_identical_to_the_printed_list(journal_path):
    with Journal(journal_path, readonly=True) as journal:
        rows = list(json_rows(journal.raw_events()))
    for selection in (rows, rows[:1], []):
        streamed, printed = io.StringIO(), io.StringIO()
        with redirect_stdout(streamed):
            _print_json_rows(iter(selection))
        with redirect_stdout(printed):
            print_json(selection)
        assert streamed.getvalue() == printed.getvalue()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_an_odd_or_hostile_event_gives_the_event_paths_row_or_its_error(journal_path, tmp_path, name):
    path = tmp_path / "j"
    shutil.copytree(journal_path, path)
    with Journal(str(path), session=False) as journal:
        append_raw(journal, [packed(HOSTILE[name])])
    with Journal(str(path), readonly=True) as journal:
        fast = outcome(lambda: list(json_rows(journal.raw_events())))
        assert fast == outcome(lambda: event_path(journal))


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


def test_the_release_journal_gives_the_event_paths_rows(tmp_path):
    target = tmp_path / "journal-0.1.0"
    target.mkdir(mode=0o700)
    shutil.copy2(DATA / "journal-0.1.0" / "data.mdb", target / "data.mdb")
    with Journal(str(target), readonly=True) as journal:
        rows = list(json_rows(journal.raw_events()))
        assert rows and rows == event_path(journal)


def test_the_key_rule_remembers_only_what_passed_and_only_for_exact_strings():
    from stepjournal import InvalidKeyError
    from stepjournal._keys import check_key

    check_key("remembered", "train", "generate")
    check_key("remembered", "train", "generate")  # from the cache
    for bad in (("remembered", b"train", "generate"), ("", "train", "generate"), ("r" * 600, "train", "generate")):
        for _ in range(2):  # a refusal is never remembered
            with pytest.raises(InvalidKeyError):
                check_key(*bad)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_reindex_projects_an_odd_event_as_the_event_path_would_or_raises_its_error(journal_path, tmp_path, name,
                                                                                    monkeypatch):
    import stepjournal._projections as projections

    path = tmp_path / "j"
    shutil.copytree(journal_path, path)

    def rebuilt(journal):
        result = outcome(journal.reindex)
        store = journal._live()
        with store.read() as txn:
            runs = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=store.db("runs"))]
        return result, journal.index_items(), journal.rank_items(), runs

    with Journal(str(path), session=False) as journal:
        append_raw(journal, [packed(HOSTILE[name])])
        fast = rebuilt(journal)
        monkeypatch.setattr(projections, "call_row", lambda *a, **k: None)  # every event through decode_event
        assert fast == rebuilt(journal)
