"""Stages: every journaled call belongs to one ("generate" by default), with its own records and policy.

Real LMDB journals in tmp_path; the Hydra override goes through Hydra's own `compose`, the compact
spec through a real `bash -c`; the plugin is a real entry point on sys.path (as in test_plugins).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import lmdb
import msgpack
import pytest
import torch

from stepjournal import Journal, journaled
from stepjournal.errors import UnsupportedSchemaVersionError
from stepjournal.events import CallBypassed, CallRefused, GenerationRecorded, ReplayServed
from stepjournal.events._convert import _decode_fast, decode_event, encode_event  # private: raw event bytes, as stored
from stepjournal.events._events import EVENT_TYPES  # private: each event type's schema version
from stepjournal.events._keys import (  # private: the key layout itself
    LAYOUT_VERSION, META_LAYOUT, gen_key, parse_gen_key, seq_key,
)
from stepjournal.policies import (
    ConfigError,
    Engine,
    EngineOptions,
    SpecError,
    StageInputMismatchError,
    StagePolicies,
    load_config,
    parse_stages,
    stage_input_digest,
)

from test_plugins import install_plugin, run_python
from cli_support import run_cli

DATA = Path(__file__).parent.parent / "data"


def _release(tmp_path) -> str:
    target = tmp_path / "journal-0.1.0"
    target.mkdir(mode=0o700)
    shutil.copy2(DATA / "journal-0.1.0" / "data.mdb", target / "data.mdb")
    return str(target)


def _meta(path: str, key: bytes, value: bytes | None = None):
    """Read (or write) one key of the journal's ``meta`` database straight through LMDB."""
    env = lmdb.open(path, max_dbs=16, subdir=True)
    try:
        db = env.open_db(b"meta")
        with env.begin(write=value is not None, db=db) as txn:
            if value is not None:
                txn.put(key, value)
            found = txn.get(key)
            return bytes(found) if found is not None else None
    finally:
        env.close()


class Counter:
    """A reward function that is expensive in the way that matters here: it counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, completions: list) -> list:
        self.calls += 1
        return [float(len(c)) for c in completions]


# -- the journal: a stage in every record, key and event ---------------------------------------------
def test_each_stage_has_its_own_records_steps_and_indices(tmp_path):
    with Journal(str(tmp_path / "j")) as journal:
        journal.record(1, {"ids": torch.arange(3)})
        journal.record(1, [1.0, 2.0], stage="reward", input_digest="d1")
        journal.record(2, [3.0], stage="reward", input_digest="d2")
        journal.record(2, [4.0], stage="reward", gen_index=1, input_digest="d3")
        assert journal.recorded_steps() == [1]
        assert journal.recorded_steps(stage="reward") == [1, 2]
        assert journal.recorded_indices(2, stage="reward") == [0, 1]
        assert journal.step_count(stage="reward") == 2 and journal.nth_step(-1, stage="reward") == 2
        assert journal.nearest_above(1, stage="reward") == 2 and journal.nearest_above(1) is None
        assert journal.nearest_below(2, stage="reward") == 1
        assert journal.lookup(2, stage="reward").event.stage == "reward"
        assert journal.lookup(2) is None
        assert journal.stages() == ["generate", "reward"]
        assert [e.step for _, e in journal.events(stage="reward")] == [1, 2, 2]
        assert journal.verify() == []
        keys = [parse_gen_key(key) for key, _ in journal.index_items()]
        assert {(k.stage, k.step, k.gen_index) for k in keys} == {("generate", 1, 0), ("reward", 1, 0),
                                                                    ("reward", 2, 0), ("reward", 2, 1)}
        assert journal.reindex() > 0 and [parse_gen_key(k) for k, _ in journal.index_items()] == keys


def test_every_call_event_carries_its_stage_and_round_trips_through_both_decode_paths(tmp_path):
    with Journal(str(tmp_path / "j")) as journal:
        recorded = journal.record(3, {"r": 1}, stage="ref_log_prob", input_digest="x")
        journal.record_replay(4, recorded, stage="ref_log_prob", input_digest="x")
        journal.record_bypass(5, stage="values")
        journal.record_refusal(6, stage="reward", reason="no")
        events = [e for _, e in journal.events(types=[GenerationRecorded, ReplayServed, CallBypassed, CallRefused])]
    assert [e.stage for e in events] == ["ref_log_prob", "ref_log_prob", "values", "reward"]
    for event in events:
        raw = encode_event(event)
        assert msgpack.unpackb(raw)["v"] == EVENT_TYPES[type(event)][1]  # generation_recorded: 3
        assert _decode_fast(raw) == event == decode_event(raw)


def test_a_replay_is_served_only_from_a_record_of_its_own_stage(tmp_path):
    with Journal(str(tmp_path / "j")) as journal:
        recorded = journal.record(1, [1.0], stage="reward", input_digest="x")
        with pytest.raises(Exception, match="stage 'reward'.*only from its own stage"):
            journal.record_replay(2, recorded, stage="values")


def test_a_stage_name_that_cannot_be_part_of_a_key_is_refused_before_anything_is_written(tmp_path):
    with Journal(str(tmp_path / "j")) as journal:
        reward = Counter()
        for bad in ("", "a\x00b", "\udc80"):
            with pytest.raises(ValueError, match="stage"):
                journal.record(1, [1.0], stage=bad)
            with pytest.raises(ValueError, match="stage"):
                Engine(journal, "cache").call(1, lambda: reward(["x"]), stage=bad, input_digest="d")
        assert journal.stages() == [] and reward.calls == 0


def test_a_v1_call_event_is_read_as_a_generate_call_by_the_fast_and_the_checked_path(tmp_path):
    with Journal(str(tmp_path / "j")) as journal:
        event = journal.lookup(journal.record(1, [1]).event.step).event
    body = {"type": "generation_recorded", "v": 1,
            **{k: v for k, v in msgpack.unpackb(encode_event(event)).items() if k not in ("type", "v", "crc32", "stage")}}
    body["crc32"] = zlib.crc32(msgpack.packb({k: v for k, v in body.items() if k != "crc32"}, use_bin_type=True))
    raw = msgpack.packb(body, use_bin_type=True)
    assert _decode_fast(raw) == event
    unchecked = msgpack.packb({k: v for k, v in body.items() if k != "crc32"}, use_bin_type=True)
    assert _decode_fast(unchecked) is None and decode_event(unchecked) == event  # the checked path lifts it too


# -- journals of 0.1.0 and of a newer library --------------------------------------------------------
def test_a_0_1_0_journal_opened_read_only_reads_its_old_index_as_it_is(tmp_path):
    path = _release(tmp_path)
    assert _meta(path, META_LAYOUT) is None
    with Journal(path, run="exp", readonly=True) as journal:
        assert journal.recorded_steps() and journal.recorded_steps(stage="reward") == []
        assert journal.lookup(journal.recorded_steps()[0]).event.stage == "generate"
        assert journal.verify() == []
    assert _meta(path, META_LAYOUT) is None  # nothing written


def test_a_0_1_0_journal_opened_for_writing_is_reindexed_with_stages_in_one_go(tmp_path):
    path = _release(tmp_path)
    with Journal(path, run="exp", readonly=True) as journal:
        before = (journal.recorded_steps(), [(s, journal.recorded_indices(s)) for s in journal.recorded_steps()])
    with Journal(path, run="exp", session=False) as journal:
        assert all(parse_gen_key(key).stage == "generate" for key, _ in journal.index_items())
        assert (journal.recorded_steps(), [(s, journal.recorded_indices(s)) for s in journal.recorded_steps()]) == before
        assert journal.verify() == []
    assert _meta(path, META_LAYOUT) == str(LAYOUT_VERSION).encode()


def test_a_journal_whose_key_layout_is_newer_is_refused_with_what_to_do(tmp_path):
    path = str(tmp_path / "j")
    Journal(path).close()
    _meta(path, META_LAYOUT, str(LAYOUT_VERSION + 1).encode())
    for readonly in (True, False):
        with pytest.raises(UnsupportedSchemaVersionError, match=r"layout is version 3.*reads up to 2.*upgrade stepjournal"):
            Journal(path, readonly=readonly)


def test_a_call_event_of_a_newer_schema_is_refused_with_what_to_do(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path) as journal:
        seq = journal.record(1, [1]).seq
    env = lmdb.open(path, max_dbs=16, subdir=True)
    with env.begin(write=True, db=env.open_db(b"events")) as txn:
        body = msgpack.unpackb(txn.get(seq_key(seq)))
        newer = EVENT_TYPES[GenerationRecorded][1] + 1
        txn.put(seq_key(seq + 1), msgpack.packb({**body, "v": newer}, use_bin_type=True))
    env.close()
    with Journal(path, readonly=True) as journal:
        with pytest.raises(UnsupportedSchemaVersionError, match=f"schema version {newer}.*upgrade stepjournal"):
            list(journal.events())


# -- a policy per stage ------------------------------------------------------------------------------
def test_one_spec_still_decides_every_stage_and_a_per_stage_spec_selects_each(tmp_path):
    assert parse_stages("cache").name == "cache"
    text = parse_stages("generate:cache/reward:replay@1-5")
    mapping = parse_stages({"generate": "cache", "reward": "replay@1-5"})
    assert isinstance(text, StagePolicies) and text.stages == mapping.stages == ("generate", "reward")
    assert text.for_stage("reward").name == mapping.for_stage("reward").name == "replay@1-5"
    assert text.for_stage("values") is None
    assert parse_stages("replay@1-10:2").name == "replay@1-10:2"  # a stride's ':' is not a stage
    with Journal(str(tmp_path / "j")) as journal:
        engine = Engine(journal, "generate:dump/reward:cache")
        assert engine.call(1, lambda: [1.0], stage="reward", input_digest="a").action == "generated"
        assert engine.call(1, lambda: [9.0], stage="reward", input_digest="a", gen_index=0).action == "replayed"
        outcome = engine.call(1, lambda: [2.0], stage="values", input_digest="b")
        assert outcome.action == "bypassed" and "no policy in the per-stage spec" in journal.event(outcome.seq).reason
        assert journal.recorded_steps(stage="values") == []


def test_a_per_stage_spec_naming_an_unknown_stage_or_policy_is_refused_with_the_closest_name(tmp_path):
    declared = ("generate", "reward", "ref_log_prob")
    with pytest.raises(SpecError, match=r"unknown stage 'rewad' \(did you mean 'reward'\?\).*generate, reward, ref_log_prob"):
        parse_stages("generate:cache/rewad:cache", stages=declared)
    with pytest.raises(SpecError, match=r"unknown stage 'ref_logprob' \(did you mean 'ref_log_prob'\?\)"):
        parse_stages({"ref_logprob": "cache"}, stages=declared)
    with pytest.raises(SpecError, match=r"stage 'reward'.*unknown policy 'replya' \(did you mean 'replay'"):
        parse_stages("generate:cache/reward:replya@1-5")
    with pytest.raises(SpecError, match="names stage 'reward' twice"):
        parse_stages("reward:cache/reward:dump")
    with pytest.raises(SpecError, match="is not 'stage:spec'"):
        parse_stages("generate:cache/dump")
    with Journal(str(tmp_path / "j")) as journal:
        with pytest.raises(SpecError, match="did you mean 'reward'"):
            Engine(journal, {"rewards": "cache"}, stages=declared)
    with pytest.raises(ConfigError, match=r"stage 'reward'.*did you mean 'replay'"):
        load_config({"path": str(tmp_path / "j"), "policy": {"reward": "replya"}})


def test_the_config_section_takes_a_mapping_and_the_compact_text(tmp_path):
    for policy in ({"generate": "cache", "reward": "replay@1-5"}, "generate:cache/reward:replay@1-5"):
        config = load_config({"path": str(tmp_path / "j"), "policy": policy})
        assert parse_stages(config.policy).stages == ("generate", "reward")
    yaml_text = f"path: {tmp_path / 'j'}\npolicy:\n  generate: cache\n  reward: replay@1-5\n"
    assert load_config(yaml_text).policy == {"generate": "cache", "reward": "replay@1-5"}


def test_the_compact_spec_survives_hydras_override_grammar_as_a_user_types_it(tmp_path):
    from hydra import compose, initialize_config_dir

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "main.yaml").write_text(f"stepjournal:\n  path: {tmp_path / 'j'}\n")
    with initialize_config_dir(config_dir=str(tmp_path / "conf"), version_base=None):
        cfg = compose(config_name="main", overrides=["+stepjournal.policy=generate:cache/reward:replay@1-5"])
        mapped = compose(config_name="main", overrides=["+stepjournal.policy={generate:cache,reward:'replay@1-5'}"])
    assert cfg.stepjournal.policy == "generate:cache/reward:replay@1-5"
    assert parse_stages(load_config(cfg.stepjournal).policy).for_stage("reward").name == "replay@1-5"
    assert parse_stages(load_config(mapped.stepjournal).policy).stages == ("generate", "reward")


def test_the_compact_spec_survives_a_shell_unquoted():
    code = "import sys; from stepjournal.policies import parse_stages; p = parse_stages(sys.argv[1]); print(p.name)"
    result = subprocess.run(
        ["bash", "-c", f"{sys.executable} -c '{code}' generate:cache/reward:replay@1-5"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "generate:cache/reward:replay@1-5"


def test_a_plugin_policy_decides_one_stage_of_a_per_stage_spec(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    install_plugin(site, {"every_other": "sj_example_plugin:EveryOther"})
    result = run_python(
        site,
        f"""
        from stepjournal import Journal
        from stepjournal.policies import Engine
        with Journal({str(tmp_path / 'j')!r}) as j:
            engine = Engine(j, "generate:dump/reward:every_other")
            rewards = [engine.call(s, lambda: [float(s)], stage="reward", input_digest="same").action
                       for s in range(1, 5)]
            generate = [engine.call(s, lambda: [s]).action for s in range(1, 3)]
        print(rewards, generate)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == (
        "['generated', 'replayed', 'generated', 'replayed'] ['generated', 'generated']"
    )


# -- the safety rule: a stage's record replays only onto the same input ------------------------------
def test_a_stage_record_replayed_onto_a_different_input_is_refused_naming_step_stage_and_digests(tmp_path):
    path = str(tmp_path / "j")
    reward = Counter()
    with Journal(path) as journal:
        journaled(reward, journal, "dump", stage="reward")(["ab", "c"], step=1)
    with Journal(path) as journal:
        wrapped = journaled(reward, journal, "replay", stage="reward")
        with pytest.raises(StageInputMismatchError) as caught:
            wrapped(["other"], step=1)
        error = caught.value
        assert (error.step, error.stage) == (1, "reward") and reward.calls == 1
        assert error.recorded_digest != error.current_digest and error.current_digest in str(error)
        assert error.recorded_digest in str(error) and "on_stage_input_mismatch='generate'" in str(error)
        refused = [e for _, e in journal.events(types=[CallRefused])]
        assert [(e.stage, e.step) for e in refused] == [("reward", 1)]
        again = journaled(reward, journal, "replay", stage="reward")
        assert again(["ab", "c"], step=1) == [2.0, 1.0] and reward.calls == 1  # same input: replayed


def test_a_stage_may_compute_again_on_a_changed_input_when_the_option_says_so(tmp_path):
    path = str(tmp_path / "j")
    reward = Counter()
    with Journal(path) as journal:
        journaled(reward, journal, "dump", stage="reward")(["ab"], step=1)
    with Journal(path) as journal:
        wrapped = journaled(reward, journal, "cache", stage="reward", on_stage_input_mismatch="generate")
        assert wrapped(["xyz"], step=1) == [3.0] and reward.calls == 2
        assert wrapped.last_outcome.action == "generated"
        assert "computed again" in journal.event(wrapped.last_outcome.seq).reason


def test_the_weights_version_is_part_of_a_model_dependent_stages_digest(tmp_path):
    path = str(tmp_path / "j")
    log_probs = Counter()
    with Journal(path) as journal:
        journaled(log_probs, journal, "dump", stage="ref_log_prob", weights_version_of=lambda batch, **_: 10)(
            ["ab"], step=1)
    with Journal(path) as journal:
        for version in (10, 11):
            wrapped = journaled(log_probs, journal, "replay", stage="ref_log_prob",
                                weights_version_of=lambda batch, **_: version)
            if version == 10:
                assert wrapped(["ab"], step=1) == [2.0] and log_probs.calls == 1
            else:
                with pytest.raises(StageInputMismatchError, match="ref_log_prob"):
                    wrapped(["ab"], step=1)
    assert stage_input_digest("d", None) == "d" and stage_input_digest("d", 1) != stage_input_digest("d", 2)
    with pytest.raises(ValueError, match="weights_version"):
        stage_input_digest("d", [1])


def test_a_stage_call_without_its_input_is_refused_before_anything_runs(tmp_path):
    with Journal(str(tmp_path / "j")) as journal:
        with pytest.raises(TypeError, match="needs input_of"):
            journaled(Counter(), journal, "cache", stage="reward", input_of=None)
        with pytest.raises(TypeError, match="stage 'reward'.*needs its input digest"):
            Engine(journal, "cache").call(1, lambda: [1.0], stage="reward")
        assert journal.stages() == []


def test_the_generate_stage_keeps_its_old_rule_input_checked_only_with_verify_input(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path) as journal:
        journaled(lambda prompt: prompt * 2, journal, "dump")("a", step=1)
    with Journal(path) as journal:
        wrapped = journaled(lambda prompt: prompt * 3, journal, "replay")
        assert wrapped("b", step=1) == "aa"  # not the same input, but generate replays as before
    assert EngineOptions().on_stage_input_mismatch == "error"


# -- raw loops with two stages -------------------------------------------------------------------------
def test_a_replayed_raw_loop_runs_neither_generate_nor_reward(tmp_path):
    path = str(tmp_path / "j")
    generated, reward = Counter(), Counter()

    def generate(prompts):
        generated.calls += 1
        return [p + "!" for p in prompts]

    def loop(policy):
        with Journal(path) as journal:
            gen = journaled(generate, journal, policy)
            score = journaled(reward, journal, policy, stage="reward")
            return [score(gen(["q", f"s{s}"], step=s), step=s) for s in range(1, 4)]

    recorded = loop("generate:dump/reward:dump")
    assert (generated.calls, reward.calls) == (3, 3)
    assert loop("replay") == recorded and (generated.calls, reward.calls) == (3, 3)


def test_the_async_form_journals_a_stage_too(tmp_path):
    path = str(tmp_path / "j")
    reward = Counter()

    async def score(completions, step):
        return reward(completions)

    async def run(policy):
        with Journal(path) as journal:
            wrapped = journaled(score, journal, policy, stage="reward")
            return [await wrapped(["a" * s], step=s) for s in (1, 2)]

    assert asyncio.run(run("dump")) == [[1.0], [2.0]] and reward.calls == 2
    assert asyncio.run(run("replay")) == [[1.0], [2.0]] and reward.calls == 2
    with Journal(path, readonly=True) as journal:
        assert journal.recorded_steps(stage="reward") == [1, 2] and journal.recorded_steps() == []


def test_gen_key_and_parse_gen_key_agree_on_the_stage():
    key = gen_key("run", "train", 7, 2, "reward")
    assert parse_gen_key(key) == ("run", "train", 7, 2, "reward")
    assert parse_gen_key(b"run\x00train\x00" + (7).to_bytes(8, "big") + (2).to_bytes(4, "big")) is None


# -- the command line ----------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    result = run_cli(*args, env={"COLUMNS": "120"})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return result


def test_the_cli_filters_lists_and_shows_stages(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path, run="exp") as journal:
        rollout = journaled(lambda prompts: [p + "!" for p in prompts], journal, "dump")
        score = journaled(Counter(), journal, "dump", stage="reward")
        for step in (1, 2):
            score(rollout(["q"], step=step), step=step)
    audit = json.loads(_cli("audit", path, "--stage", "reward", "--json").stdout)
    assert [(row["stage"], row["step"]) for row in audit] == [("reward", 1), ("reward", 2)]
    assert "reward#0" in _cli("audit", path, "--no-pager").stdout
    (run,) = json.loads(_cli("runs", path, "--json").stdout)
    assert run["stages"] == {"generate": 2, "reward": 2}
    (only,) = json.loads(_cli("runs", path, "--stage", "reward", "--json").stdout)
    assert only["calls"] == 2
    shown = json.loads(_cli("show", path, "2", "--stage", "reward", "--json").stdout)
    assert shown["call"]["stage"] == "reward" and shown["call"]["step"] == 2
    assert "stage reward" in _cli("show", path, "2", "--stage", "reward").stdout


def test_the_timeline_draws_one_lane_per_stage(tmp_path):
    from stepjournal.adapters.cli._timeline_layout import build_timeline  # private: a CLI helper under test

    with Journal(str(tmp_path / "j")) as journal:
        journal.record(1, [1])
        journal.record(1, [1.0], stage="reward", input_digest="a")
        journal.record(2, [2.0], stage="reward", input_digest="b")
        timeline = build_timeline(journal.audit(), title="t")
    assert timeline.lanes == ("s1 train #0", "s1 train reward #0")
    assert sorted((c.lane, c.column) for c in timeline.cells) == [(0, 0), (1, 0), (1, 1)]
