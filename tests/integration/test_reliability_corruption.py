"""Corruption: damaged bytes are detected by `verify` and by replay, and never served silently.

Damage is made with LMDB itself (tests/lmdb_raw.py) or by editing data.mdb on disk; nothing is
mocked. A replay of a damaged record raises a typed `IntegrityError` naming the step, or, with
``on_corrupt="regenerate"``, generates the call again and journals why.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import stat

import pytest

from stepjournal import Journal
from stepjournal.errors import EventDecodeError, IntegrityError
from stepjournal.events import CallRefused, CallBypassed, GenerationRecorded, ReplayServed, SessionOpened
from stepjournal.events._convert import decode_event, encode_event  # private: raw event bytes, as stored
from stepjournal.adapters import journaled

from cli_support import run_cli
from lmdb_raw import flip_byte, items, put_raw
from reliability_support import expected_output, report, same_output, worker_context
from reliability_workers import inspect_journal

RUN = "damage"
SMALL = (3_000, 40_000, 9_000, 120_000)


def _generate(step: int) -> dict:
    return expected_output(step, SMALL)


def _build(path: str, steps: int = 8, compression: str | None = None) -> None:
    """A journal of `steps` calls recorded through the engine, plus a replay, a bypass and a refusal."""
    with Journal(path, run=RUN, fingerprint={"model": "m"}, compression=compression) as journal:
        rollout = journaled(_generate, journal, "cache", input_of=lambda step: {"prompt": f"p{step}"})
        for step in range(1, steps + 1):
            rollout(step=step)
        journal.record_bypass(1, mode="validate")
        journal.record_refusal(2, reason="example refusal")
    with Journal(path, run=RUN, fingerprint={"model": "m"}) as journal:
        journaled(_generate, journal, "cache", input_of=None)(step=1)  # a replay, in a second session


def _replay(path: str, step: int, on_corrupt: str = "error"):
    with Journal(path, run=RUN, fingerprint={"model": "m"}) as journal:
        rollout = journaled(_generate, journal, "cache", input_of=None, on_corrupt=on_corrupt)
        value = rollout(step=step)
        return value, rollout.last_outcome


# -- events ----------------------------------------------------------------------------------------
def _sample_events(tmp_path) -> list:
    path = str(tmp_path / "sample")
    _build(path, steps=2)
    with Journal(path, readonly=True) as journal:
        events = [ev for _, ev in journal.events()]
    kinds = {type(ev) for ev in events}
    assert {SessionOpened, GenerationRecorded, ReplayServed, CallBypassed, CallRefused} <= kinds
    return events


def test_every_single_byte_change_of_every_event_type_is_detected(tmp_path):
    """Each byte of each kind of stored event, changed three ways: the decoder refuses every one."""
    cases = 0
    for event in _sample_events(tmp_path):
        good = encode_event(event)
        assert decode_event(good) == event
        for i in range(len(good)):
            for change in (lambda b: b ^ 0xFF, lambda b: b ^ 0x01, lambda b: (b + 1) & 0xFF):
                bad = bytearray(good)
                bad[i] = change(bad[i])
                with pytest.raises(EventDecodeError):
                    decode_event(bytes(bad), seq=7)
                cases += 1
    report("corruption_event_bytes", single_byte_changes_detected=cases, undetected=0)


def test_random_flips_in_stored_events_are_found_by_verify_and_by_replay(tmp_path):
    path = str(tmp_path / "journal")
    _build(path)
    with Journal(path, run=RUN, readonly=True) as journal:
        targets = [(seq, ev.step) for seq, ev in journal.events(types=[GenerationRecorded]) if ev.output]
    rng = random.Random(4)
    flips = 0
    for seq, step in rng.sample(targets, 6):
        key = seq.to_bytes(8, "big")
        original = dict(items(path, "events"))[key]
        for _ in range(4):
            flip_byte(path, "events", key=key, offset=rng.randrange(len(original)))
            with Journal(path, run=RUN, readonly=True) as journal:
                problems = journal.verify()
                assert [p.where for p in problems if p.kind == "event"] == [f"#{seq}"]
                with pytest.raises(IntegrityError, match=f"step {step}") as info:
                    journal.lookup(step)
                assert info.value.step == step
            with pytest.raises(IntegrityError, match=f"step {step}"):
                _replay(path, step)
            put_raw(path, "events", key, original)
            flips += 1
    with Journal(path, run=RUN, readonly=True) as journal:
        refusals = [ev for _, ev in journal.events(types=[CallRefused]) if "damaged" in ev.reason]
        assert len(refusals) == flips  # each refused replay was journaled with its reason
        assert journal.verify() == []
    report("corruption_event_flips", flips_in_lmdb=flips, detected_by_verify=flips, detected_by_replay=flips)


# -- payloads --------------------------------------------------------------------------------------
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_random_flips_in_stored_payloads_are_found_by_verify_and_by_replay(tmp_path, compression):
    path = str(tmp_path / "journal")
    _build(path, compression=compression)
    with Journal(path, run=RUN, readonly=True) as journal:
        outputs = {journal.lookup(s).event.output.digest: s for s in journal.recorded_steps()}
    rng = random.Random(5)
    flips = 0
    for digest, step in rng.sample(sorted(outputs.items()), 5):
        key = bytes.fromhex(digest)
        original = dict(items(path, "payloads"))[key]
        for _ in range(4):
            flip_byte(path, "payloads", key=key, offset=rng.randrange(len(original)))
            with Journal(path, run=RUN, readonly=True) as journal:
                (problem,) = journal.verify()
                assert problem.kind == "payload" and problem.where == digest and step in problem.steps
                with pytest.raises(IntegrityError, match=f"step {step}") as info:
                    journal.load_output(journal.lookup(step))
                assert info.value.step == step
            with pytest.raises(IntegrityError, match=f"step {step}"):
                _replay(path, step)
            put_raw(path, "payloads", key, original)
            flips += 1
    report(f"corruption_payload_flips_{compression or 'raw'}", flips_in_lmdb=flips, detected_by_verify=flips,
           detected_by_replay=flips)


def test_regenerate_instead_of_a_damaged_payload_journals_why_and_repairs_it(tmp_path):
    path = str(tmp_path / "journal")
    _build(path)
    with Journal(path, run=RUN, readonly=True) as journal:
        digest = journal.lookup(3).event.output.digest
    flip_byte(path, "payloads", key=bytes.fromhex(digest), offset=100)
    value, outcome = _replay(path, 3, on_corrupt="regenerate")
    assert outcome.action == "generated" and same_output(value, _generate(3))
    with Journal(path, run=RUN, readonly=True) as journal:
        recorded = journal.lookup(3)
        assert recorded.seq == outcome.seq and "damaged" in recorded.event.reason
        assert "does not match its digest" in recorded.event.reason
        # The regenerated output has the same content, so its bytes replaced the damaged copy.
        assert journal.verify() == []
    value, outcome = _replay(path, 3)
    assert outcome.action == "replayed" and same_output(value, _generate(3))


def test_regenerate_instead_of_a_damaged_event_journals_why_and_serves_the_new_record_next(tmp_path):
    path = str(tmp_path / "journal")
    _build(path)
    with Journal(path, run=RUN, readonly=True) as journal:
        seq = journal.lookup(5).seq
    flip_byte(path, "events", key=seq.to_bytes(8, "big"), offset=-20)
    value, outcome = _replay(path, 5, on_corrupt="regenerate")
    assert outcome.action == "generated" and same_output(value, _generate(5))
    assert "damaged" in outcome.source.event.reason and f"event #{seq}" in outcome.source.event.reason
    value, outcome = _replay(path, 5)
    assert outcome.action == "replayed" and outcome.source.seq > seq
    with Journal(path, run=RUN, readonly=True) as journal:
        # The log is append-only: the damaged event stays, and verify keeps saying so.
        assert [p.where for p in journal.verify()] == [f"#{seq}"]


def test_one_damaged_event_does_not_stop_replays_of_other_steps(tmp_path):
    path = str(tmp_path / "journal")
    _build(path)
    with Journal(path, run=RUN, readonly=True) as journal:
        seq = journal.lookup(2).seq
    flip_byte(path, "events", key=seq.to_bytes(8, "big"), offset=-30)
    value, outcome = _replay(path, 6)
    assert outcome.action == "replayed" and same_output(value, _generate(6))


# -- files -----------------------------------------------------------------------------------------
def _inspect(path: str, readonly: bool, out: str) -> dict:
    """Run `inspect_journal` in a child; a child killed by a signal fails the test with its name."""
    ctx = worker_context()
    proc = ctx.Process(target=inspect_journal, args=(path, readonly, out, RUN, SMALL))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0, f"reading the damaged journal killed the process ({proc.exitcode})"
    with open(out, encoding="utf-8") as fh:
        return json.load(fh)


def _built_and_truncated(path: str, keep) -> int:
    """A built journal at `path` whose data.mdb is cut to `keep(its size)` bytes; returns that length."""
    _build(path)
    data = os.path.join(path, "data.mdb")
    length = keep(os.path.getsize(data))
    with open(data, "r+b") as fh:
        fh.truncate(length)
    return length


@pytest.mark.parametrize("fraction", [0.0, 0.0001, 0.25, 0.5, 0.9, 0.999])
def test_a_truncated_data_file_is_refused_with_a_typed_error_naming_the_journal(tmp_path, fraction):
    path = str(tmp_path / "journal")
    _built_and_truncated(path, lambda size: int(size * fraction))
    for readonly in (True, False):
        result = _inspect(path, readonly, str(tmp_path / f"out{readonly}.json"))
        assert not result["opened"] and result["error"][0] in ("IntegrityError", "JournalError")
        assert path in result["error"][1]
    report("corruption_truncation_" + str(fraction), opens_refused=2)


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9])
def test_compact_of_a_truncated_data_file_is_refused_in_one_line(tmp_path, fraction):
    """compact reads the journal outside a `Journal`: its data.mdb is checked before a page is mapped (SIGBUS)."""
    path = str(tmp_path / "journal")
    kept = _built_and_truncated(path, lambda size: int(size * fraction) // 4096 * 4096)
    for extra in ([], ["--to", str(tmp_path / "copy")]):
        result = run_cli("compact", path, *extra)
        assert result.returncode == 1 and "truncated" in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "copy") and os.path.getsize(os.path.join(path, "data.mdb")) == kept


def test_a_missing_lock_file_is_recreated_and_nothing_is_lost(tmp_path):
    path = str(tmp_path / "journal")
    _build(path)
    os.unlink(os.path.join(path, "lock.mdb"))
    for readonly in (True, False):
        result = _inspect(path, readonly, str(tmp_path / f"out{readonly}.json"))
        assert result["opened"] and result["problems"] == [] and result["refused"] == []
        assert result["served_ok"] == 8 and result["served_wrong"] == []
    lock = os.path.join(path, "lock.mdb")
    assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600


def test_a_garbage_lock_file_is_rebuilt_and_nothing_is_lost(tmp_path):
    path = str(tmp_path / "journal")
    _build(path)
    lock = os.path.join(path, "lock.mdb")
    with open(lock, "r+b") as fh:
        fh.write(os.urandom(os.path.getsize(lock)))
    result = _inspect(path, False, str(tmp_path / "out.json"))
    assert result["opened"] and result["problems"] == [] and result["served_ok"] == 8


def _flip_anywhere(path: str, rng: random.Random, count: int) -> None:
    data = os.path.join(path, "data.mdb")
    size = os.path.getsize(data)
    with open(data, "r+b") as fh:
        for _ in range(count):
            offset = rng.randrange(size)
            fh.seek(offset)
            byte = fh.read(1)[0]
            fh.seek(offset)
            fh.write(bytes([byte ^ (1 << rng.randrange(8))]))


def flips_anywhere(tmp_path, trials: int, seed: int) -> dict:
    """Flip random bits anywhere in data.mdb (LMDB's own pages too) and classify what a reader gets."""
    template = str(tmp_path / "template")
    _build(template, steps=12)
    rng = random.Random(seed)
    outcome = {"trials": 0, "refused_at_open": 0, "found_by_verify_or_replay": 0, "harmless": 0,
               "served_wrong": 0, "untyped_error": 0, "process_killed": 0}
    ctx = worker_context()
    for trial in range(trials):
        path = str(tmp_path / f"t{trial}")
        shutil.copytree(template, path)
        _flip_anywhere(path, rng, 1 + trial % 3)
        out = str(tmp_path / f"t{trial}.json")
        proc = ctx.Process(target=inspect_journal, args=(path, True, out, RUN, SMALL))
        proc.start()
        proc.join(120)
        outcome["trials"] += 1
        if proc.exitcode != 0:
            outcome["process_killed"] += 1
            outcome.setdefault("signals", []).append(signal.Signals(-proc.exitcode).name)
        else:
            with open(out, encoding="utf-8") as fh:
                result = json.load(fh)
            if result["served_wrong"]:
                outcome["served_wrong"] += 1
            elif result["error"] and result["error"][0].startswith("UNTYPED"):
                outcome["untyped_error"] += 1
                outcome.setdefault("untyped", []).append(result["error"])
            elif not result["opened"]:
                outcome["refused_at_open"] += 1
            elif result["problems"] or result["refused"]:
                outcome["found_by_verify_or_replay"] += 1
            else:
                outcome["harmless"] += 1  # the flip hit free or unused space: every byte served is right
        shutil.rmtree(path)
    return outcome


def test_random_bit_flips_anywhere_in_the_data_file_are_never_served_silently(tmp_path):
    outcome = flips_anywhere(tmp_path, 40, seed=11)
    report("corruption_anywhere", **outcome)
    assert outcome["served_wrong"] == 0 and outcome["untyped_error"] == 0


@pytest.mark.soak
def test_random_bit_flips_anywhere_in_the_data_file_soak(tmp_path):
    outcome = flips_anywhere(tmp_path, 600, seed=12)
    report("corruption_anywhere_soak", **outcome)
    assert outcome["served_wrong"] == 0 and outcome["untyped_error"] == 0
