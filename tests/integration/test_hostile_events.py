"""CRC-valid events with wild values, and the public API asked to record them.

A checksum proves an event's bytes are the ones written, not that a sane program wrote them. Events
are crafted here with a correct CRC-32 (computed as journal/events/_convert.py does) and appended to a real
journal with py-lmdb; the CLI, run in a subprocess, must report a verify problem or a clean error,
never a traceback. The API must refuse the values that would make such events.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zlib

import msgpack
import pytest

from stepjournal import Journal
from stepjournal.errors import EventDecodeError, InvalidKeyError
from stepjournal.events._convert import decode_event  # private: raw event bytes, as stored

from lmdb_raw import items, put_raw
from cli_support import run_cli as _cli

RUN = "wild"
_REF = {"digest": "ab" * 32, "nbytes": 10, "stored_nbytes": 10, "compression": None}
_GENERATION = {
    "type": "generation_recorded", "v": 1, "session": "s", "run": RUN, "step": 3, "gen_index": 0, "mode": "train",
    "input_digest": None, "output": _REF, "input": None, "duration_s": 0.5, "policy": "p", "reason": "r", "ts": 2.0,
    "imported_from": None,
}
_SESSION = {
    "type": "session_opened", "v": 1, "session": "s", "run": RUN, "fingerprint": {"model": "m"},
    "library_version": "0", "host": "h", "pid": 1, "ts": 1.0,
}
WILD = [
    ("step", _GENERATION, {"step": -1}),
    ("gen_index", _GENERATION, {"gen_index": 1 << 32}),
    ("ts", _GENERATION, {"ts": 1e300}),
    ("ts", _GENERATION, {"ts": math.nan}),
    ("ts", _GENERATION, {"ts": -math.inf}),
    ("duration_s", _GENERATION, {"duration_s": math.nan}),
    ("nbytes", _GENERATION, {"output": {**_REF, "nbytes": -5}}),
    ("digest", _GENERATION, {"output": {**_REF, "digest": "../../etc"}}),
    ("run key", _GENERATION, {"run": "a\x00b"}),
    ("fingerprint value model", _SESSION, {"fingerprint": {"model": math.nan}}),
    ("ts", _SESSION, {"ts": math.inf}),
    ("pid", _SESSION, {"pid": -1}),
]


def craft(body: dict) -> bytes:
    """An event's bytes with a valid checksum: the CRC-32 of the map packed without it, as the writer does."""
    body = dict(body)
    body["crc32"] = zlib.crc32(msgpack.packb(body, use_bin_type=True))
    return msgpack.packb(body, use_bin_type=True)


@pytest.mark.parametrize("field, base, change", WILD, ids=[f"{w[0]}={list(w[2].values())[0]!r}" for w in WILD])
def test_a_crc_valid_event_with_a_wild_value_is_an_event_decode_error_naming_seq_and_field(field, base, change):
    with pytest.raises(EventDecodeError, match=rf"event #42 .*{field}"):
        decode_event(craft({**base, **change}), seq=42)


def _journal_with(tmp_path, *bodies: dict) -> tuple[str, list]:
    path = str(tmp_path / "journal")
    with Journal(path, run=RUN) as journal:
        journal.record(1, {"x": 1})
        first = journal.last_seq() + 1
    seqs = list(range(first, first + len(bodies)))
    for seq, body in zip(seqs, bodies):
        put_raw(path, "events", seq.to_bytes(8, "big"), craft(body))
    return path, seqs


CLI_WILD = [{"step": -1}, {"gen_index": 1 << 32}, {"ts": 1e300}, {"ts": math.nan}, {"duration_s": math.inf}]


def test_the_cli_reports_wild_events_instead_of_a_traceback(tmp_path):
    path, seqs = _journal_with(tmp_path, *({**_GENERATION, **change} for change in CLI_WILD))
    done = _cli("verify", "--json", path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    problems = json.loads(done.stdout)["problems"]
    assert [(p["kind"], p["where"]) for p in problems] == [("event", f"#{seq}") for seq in seqs]
    for problem, change in zip(problems, CLI_WILD):
        assert next(iter(change)) in problem["detail"]
    for command in (["runs", "--json"], ["audit", "--json"], ["reindex"]):
        done = _cli(*command, path)
        assert "Traceback" not in done.stderr, f"{command}: {done.stderr[-3000:]}"
        assert done.returncode == 1 and f"event #{seqs[0]}" in done.stderr and "step=-1" in done.stderr, done.stderr
    stored = dict(items(path, "events"))
    assert [stored[seq.to_bytes(8, "big")] for seq in seqs] == [craft({**_GENERATION, **c}) for c in CLI_WILD]


def test_a_session_with_a_nan_fingerprint_in_the_journal_is_reported_by_verify_and_runs(tmp_path):
    path, (seq,) = _journal_with(tmp_path, {**_SESSION, "fingerprint": {"model": math.nan}})
    done = _cli("verify", "--json", path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert json.loads(done.stdout)["problems"][0]["where"] == f"#{seq}"
    done = _cli("runs", "--json", path)
    assert "Traceback" not in done.stderr and (done.returncode == 0 or f"event #{seq}" in done.stderr), done.stderr


# -- the public API ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1 << 64, -(1 << 63) - 1], ids=repr)
def test_a_fingerprint_the_journal_cannot_store_and_compare_is_refused_before_anything_is_opened(tmp_path, value):
    with pytest.raises(InvalidKeyError, match="fingerprint value seed"):
        Journal(str(tmp_path / "journal"), fingerprint={"seed": value})
    assert not (tmp_path / "journal").exists()


@pytest.mark.parametrize("duration", [math.nan, math.inf, -1.0], ids=repr)
def test_a_nan_infinite_or_negative_duration_is_refused_and_nothing_is_recorded(tmp_path, duration):
    with Journal(str(tmp_path / "journal"), run=RUN) as journal:
        with pytest.raises(InvalidKeyError, match="duration_s"):
            journal.record(1, {"x": 1}, duration_s=duration)
        with pytest.raises(InvalidKeyError, match="duration_s"):
            journal.record_bypass(2, duration_s=duration)
        assert journal.recorded_steps() == [] and journal.verify() == []
        journal.record(1, {"x": 1}, duration_s=0.25)  # the journal is unharmed
        assert journal.recorded_steps() == [1]


def test_a_reason_with_a_lone_surrogate_is_refused_with_a_typed_error(tmp_path):
    with Journal(str(tmp_path / "journal"), run=RUN) as journal:
        with pytest.raises(InvalidKeyError, match="reason"):
            journal.record_refusal(1, reason="bad \udc80 text")


_COMPILES_NOTHING = """
import sys
import msgpack
from stepjournal.events._convert import decode_event
from stepjournal.errors import EventDecodeError
ran = []
sys.addaudithook(lambda event, args: ran.append(event) if event in ("compile", "exec") else None)
body = {"type": "generation_recorded", "v": 1, "session": "s", "run": "r", "step": 3, "gen_index": 0,
        "mode": "train", "input_digest": None, "output": {"digest": 7}, "input": None, "duration_s": 0.5,
        "policy": "p", "reason": "r", "ts": 2.0, "imported_from": None}
for raw in (msgpack.packb(body), msgpack.packb({**body, "output": {"digest": "ab" * 32, "nbytes": "x"}})):
    try:
        decode_event(raw)
    except EventDecodeError:
        pass
print(ran)
"""


def test_the_first_event_decoded_in_a_fresh_process_compiles_no_code():
    """cattrs builds hooks from source on first use; the journal builds them at import, so a read compiles nothing."""
    done = subprocess.run([sys.executable, "-c", _COMPILES_NOTHING], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
