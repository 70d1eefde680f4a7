"""Imported history is checked, never trusted: a bundle or a pull cannot credit the journal's own records to
another journal, cannot pass missing payloads off as released, cannot skip a selection, cannot change what the
journal already replays, and names events by this journal's own seqs. Each test builds the crafted or ordinary
bundle or remote itself and ends with the target's own records intact, replaying bit for bit, pushed whole and
`verify` clean (or the import refused with its typed error)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import msgpack
import pytest
import torch

from stepjournal import Journal, journaled
from stepjournal.errors import ImportClaimError, ImportConflictError
from stepjournal.events import EventsImported, GenerationRecorded, PayloadsReleased
from stepjournal.sharing import clone, export_bundle, import_bundle, pull, push, verify_bundle
from stepjournal.upkeep import Retention, compact, prune
from stepjournal.events._convert import encode_event  # private: raw event bytes, as stored
from stepjournal.base._digest import digest_bytes  # private: digests as the store computes them
from stepjournal.sharing._remote import journal_id  # private: the remote layout
from stepjournal.policies import ReplayMissError

BIN = os.path.dirname(sys.executable)


def record(path, steps, *, run="exp", seed=0, stages=("generate",)):
    """Record `steps` of `run` (each stage a call); returns {(stage, step): output}."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    with Journal(str(path), run=run) as journal:
        calls = {stage: journaled(lambda prompts: {"ids": torch.randn(3, 5, generator=gen, dtype=torch.float64)},
                                  journal, "cache", stage=stage) for stage in stages}
        for step in steps:
            for stage, call in calls.items():
                out[(stage, step)] = call(prompts=f"{stage} {step}", step=step)
    return out


def replay(path, steps, *, run="exp", stage="generate"):
    """What a replay of `steps` serves (the generator must not run)."""
    def generator(prompts):
        raise AssertionError("a replay must not generate")

    with Journal(str(path), run=run) as journal:
        call = journaled(generator, journal, "replay", stage=stage)
        return {step: call(prompts=f"{stage} {step}", step=step) for step in steps}


def entries(path):
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def craft(path, change):
    """Rewrite the bundle at `path`: `change(source, events, segment)` edits a segment's events ([seq, bytes])
    and its dict in place; the head is made to match (digest, size, count), as a hostile teammate would."""
    found = entries(path)
    for name in [n for n in found if n.startswith("heads/")]:
        head = json.loads(found[name])
        source = head["source"]
        for entry in head["segments"]:
            segment = msgpack.unpackb(found[entry["name"]], raw=False)
            change(source, segment["events"], segment)
            body = msgpack.packb(segment, use_bin_type=True)
            del found[entry["name"]]
            first, last = segment["events"][0][0], segment["events"][-1][0]
            entry.update(name=f"segments/{source}/{first:020d}-{last:020d}.msgpack", first=first, last=last,
                         count=len(segment["events"]), nbytes=len(body), digest=digest_bytes(body).hex())
            found[entry["name"]] = body
        head["last_seq"] = head["segments"][-1]["last"]
        found[name] = json.dumps(head).encode()
    os.unlink(path)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for name, data in found.items():
            z.writestr(name, data)


def own_intact(path, recorded, remote):
    """The target's own records replay bit for bit, verify is clean, and a push sends every one of them."""
    got = replay(path, sorted({s for (_stage, s) in recorded}), run="mine")
    for (_stage, step), value in recorded.items():
        assert torch.equal(got[step]["ids"], value["ids"])
    with Journal(str(path), readonly=True) as journal:
        assert journal.verify() == []
        own = [seq for seq, _raw in journal.raw_events()]
    push(str(path), remote)
    copy = os.path.join(os.path.dirname(remote[len("file://"):]), "copy")
    clone(remote, copy)
    with Journal(copy, readonly=True) as journal:
        pulled = {r.origin_seq for r in journal.audit() if r.origin_journal is not None}
    with Journal(str(path), readonly=True) as journal:
        mine = journal_id(journal)
        calls = {r.seq for r in journal.audit() if r.origin_journal is None}
    assert calls <= pulled and calls <= set(own), "every call the target recorded itself was pushed"
    return mine


# -- provenance is derived, never imported --------------------------------------------------------------------
def test_a_provenance_marker_inside_a_segment_is_refused_and_cannot_credit_the_targets_records_elsewhere(tmp_path):
    target, source = tmp_path / "target", tmp_path / "source"
    recorded = record(target, [1, 2], run="mine")
    record(source, [1, 2], run="theirs", seed=1)
    export_bundle(str(source), tmp_path / "x.bundle")

    def marker(_source, events, _segment):
        # "the next 1000 events are journal f...f's": every event the target records afterwards would read as imported
        claim = EventsImported(source="f" * 32, origin="bundle:x", source_first=1, source_last=1000, ts=1.0)
        events.append([events[-1][0] + 1, encode_event(claim)])

    craft(tmp_path / "x.bundle", marker)
    with pytest.raises(ImportClaimError, match="EventsImported marker .* never taken from a segment") as refused:
        import_bundle(tmp_path / "x.bundle", str(target))
    assert refused.value.segment.startswith("segments/") and "EventsImported" in refused.value.claim
    assert [p.kind for p in verify_bundle(tmp_path / "x.bundle")[1]] == ["claim"]
    recorded.update(record(target, [3], run="mine", seed=2))  # recorded after the refusal: its own, and pushed
    with Journal(str(target), readonly=True) as journal:
        assert not list(journal.events(types=[EventsImported]))  # nothing of the bundle was committed
    own_intact(target, recorded, f"file://{tmp_path}/remote/r")


def test_a_released_list_no_release_proves_is_refused_and_verify_says_the_bundle_is_not_whole(tmp_path):
    source = tmp_path / "source"
    record(source, [1, 2, 3], run="theirs")
    export_bundle(str(source), tmp_path / "x.bundle")
    found = entries(tmp_path / "x.bundle")
    with Journal(str(source), readonly=True) as journal:
        digest = journal.lookup(2, run="theirs").event.output.digest

    def claim(_source, _events, segment):
        segment["released"] = [digest]  # "retention released it": no PayloadsReleased says so

    craft(tmp_path / "x.bundle", claim)
    with zipfile.ZipFile(tmp_path / "x.bundle") as z:
        kept = {n: z.read(n) for n in z.namelist() if n != f"payloads/{digest}"}
    os.unlink(tmp_path / "x.bundle")
    with zipfile.ZipFile(tmp_path / "x.bundle", "w") as z:
        for name, data in kept.items():
            z.writestr(name, data)
    assert f"payloads/{digest}" in found
    problems = verify_bundle(tmp_path / "x.bundle")[1]
    assert [p.kind for p in problems] == ["claim"] and digest[:16] in problems[0].detail
    with pytest.raises(ImportClaimError, match="as released, but no release of that journal names it"):
        import_bundle(tmp_path / "x.bundle", str(tmp_path / "target"))
    assert not (tmp_path / "target").exists()  # the refused import into a new folder left nothing


@pytest.mark.parametrize("forged", ["another call's record", "a record after it", "payloads not its record's"])
def test_a_release_that_does_not_match_the_record_it_names_is_refused(tmp_path, forged):
    """A pulled release deletes bytes: one naming a record of another call (its own call's entry left
    served, the named record's bytes gone), coming before its record, or listing payloads its record does
    not have would delete or hide what it does not own."""
    source = tmp_path / "source"
    record(source, [1, 2, 3], run="theirs")
    export_bundle(str(source), tmp_path / "x.bundle")
    with Journal(str(source), readonly=True) as journal:
        two, three = journal.lookup(2, run="theirs"), journal.lookup(3, run="theirs")

    def release(_source, events, _segment):
        named = {"another call's record": two.seq, "a record after it": events[-1][0] + 5,
                 "payloads not its record's": three.seq}[forged]
        digest = two.event.output.digest  # step 2's bytes, whatever the release claims to be
        fake = PayloadsReleased(run="theirs", step=3, gen_index=0, mode="train", record_seq=named,
                                released=[digest], retained=[], rule="keep_last=1", reason="forged", ts=1.0)
        events.append([events[-1][0] + 1, encode_event(fake)])

    craft(tmp_path / "x.bundle", release)
    with pytest.raises(ImportClaimError, match="holds a release .* nothing was imported"):
        import_bundle(tmp_path / "x.bundle", str(tmp_path / "target"))
    assert [p.kind for p in verify_bundle(tmp_path / "x.bundle")[1]] == ["claim"]
    mine = record(tmp_path / "target", [1], run="mine")
    with pytest.raises(ImportClaimError):
        import_bundle(tmp_path / "x.bundle", str(tmp_path / "target"))
    own_intact(tmp_path / "target", mine, f"file://{tmp_path}/remote/r")


def test_a_release_the_source_did_make_is_accepted_and_the_import_serves_only_what_was_kept(tmp_path):
    source = tmp_path / "source"
    recorded = record(source, [1, 2, 3, 4], run="theirs")
    with Journal(str(source), session=False) as journal:
        prune(journal, Retention(keep_last=2))
    export_bundle(str(source), tmp_path / "x.bundle")
    assert verify_bundle(tmp_path / "x.bundle")[1] == []
    import_bundle(tmp_path / "x.bundle", str(tmp_path / "target"))
    with Journal(str(tmp_path / "target"), readonly=True) as journal:
        assert journal.recorded_steps(run="theirs") == [3, 4] and journal.verify() == []
    got = replay(tmp_path / "target", [3, 4], run="theirs")
    assert all(torch.equal(got[s]["ids"], recorded[("generate", s)]["ids"]) for s in (3, 4))


# -- order does not matter ---------------------------------------------------------------------------------------
def test_selections_with_no_oldest_first_order_between_them_all_come_in(tmp_path):
    source = tmp_path / "source"
    record(source, [1, 2, 3], run="theirs")
    export_bundle(str(source), tmp_path / "odd.bundle", steps={1, 3})
    export_bundle(str(source), tmp_path / "even.bundle", steps={2})
    assert import_bundle(tmp_path / "odd.bundle", str(tmp_path / "t")).events_pulled == 3  # a session, steps 1 and 3
    assert import_bundle(tmp_path / "even.bundle", str(tmp_path / "t")).events_pulled == 1
    assert import_bundle(tmp_path / "even.bundle", str(tmp_path / "t")).events_pulled == 0
    with Journal(str(tmp_path / "t"), readonly=True) as journal:
        assert journal.recorded_steps(run="theirs") == [1, 2, 3] and journal.verify() == []


# -- an import never changes what the target already replays -----------------------------------------------------
def test_a_foreign_record_of_a_call_the_target_serves_is_refused_and_the_two_ways_out_work(tmp_path):
    target, source = tmp_path / "target", tmp_path / "source"
    recorded = record(target, [1, 2], run="mine")
    theirs = record(source, [2, 3], run="mine", seed=9)  # the same run key, other bytes at step 2
    export_bundle(str(source), tmp_path / "x.bundle")
    with pytest.raises(ImportConflictError, match=r"mine/train/generate step 2 index 0 .*--as NEW.*--keep ours") as err:
        import_bundle(tmp_path / "x.bundle", str(target))
    assert err.value.conflicts == (("mine", "train", "generate", 2, 0),) and err.value.count == 1
    with Journal(str(target), readonly=True) as journal:
        assert not list(journal.events(types=[EventsImported]))
    # way out 1: under another run key
    assert import_bundle(tmp_path / "x.bundle", str(target), runs="theirs").events_pulled == 3
    got = replay(target, [2, 3], run="theirs")
    assert all(torch.equal(got[s]["ids"], theirs[("generate", s)]["ids"]) for s in (2, 3))
    with Journal(str(target), readonly=True) as journal:
        marker = next(e for _s, e in journal.events(types=[EventsImported]))
        assert marker.runs == {"mine": "theirs"}
    own_intact(target, recorded, f"file://{tmp_path}/remote/r")


def test_keep_ours_imports_the_foreign_records_for_the_audit_and_the_target_serves_its_own(tmp_path):
    target, source = tmp_path / "target", tmp_path / "source"
    recorded = record(target, [1, 2], run="mine")
    record(source, [2, 3], run="mine", seed=9)
    export_bundle(str(source), tmp_path / "x.bundle")
    report = import_bundle(tmp_path / "x.bundle", str(target), keep="ours")
    assert report.kept == 1 and report.events_pulled == 3
    with Journal(str(target), readonly=True) as journal:
        assert journal.recorded_steps(run="mine") == [1, 2, 3]
        own = {r.seq for r in journal.audit() if r.origin_journal is None}
        assert journal.lookup(2, run="mine").seq in own
        assert [r.step for r in journal.audit() if r.origin_journal is not None] == [2, 3]
        served = journal.index_items()
    with Journal(str(target), session=False) as journal:
        journal.reindex()  # the projection rebuilt from the log keeps the same rule
        assert journal.index_items() == served and journal.lookup(2, run="mine").seq in own
    own_intact(target, recorded, f"file://{tmp_path}/remote/r")


def test_an_identical_record_is_no_conflict_and_a_pull_of_a_teammate_with_the_same_run_key_is_refused(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    recorded = record(a, [1, 2], run="exp")
    remote = f"file://{tmp_path}/remote/r"
    push(str(a), remote)
    clone(remote, str(b))
    export_bundle(str(b), tmp_path / "again.bundle")
    assert import_bundle(tmp_path / "again.bundle", str(b)).events_pulled == 0  # the same events: known
    record(c, [2], run="exp", seed=5)  # a teammate's journal under the same run key
    push(str(c), remote)
    with pytest.raises(ImportConflictError, match="exp/train/generate step 2"):
        pull(remote, str(b))
    got = replay(b, [1, 2], run="exp")
    assert all(torch.equal(got[s]["ids"], recorded[("generate", s)]["ids"]) for s in (1, 2))
    assert pull(remote, str(b), runs={"exp": "teammate"}).events_pulled == 2
    with Journal(str(b), readonly=True) as journal:
        assert journal.recorded_steps(run="teammate") == [2] and journal.verify() == []


def test_the_cli_names_the_conflict_and_takes_as_and_keep(tmp_path):
    target, source = tmp_path / "target", tmp_path / "source"
    record(target, [1], run="mine")
    record(source, [1], run="mine", seed=3)
    export_bundle(str(source), tmp_path / "x.bundle")
    sj = os.path.join(BIN, "stepjournal")
    refused = subprocess.run(f"{sj} import {tmp_path}/x.bundle {target}", shell=True, capture_output=True, text=True)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "mine/train/generate step 1 index 0" in refused.stderr and "--as" in refused.stderr
    renamed = subprocess.run(f"{sj} import {tmp_path}/x.bundle {target} --as mine=alice", shell=True,
                             capture_output=True, text=True)
    assert renamed.returncode == 0, renamed.stderr
    with Journal(str(target), readonly=True) as journal:
        assert journal.recorded_steps(run="alice") == [1]
    record(tmp_path / "other", [1], run="mine", seed=4)
    export_bundle(str(tmp_path / "other"), tmp_path / "z.bundle")
    kept = subprocess.run(f"{sj} import {tmp_path}/z.bundle {target} --keep ours", shell=True, capture_output=True,
                          text=True)
    assert kept.returncode == 0, kept.stderr
    assert "kept this journal's records of 1 call(s) served" in kept.stdout
    mixed = subprocess.run(f"{sj} import {tmp_path}/z.bundle {target} --as a --as b=c", shell=True,
                           capture_output=True, text=True)
    assert mixed.returncode == 2 and "--as takes NEW" in mixed.stderr


# -- releases and names stay true across a pull ------------------------------------------------------------------
def test_a_pulled_release_deletes_its_bytes_and_verify_stays_clean_after_prune_compact_push_pull(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    recorded = record(a, [1, 2, 3, 4, 5, 6], run="exp")
    remote = f"file://{tmp_path}/remote/r"
    push(str(a), remote)
    clone(remote, str(b))
    with Journal(str(a), session=False) as journal:
        prune(journal, Retention(keep_last=2))
    compact(str(a))
    push(str(a), remote)
    pull(remote, str(b))
    with Journal(str(b), readonly=True, run="exp") as journal:
        assert journal.verify() == [] and journal.recorded_steps() == [5, 6]
        stored = set(journal.payload_store.digests())
    assert len(stored) == 4  # steps 5 and 6: an output and an input each; the released bytes went with the release
    got = replay(b, [5, 6], run="exp")
    assert all(torch.equal(got[s]["ids"], recorded[("generate", s)]["ids"]) for s in (5, 6))


def test_a_pulled_release_keeps_bytes_a_record_of_the_target_still_uses(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    record(a, [1, 2, 3], run="exp")
    remote = f"file://{tmp_path}/remote/r"
    push(str(a), remote)
    clone(remote, str(b))
    with Journal(str(b), readonly=True, run="exp") as journal:
        shared = journal.load_output(journal.lookup(1))
    with Journal(str(b), run="own") as journal:  # the same bytes, recorded by the target itself
        journal.record(1, shared, input={"prompt": torch.ones(2)})
    with Journal(str(a), session=False) as journal:
        prune(journal, Retention(keep_last=1))
    push(str(a), remote)
    pull(remote, str(b))
    with Journal(str(b), readonly=True) as journal:
        assert journal.verify() == []
        assert torch.equal(journal.load_output(journal.lookup(1, run="own"))["ids"], shared["ids"])


def test_a_refused_replay_and_show_name_the_record_and_its_release_by_this_journals_seqs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    record(a, [1, 2, 3], run="exp", stages=("generate", "reward"))
    remote = f"file://{tmp_path}/remote/r"
    push(str(a), remote)
    clone(remote, str(b))  # here every event sits one seq later (the provenance marker first)
    with Journal(str(a), session=False) as journal:
        prune(journal, Retention(keep_last=1))
    push(str(a), remote)
    pull(remote, str(b))
    with Journal(str(b), readonly=True) as journal:
        record_seq = next(s for s, e in journal.events(types=[GenerationRecorded])
                          if e.step == 1 and e.stage == "generate")
        release_seq = next(s for s, e in journal.events(types=[PayloadsReleased])
                           if e.step == 1 and e.stage == "generate")
        with Journal(str(a), readonly=True) as source:
            source_seq = next(s for s, e in source.events(types=[GenerationRecorded])
                              if e.step == 1 and e.stage == "generate")
    assert record_seq != source_seq
    shown = subprocess.run([os.path.join(BIN, "stepjournal"), "show", str(b), "1"], capture_output=True, text=True)
    assert shown.returncode == 1 and f"(event #{record_seq}); its payloads were pruned by event #{release_seq}" in shown.stderr
    with pytest.raises(ReplayMissError) as refused:
        replay(b, [1], run="exp")
    assert f"its record (event #{record_seq}) was pruned by event #{release_seq}" in str(refused.value)
    # the audit names the record by the seq here too (the source's seq only as the origin), both readers
    listed = subprocess.run([os.path.join(BIN, "stepjournal"), "audit", str(b), "--json"], capture_output=True,
                            text=True)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    with Journal(str(b), readonly=True) as journal:
        records = [r.to_json() for r in journal.audit()]
    for found in (rows, records):
        release = next(r for r in found if r["seq"] == release_seq)
        assert (release["action"], release["source_seq"]) == ("released", record_seq)
        assert release["origin_seq"] is not None and release["origin_seq"] != release_seq
        assert next(r for r in found if r["seq"] == record_seq)["origin_seq"] == source_seq
    for found in (rows, records):  # the command line's streamed rows read the releases first
        assert next(r for r in found if r["seq"] == record_seq)["released_by"] == release_seq


# -- any order, any repetition: the journal the union gives ------------------------------------------------------
def _history(path):
    """A journal's history with a re-recorded call, replays, and a release (steps 1-4, two stages)."""
    record(path, [1, 2, 3, 4], run="exp", stages=("generate", "reward"))
    with Journal(str(path), run="exp") as journal:
        journal.record(2, {"ids": torch.full((3, 5), 7.0, dtype=torch.float64)})  # step 2 recorded again
        again = journaled(lambda prompts: None, journal, "replay")
        again(prompts="generate 3", step=3)
    with Journal(str(path), session=False) as journal:
        prune(journal, Retention(keep_last=3))  # step 1 of each stage goes


def _state(path):
    """What an import must give whatever the order: records by origin, lookups, provenance, payloads."""
    with Journal(str(path), readonly=True) as journal:
        raws = dict(journal.raw_events())
        audit = journal.audit()
        origin = {r.seq: (r.origin_journal, r.origin_seq) for r in audit}
        records = {}
        for seq, event in journal.events(types=[EventsImported]):
            for k in range(event.source_last - event.source_first + 1):
                records[(event.source, event.source_first + k)] = bytes(raws[seq + 1 + k])
        lookups = {}
        for stage in ("generate", "reward"):
            for step in journal.recorded_steps(run="exp", stage=stage):
                lookups[(stage, step)] = origin[journal.lookup(step, run="exp", stage=stage).seq]
        provenance = sorted((r.origin_journal, r.origin_seq, r.action, r.stage, r.step) for r in audit)
        assert journal.verify() == []
        return records, lookups, provenance, sorted(journal.payload_store.digests())


def test_the_selections_of_one_journal_in_every_order_or_twice_give_the_journal_their_union_gives(tmp_path):
    import itertools
    import random

    source = tmp_path / "source"
    _history(source)
    selections = {"odd": {"steps": {1, 3}}, "two": {"steps": {2}}, "four": {"steps": {4}},
                  "reward": {"stages": {"reward"}}, "mid": {"steps": {2, 3}}}
    for name, chosen in selections.items():
        export_bundle(str(source), tmp_path / f"{name}.bundle", **chosen)
    export_bundle(str(source), tmp_path / "union.bundle")
    import_bundle(tmp_path / "union.bundle", str(tmp_path / "union"))
    expected = _state(tmp_path / "union")
    assert len(expected[1]) == 6 and ("generate", 1) not in expected[1]  # step 1 released; 2-4 of two stages
    rng = random.Random(27)
    orders = []
    for first in itertools.permutations(["odd", "two", "four"]):
        rest = ["reward", "mid"]
        order = list(first)
        for name in rest:
            order.insert(rng.randrange(len(order) + 1), name)
        orders.append(order)
    orders.append(list(selections) + list(selections)[::-1])  # every one twice
    for i, order in enumerate(orders):
        target = tmp_path / f"t{i}"
        for name in order:
            import_bundle(tmp_path / f"{name}.bundle", str(target))
        assert _state(target) == expected, order
