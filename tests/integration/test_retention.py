"""Retention: the rules, pruning, what readers and policies see after it, verify, compaction, the CLI verbs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import CompactError, JournalBusyError, JournalFullError, RetentionConflictError, RetentionError
from stepjournal.events import PayloadsReleased
from stepjournal.upkeep import Retention, compact, find_release, plan_retention, prune
from stepjournal.adapters.cli import main
from stepjournal.policies import Engine, ReplayMissError, StepRanges


def _value(step: int, n: int = 64) -> dict:
    return {"ids": torch.arange(n) + step}


def _recorded(path: str, steps, **kwargs) -> None:
    with Journal(path, **kwargs) as journal:
        for step in steps:
            journal.record(step, _value(step))


def _released_steps(plan) -> list:
    return sorted({r.step for r in plan.releases})


# -- the rules (pure planning) ----------------------------------------------------------------------
def test_keep_last_releases_every_step_below_the_last_n(jpath):
    _recorded(jpath, range(1, 11))
    with Journal(jpath, readonly=True) as journal:
        plan = plan_retention(journal.events(), Retention(keep_last=3))
    assert _released_steps(plan) == [1, 2, 3, 4, 5, 6, 7]
    assert plan.kept_steps == {("default", "train", "generate"): 3}
    assert "not among the last 3" in plan.releases[0].reason


def test_pinned_steps_stay_whatever_keep_last_says(jpath):
    _recorded(jpath, range(1, 11))
    with Journal(jpath, readonly=True) as journal:
        plan = plan_retention(journal.events(), Retention(keep_last=2, pin=StepRanges("1-2,5")))
    assert _released_steps(plan) == [3, 4, 6, 7, 8]


def test_a_step_some_session_replayed_from_stays_unless_told_otherwise(jpath):
    _recorded(jpath, range(1, 6))
    with Journal(jpath) as journal:
        journal.record_replay(9, journal.lookup(2))
        kept = plan_retention(journal.events(), Retention(keep_last=1))
        dropped = plan_retention(journal.events(), Retention(keep_last=1, keep_replayed=False))
    assert _released_steps(kept) == [1, 3, 4]
    assert _released_steps(dropped) == [1, 2, 3, 4]


def test_max_bytes_releases_the_smallest_steps_until_the_rest_fits(jpath):
    _recorded(jpath, range(1, 11))
    with Journal(jpath, readonly=True) as journal:
        size = journal.lookup(1).event.output.stored_nbytes
        plan = plan_retention(journal.events(), Retention(max_bytes=4 * size))
    assert _released_steps(plan) == [1, 2, 3, 4, 5, 6]
    assert plan.released_bytes == 6 * size


def test_rules_apply_per_run_and_mode_and_only_where_they_select(jpath):
    with Journal(jpath, run="a") as journal:
        for step in range(1, 5):
            journal.record(step, _value(step))
            journal.record(step, _value(step + 100), mode="validate")
    with Journal(jpath, run="b") as journal:
        for step in range(1, 5):
            journal.record(step, _value(step + 200))
    with Journal(jpath, readonly=True) as journal:
        every = plan_retention(journal.events(), Retention(keep_last=1))
        only = plan_retention(journal.events(), Retention(keep_last=1, run="a", mode="validate"))
    assert sorted({(r.run, r.mode) for r in every.releases}) == [("a", "train"), ("a", "validate"), ("b", "train")]
    assert {(r.run, r.mode) for r in only.releases} == {("a", "validate")}


def test_each_stage_is_kept_on_its_own_and_a_rule_can_select_one_stage(jpath):
    with Journal(jpath) as journal:
        for step in range(1, 5):
            journal.record(step, _value(step))
            journal.record(step, _value(step + 300), stage="reward", input={"batch": step})
    with Journal(jpath, readonly=True) as journal:
        every = plan_retention(journal.events(), Retention(keep_last=1))
        reward = plan_retention(journal.events(), Retention(keep_last=1, stage="reward"))
    assert sorted((r.stage, r.step) for r in every.releases) == [
        ("generate", 1), ("generate", 2), ("generate", 3), ("reward", 1), ("reward", 2), ("reward", 3)]
    assert every.kept_steps == {("default", "train", "generate"): 1, ("default", "train", "reward"): 1}
    assert sorted((r.stage, r.step) for r in reward.releases) == [("reward", 1), ("reward", 2), ("reward", 3)]
    assert "stage=reward" in reward.rule
    assert main(["prune", jpath, "--keep-last", "2", "--stage", "reward"]) == 0
    with Journal(jpath, readonly=True) as journal:
        assert journal.recorded_steps() == [1, 2, 3, 4]
        assert journal.recorded_steps(stage="reward") == [3, 4]
        assert journal.verify() == []


def test_a_payload_a_kept_step_shares_with_a_released_one_is_never_deleted(jpath):
    shared = _value(0)
    with Journal(jpath) as journal:
        journal.record(1, shared, input={"prompt": torch.ones(3)})
        journal.record(2, _value(2), input={"prompt": torch.ones(3)})
        journal.record(3, shared)
        plan = prune(journal, Retention(keep_last=1))
        assert journal.lookup(1) is None and journal.lookup(2) is None
        assert torch.equal(journal.load_output(journal.lookup(3))["ids"], shared["ids"])
        first, second = plan.releases
        prompt = journal.prepare({"prompt": torch.ones(3)}).digest
        assert first.retained == (journal.lookup(3).event.output.digest,)  # step 3 still uses it
        assert first.released == (prompt,)  # the input both released steps shared goes once
        assert second.released == (journal.prepare(_value(2)).digest,) and second.retained == (prompt,)
        assert journal.verify() == []


def test_rules_that_would_release_everything_are_refused_unless_allowed(jpath):
    _recorded(jpath, range(1, 4))
    with Journal(jpath, session=False) as journal:
        before = journal.last_seq()
        with pytest.raises(RetentionError, match="would release every recorded step.*allow_release_all"):
            prune(journal, Retention(keep_last=0))
        assert journal.last_seq() == before and journal.recorded_steps() == [1, 2, 3]
        plan = prune(journal, Retention(keep_last=0, allow_release_all=True))
        assert _released_steps(plan) == [1, 2, 3] and journal.recorded_steps() == []


def test_conflicting_rules_are_refused_and_change_nothing(jpath):
    _recorded(jpath, range(1, 6))
    with Journal(jpath, session=False) as journal:
        before = journal.last_seq()
        with pytest.raises(RetentionConflictError, match="selected by 2 retention rule sets"):
            prune(journal, [Retention(keep_last=1), Retention(keep_last=2, mode="train")])
        size = journal.lookup(1).event.output.stored_nbytes
        with pytest.raises(RetentionConflictError, match="over max_bytes.*raise max_bytes or pin fewer"):
            prune(journal, Retention(max_bytes=size, pin={1, 2, 3}))
        assert journal.last_seq() == before and journal.recorded_steps() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({}, "keeps everything"),
        ({"keep_last": -1}, "keep_last=-1"),
        ({"keep_last": True}, "keep_last=True"),
        ({"max_bytes": "ten"}, "'ten' is not a size"),
        ({"keep_last": 1, "pin": 5}, "pin=5 is not a container"),
    ],
)
def test_malformed_rules_raise_a_typed_error_naming_the_value(kwargs, words):
    with pytest.raises(RetentionError, match=words):
        Retention(**kwargs)


def test_sizes_read_binary_units():
    assert Retention(max_bytes="10G").max_bytes == 10 << 30
    assert Retention(max_bytes="512 MiB").max_bytes == 512 << 20
    assert Retention(max_bytes=4096).max_bytes == 4096


# -- pruning: events stay, readers see it ------------------------------------------------------------
def test_pruning_appends_one_release_event_per_record_and_readers_stop_serving_it(jpath):
    _recorded(jpath, range(1, 6))
    with Journal(jpath, session=False) as journal:
        prune(journal, Retention(keep_last=2))
        released = [e for _, e in journal.events(types=[PayloadsReleased])]
        assert [e.step for e in released] == [1, 2, 3]
        assert all(e.rule == "keep_last=2 keep_replayed" for e in released)
        assert journal.recorded_steps() == [4, 5] and journal.step_count() == 2 and journal.nth_step(0) == 4
        assert journal.nearest_below(4) is None
        assert find_release(journal, 2)[1].step == 2 and find_release(journal, 5) is None
        incremental = (journal.index_items(), journal.rank_items())
        journal.reindex()
        assert (journal.index_items(), journal.rank_items()) == incremental
        assert journal.verify() == []
        rows = journal.audit()
        assert [r.released_by is not None for r in rows if r.action == "generated"] == [True] * 3 + [False] * 2
        assert [r.step for r in rows if r.action == "released"] == [1, 2, 3]


def test_a_second_prune_with_the_same_rules_releases_nothing(jpath):
    _recorded(jpath, range(1, 6))
    with Journal(jpath, session=False) as journal:
        prune(journal, Retention(keep_last=2))
        seq = journal.last_seq()
        assert prune(journal, Retention(keep_last=2)).empty and journal.last_seq() == seq


def test_dry_run_plans_and_changes_nothing(jpath):
    _recorded(jpath, range(1, 6))
    with Journal(jpath, session=False) as journal:
        seq = journal.last_seq()
        assert _released_steps(prune(journal, Retention(keep_last=2), dry_run=True)) == [1, 2, 3]
        assert journal.last_seq() == seq and journal.recorded_steps() == [1, 2, 3, 4, 5]


def test_replay_of_a_pruned_step_refuses_naming_the_prune(jpath):
    _recorded(jpath, range(1, 6))
    with Journal(jpath, session=False) as journal:
        prune(journal, Retention(keep_last=2))
    with Journal(jpath) as journal:
        engine = Engine(journal, "replay")
        with pytest.raises(ReplayMissError, match=r"pruned by event #\d+ .*not among the last 2.*rule: keep_last=2"):
            engine.call(2, lambda: _value(2))
        assert engine.call(5, lambda: None).action == "replayed"


def test_cache_regenerates_a_pruned_step_and_records_it_again(jpath):
    _recorded(jpath, range(1, 6))
    with Journal(jpath, session=False) as journal:
        prune(journal, Retention(keep_last=2))
    with Journal(jpath) as journal:
        outcome = Engine(journal, "cache").call(1, lambda: _value(1))
        assert outcome.action == "generated"
        assert torch.equal(journal.load_output(journal.lookup(1))["ids"], _value(1)["ids"])
        assert find_release(journal, 1) is None and journal.verify() == []


def test_a_journal_with_retention_prunes_in_each_record_s_transaction(jpath):
    with Journal(jpath, retention=Retention(keep_last=3, pin={1})) as journal:
        for step in range(1, 9):
            seq_before = journal.last_seq()
            journal.record(step, _value(step))
            assert journal.recorded_steps()[-1] == step
            # The record, and a release; step 1's record opens the session too.
            assert journal.last_seq() - seq_before == (2 if step >= 5 or step == 1 else 1)
        assert journal.recorded_steps() == [1, 6, 7, 8]
        assert journal.verify() == []
        incremental = (journal.index_items(), journal.rank_items())
        journal.reindex()
        assert (journal.index_items(), journal.rank_items()) == incremental


def test_retention_while_recording_skips_a_rule_it_cannot_meet_and_goes_on(jpath):
    with Journal(jpath, retention=Retention(max_bytes=10)) as journal:
        for step in range(1, 4):
            journal.record(step, _value(step))
        assert journal.recorded_steps() == [1, 2, 3]


def test_retention_while_recording_sees_what_another_process_recorded(jpath):
    _recorded(jpath, range(1, 4))
    with Journal(jpath, retention=Retention(keep_last=2)) as journal:
        journal.record(10, _value(10))
        code = f"from stepjournal import Journal\nimport torch\nJournal({jpath!r}).record(11, {{'ids': torch.arange(3)}})"
        subprocess.run([sys.executable, "-c", code], check=True)
        journal.record(12, _value(12))
        assert journal.recorded_steps() == [11, 12] and journal.verify() == []


# -- verify ----------------------------------------------------------------------------------------------
def test_verify_reports_a_released_payload_still_stored_and_the_next_prune_deletes_it(jpath):
    _recorded(jpath, range(1, 6))
    with Journal(jpath, session=False) as journal:
        plan = prune(journal, Retention(keep_last=2))
        digest = plan.releases[0].released[0]
        journal.payload_store.put(bytes.fromhex(digest), journal.prepare(_value(1)).blob)
        problems = journal.verify()
        assert [(p.kind, p.where) for p in problems] == [("released_payload", digest)]
        assert "`stepjournal prune JOURNAL` (no rule: it releases nothing new) deletes it" in problems[0].detail
        assert prune(journal, Retention(keep_last=2)).leftover == (digest,)
        assert journal.verify() == []


def test_the_command_verify_names_for_a_released_payload_still_stored_works_as_typed(jpath):
    _recorded(jpath, range(1, 6))
    with Journal(jpath, session=False) as journal:
        digest = prune(journal, Retention(keep_last=2)).releases[0].released[0]
        journal.payload_store.put(bytes.fromhex(digest), journal.prepare(_value(1)).blob)
        steps = journal.recorded_steps()
    sj = os.path.join(os.path.dirname(sys.executable), "stepjournal")
    checked = subprocess.run(f"{sj} verify {jpath}", shell=True, capture_output=True, text=True)
    assert checked.returncode == 1 and "`stepjournal prune JOURNAL`" in checked.stdout + checked.stderr
    done = subprocess.run(f"{sj} prune {jpath}", shell=True, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "released 0 records" in done.stdout and "1 payloads an earlier prune released were still stored" in done.stdout
    assert subprocess.run(f"{sj} verify {jpath}", shell=True, capture_output=True).returncode == 0
    with Journal(jpath, readonly=True) as journal:
        assert journal.recorded_steps() == steps  # nothing new was released
    bare = subprocess.run(f"{sj} prune {jpath} --pin 1-3", shell=True, capture_output=True, text=True)
    assert bare.returncode == 2 and "--pin needs --keep-last N and/or --max-bytes SIZE" in bare.stderr


def test_verify_still_reports_a_kept_payload_that_is_gone(jpath):
    _recorded(jpath, range(1, 6))
    with Journal(jpath, session=False) as journal:
        prune(journal, Retention(keep_last=2))
        kept = journal.lookup(5).event.output.digest
        journal.payload_store.delete(bytes.fromhex(kept))
        assert [(p.kind, p.where) for p in journal.verify()] == [("missing_payload", kept)]


# -- compaction ------------------------------------------------------------------------------------------
def test_compact_gives_the_released_space_back_and_keeps_every_kept_record(jpath):
    with Journal(jpath) as journal:
        for step in range(1, 41):
            journal.record(step, {"x": torch.randn(20_000)})
        prune(journal, Retention(keep_last=4))
        kept = {s: journal.load_output(journal.lookup(s))["x"] for s in journal.recorded_steps()}
    result = compact(jpath)
    assert result.after_bytes < result.before_bytes / 4
    assert os.path.getsize(os.path.join(jpath, "data.mdb")) == result.after_bytes
    with Journal(jpath) as journal:
        assert journal.verify() == []
        assert all(torch.equal(journal.load_output(journal.lookup(s))["x"], x) for s, x in kept.items())
        journal.record(100, _value(100))  # and it records on
    assert not [n for n in os.listdir(jpath) if n.startswith(".compact-")]


def test_compact_refuses_while_another_process_has_the_journal_open(jpath):
    _recorded(jpath, range(1, 3))
    child = subprocess.Popen(
        [sys.executable, "-c", f"from stepjournal import Journal\nj = Journal({jpath!r}, readonly=True)\n"
         "print('open', flush=True)\ninput()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline() == "open\n"
        before = os.path.getsize(os.path.join(jpath, "data.mdb"))
        with pytest.raises(JournalBusyError, match="open in another process"):
            compact(jpath)
        assert os.path.getsize(os.path.join(jpath, "data.mdb")) == before
    finally:
        child.communicate("\n")
    compact(jpath)


def test_compact_refuses_while_this_process_has_the_journal_open(jpath):
    with Journal(jpath) as journal:
        journal.record(1, _value(1))
        with pytest.raises(JournalBusyError, match="open in this process"):
            compact(jpath)


def test_compact_into_another_folder_leaves_the_original_as_it_is(jpath, tmp_path):
    _recorded(jpath, range(1, 6))
    before = open(os.path.join(jpath, "data.mdb"), "rb").read()
    result = compact(jpath, to=tmp_path / "copy")
    assert open(os.path.join(jpath, "data.mdb"), "rb").read() == before
    with Journal(result.path, readonly=True) as copy:
        assert copy.recorded_steps() == [1, 2, 3, 4, 5] and copy.verify() == []
    with pytest.raises(CompactError, match="not an empty folder"):
        compact(jpath, to=tmp_path / "copy")


def test_a_compaction_the_disk_cuts_short_fails_and_leaves_the_journal_intact(jpath, tmp_path):
    with Journal(jpath) as journal:
        for step in range(1, 30):
            journal.record(step, {"x": torch.randn(20_000)})
    before = open(os.path.join(jpath, "data.mdb"), "rb").read()
    # A file-size limit in a child is a disk that fills up while the copy is written.
    code = (
        "import resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))\n"
        "from stepjournal.errors import StepJournalError\nfrom stepjournal.upkeep import compact\n"
        f"try:\n    compact({jpath!r}, to={str(tmp_path / 'small')!r})\n"
        "except StepJournalError as exc:\n    print(type(exc).__name__, exc)\n    sys.exit(3)\n"
        f"try:\n    compact({jpath!r})\n"
        "except StepJournalError as exc:\n    print(type(exc).__name__, exc)\n    sys.exit(4)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "CompactError" in done.stdout and "nothing was changed" in done.stdout
    assert not os.path.exists(tmp_path / "small")
    assert open(os.path.join(jpath, "data.mdb"), "rb").read() == before
    with Journal(jpath, readonly=True) as journal:
        assert journal.verify() == [] and len(journal.recorded_steps()) == 29


def test_compact_refuses_a_target_without_the_room_it_needs(jpath):
    _recorded(jpath, range(1, 3))
    # /dev/shm is a small tmpfs on most machines; a journal mapped larger than it cannot be copied
    # there only if it is larger, so the check is made against a size the target cannot hold.
    with Journal(jpath) as journal:
        journal.record(3, {"x": torch.zeros(1 << 16)})
    from stepjournal.upkeep import _compact  # private: the compaction's internals

    with pytest.raises(JournalFullError, match="needs up to .* free bytes"):
        _compact._MARGIN, saved = 1 << 62, _compact._MARGIN
        try:
            compact(jpath)
        finally:
            _compact._MARGIN = saved
    with Journal(jpath, readonly=True) as journal:
        assert journal.recorded_steps() == [1, 2, 3]


# -- the command line ------------------------------------------------------------------------------------
def test_the_prune_and_compact_verbs_release_and_give_space_back(jpath, capsys):
    _recorded(jpath, range(1, 21))
    assert main(["prune", jpath, "--keep-last", "5", "--pin", "1-3", "--dry-run"]) == 0
    assert "would release 12 records of 12 steps" in capsys.readouterr().out
    assert main(["prune", jpath, "--keep-last", "5", "--pin", "1-3"]) == 0
    assert "released steps 4-15" in capsys.readouterr().out
    assert main(["show", jpath, "4"]) == 1
    assert "its payloads were pruned by event" in capsys.readouterr().err
    assert main(["audit", jpath, "--action", "released", "--json"]) == 0
    assert main(["compact", jpath]) == 0
    assert "compacted" in capsys.readouterr().out
    assert main(["verify", jpath]) == 0


def test_the_prune_verb_refuses_bad_rules_with_one_line_naming_the_value(jpath, capsys):
    _recorded(jpath, range(1, 4))
    assert main(["prune", jpath, "--keep-last", "0"]) == 1
    assert "would release every recorded step" in capsys.readouterr().err
    assert main(["prune", jpath, "--max-bytes", "lots"]) == 2
    assert "'lots' is not a size" in capsys.readouterr().err
    assert main(["prune", jpath, "--pin", "1-x", "--keep-last", "1"]) == 2
    assert "--pin" in capsys.readouterr().err
    assert main(["prune", jpath, "--keep-last", "1", "--run", "nope"]) == 1
    assert "no run 'nope'" in capsys.readouterr().err
    with Journal(jpath, readonly=True) as journal:
        assert journal.recorded_steps() == [1, 2, 3]


# -- configs -----------------------------------------------------------------------------------------------
def test_an_engine_config_s_retention_key_applies_while_recording(jpath):
    from stepjournal.policies import load_config, open_engine

    engine = open_engine(load_config({"path": jpath, "policy": "cache", "retention": {"keep_last": 2, "pin": "1"}}))
    try:
        for step in range(1, 6):
            engine.call(step, lambda step=step: _value(step))
        assert engine.journal.recorded_steps() == [1, 4, 5]
    finally:
        engine.journal.close()


def test_a_bad_retention_key_in_a_config_is_a_config_error_naming_it(jpath):
    from stepjournal.policies import ConfigError, load_config

    with pytest.raises(ConfigError, match="keep_lats"):
        load_config({"path": jpath, "retention": {"keep_lats": 2}})
    with pytest.raises(ConfigError, match="keep_last=-2"):
        load_config({"path": jpath, "retention": {"keep_last": -2}})


def test_the_verl_native_section_takes_a_retention_key(tmp_path):
    from omegaconf import OmegaConf

    from stepjournal.adapters.verl import read_verl_config

    config = OmegaConf.create({"stepjournal": {"path": str(tmp_path / "j"), "policy": "cache",
                                               "retention": {"keep_last": 3}},
                               "trainer": {}, "actor_rollout_ref": {"rollout": {"n": 1}}})
    assert read_verl_config(config).engine.retention == {"keep_last": 3}


def test_compacting_into_a_real_filesystem_without_room_is_refused_and_changes_nothing(jpath, tmp_path):
    """A 64 KiB tmpfs mounted in a private mount namespace (``unshare -rm``) as the `--to` target."""
    _recorded(jpath, range(1, 20))
    before = open(os.path.join(jpath, "data.mdb"), "rb").read()
    where = tmp_path / "small"
    where.mkdir()
    shell = (f"mount -t tmpfs -o size=64k tmpfs {where} && {sys.executable} -m stepjournal compact {jpath} "
             f"--to {where / 'copy'}; echo rc=$?; ls -A {where}")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", shell], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == ["rc=1"], (done.stdout, done.stderr)  # refused, nothing left there
    assert "needs up to" in done.stderr and "nothing was changed" in done.stderr and "Traceback" not in done.stderr
    assert open(os.path.join(jpath, "data.mdb"), "rb").read() == before
    with Journal(jpath, readonly=True) as journal:
        assert journal.verify() == [] and journal.recorded_steps() == list(range(1, 20))


def test_prune_errors_speak_in_the_commands_flags_not_python_parameters(jpath):
    """A rule the command line got wrong is named by its flag (--max-bytes), never keep_last= or max_bytes."""
    _recorded(jpath, range(1, 4))
    sj = os.path.join(os.path.dirname(sys.executable), "stepjournal")
    cases = {
        f"{sj} prune {jpath} --max-bytes 10X": "--max-bytes '10X' is not a size",
        f"{sj} prune {jpath} --keep-last 0 --no-keep-replayed --dry-run": "(--keep-last, --pin, a larger --max-bytes)",
    }
    for command, words in cases.items():
        done = subprocess.run(command, shell=True, capture_output=True, text=True)
        assert done.returncode in (1, 2) and words in done.stderr, (command, done.stderr)
        assert not any(name in done.stderr for name in ("keep_last", "max_bytes", "allow_release_all", "=")), done.stderr


def test_audit_json_and_csv_name_the_release_of_each_released_record_as_journal_audit_does(jpath):
    import csv
    import io
    import json

    _recorded(jpath, range(1, 6))
    with Journal(jpath, session=False) as journal:
        prune(journal, Retention(keep_last=2))
    with Journal(jpath, readonly=True) as journal:
        expected = {r.seq: r.released_by for r in journal.audit()}
    assert sum(v is not None for v in expected.values()) == 3
    sj = os.path.join(os.path.dirname(sys.executable), "stepjournal")
    as_json = subprocess.run([sj, "audit", jpath, "--json"], capture_output=True, text=True)
    as_csv = subprocess.run([sj, "audit", jpath, "--csv"], capture_output=True, text=True)
    assert as_json.returncode == as_csv.returncode == 0, as_json.stderr + as_csv.stderr
    assert {r["seq"]: r["released_by"] for r in json.loads(as_json.stdout)} == expected
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert {int(r["seq"]): int(r["released_by"]) if r["released_by"] else None for r in rows} == expected
