"""verl V1 pieces on their own: the TQBatch codec, the uid remap, the config and its bad input, import-verl."""

from __future__ import annotations

import json
import os

import pytest
import torch
from hypothesis import given, settings, strategies as st
from tensordict import NonTensorData
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from stepjournal import Journal
from stepjournal.adapters.verl import (
    TQBatch,
    VerlAdapterError,
    VerlDumpError,
    attach,
    attach_v1,
    import_verl_dumps,
    read_verl_config,
    remap_tq_batch,
    tq_batch_diff,
    v1_trainer_mode,
)
from stepjournal.policies import ConfigError
from cli_support import run_cli

DTYPES = [torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.float16]
plain = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=6) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=4), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def tq_batches(draw):
    rows = draw(st.integers(1, 4))
    dtype = draw(st.sampled_from(DTYPES))
    lengths = draw(st.lists(st.integers(1, 5), min_size=rows, max_size=rows))
    items = []
    for i, length in enumerate(lengths):
        items.append({
            "responses": (torch.arange(length) * (i + 3)).to(dtype),
            "prompts": torch.arange(draw(st.integers(1, 4))),
            "uid": f"u{i % 2}",
            "extra_fields": {"reward_extra_info": draw(plain), "index": i},
            "num_turns": draw(st.integers(0, 5)),
        })
    fields = list_of_dict_to_tensordict(items)
    if draw(st.booleans()):
        fields.set("validate", NonTensorData(False))
    keys = [f"u{i % 2}_{i // 2}_0" for i in range(rows)]
    tags = [{"status": "success", "global_steps": 3, "seq_len": n} for n in lengths]
    return TQBatch(fields=fields, keys=keys, tags=tags, partition_id="train")


@settings(max_examples=40, deadline=None)
@given(batch=tq_batches())
def test_a_tq_batch_round_trips_exactly_through_a_journal(tmp_path_factory, batch):
    with Journal(str(tmp_path_factory.mktemp("j")), run="r") as journal:
        journal.record(1, batch)
        back = journal.load_output(journal.lookup(1))
    assert tq_batch_diff(back, batch) == []
    original = batch.fields.get("responses")
    assert back.fields.get("responses").layout == original.layout  # jagged when lengths differ
    if original.is_nested:
        assert torch.equal(back.fields.get("responses").offsets(), original.offsets())


def test_tq_batch_diff_sees_a_changed_reward_bit():
    rows = [{"responses": torch.tensor([1, 2]), "rm_scores": torch.tensor([0.0, 1.0]), "uid": "a"}]
    a = TQBatch(list_of_dict_to_tensordict(rows), ["a_0_0"], [{"status": "success"}])
    rows[0]["rm_scores"] = torch.tensor([0.0, 1.0000001])
    b = TQBatch(list_of_dict_to_tensordict(rows), ["a_0_0"], [{"status": "success"}])
    assert tq_batch_diff(a, b) == ["fields.rm_scores: tensor bits differ"]


def _recorded(groups=2, sessions=2):
    rows, keys = [], []
    for g in range(groups):
        for s in range(sessions):
            rows.append({"responses": torch.tensor([g, s]), "uid": f"old{g}"})
            keys.append(f"old{g}_{s}_0")
    tags = [{"status": "success", "global_steps": 2, "min_global_steps": 1, "max_global_steps": 2}] * len(keys)
    return TQBatch(list_of_dict_to_tensordict(rows), keys, tags)


def test_remap_takes_the_first_groups_when_more_were_recorded_than_prompts():
    served = remap_tq_batch(_recorded(groups=3), ["n0"], step=2, source_step=2)
    assert list(served.keys) == ["n0_0_0", "n0_1_0"]
    assert [t.tolist() for t in served.fields.get("responses").unbind()] == [[0, 0], [0, 1]]
    assert served.tags[0]["global_steps"] == 2 and served.tags[0]["min_global_steps"] == 1


def test_remap_cycles_groups_and_moves_step_tags_by_the_step_difference():
    served = remap_tq_batch(_recorded(groups=2), ["n0", "n1", "n2"], step=6, source_step=2)
    assert [k.split("_")[0] for k in served.keys] == ["n0", "n0", "n1", "n1", "n2", "n2"]
    assert [t.tolist()[0] for t in served.fields.get("responses").unbind()] == [0, 0, 1, 1, 0, 0]
    assert {(t["global_steps"], t["min_global_steps"], t["max_global_steps"]) for t in served.tags} == {(6, 5, 6)}


def test_remap_keeps_the_recorded_row_order_of_groups_verls_agent_loop_interleaved():
    """AgentLoopWorkerTQ writes each trajectory as it finishes: a sampled batch interleaves prompt groups."""
    rows = [{"responses": torch.tensor([r]), "uid": u} for r, u in enumerate(["a", "b", "a", "c", "b", "c"])]
    keys = ["a_0_0", "b_1_0", "a_1_0", "c_0_0", "b_0_0", "c_1_0"]
    recorded = TQBatch(list_of_dict_to_tensordict(rows), keys, [{"global_steps": 3}] * 6)
    served = remap_tq_batch(recorded, ["x", "y", "z"], step=3, source_step=3)
    assert list(served.keys) == ["x_0_0", "y_1_0", "x_1_0", "z_0_0", "y_0_0", "z_1_0"]
    assert [t.tolist()[0] for t in served.fields.get("responses").unbind()] == [0, 1, 2, 3, 4, 5]
    assert served.fields.get("uid").tolist() == ["x", "y", "x", "z", "y", "z"]
    cycled = remap_tq_batch(recorded, ["x", "y", "z", "w"], step=3, source_step=3)  # a second pass: group a again
    assert list(cycled.keys)[6:] == ["w_0_0", "w_1_0"]
    assert [t.tolist()[0] for t in cycled.fields.get("responses").unbind()][6:] == [0, 2]


@pytest.mark.parametrize("keys,uids,message", [
    (["a_0_0", "b-1"], ["n"], "is not {uid}_{session}_{index}"),
    (["a_0_0", "a_1_0"], [], "both must be at least one"),
])
def test_a_batch_whose_uids_cannot_be_mapped_is_a_clear_error(keys, uids, message):
    rows = [{"responses": torch.tensor([1]), "uid": "a"} for _ in keys]
    with pytest.raises(VerlAdapterError, match=message):
        remap_tq_batch(TQBatch(list_of_dict_to_tensordict(rows), keys, [{}] * len(keys)), uids, step=1, source_step=1)


def _v1(**extra):
    return {"trainer": {"use_v1": True, "v1": {"trainer_mode": "sync"}, "experiment_name": "e", "project_name": "p"},
            "actor_rollout_ref": {"rollout": {"n": 2}}, **extra}


@pytest.mark.parametrize("action,policy", [("cache", "cache@1-3,7;passthrough"), ("repeat", "nearest@1-3,7;passthrough")])
def test_skip_rollout_tq_is_read_like_the_other_skip_manager_forms(action, policy, tmp_path):
    found = read_verl_config(_v1(skip={"rollout_tq": {"enable": True, "dump_dir": str(tmp_path), "steps": [1, 2, 3, 7],
                                                      "action": action}}))
    assert (found.form, found.policy, found.step_source) == ("skip_manager.rollout_tq", policy, "global_steps")
    assert found.path == os.path.join(str(tmp_path), "stepjournal")


def test_skip_rollout_tq_and_a_stepjournal_section_at_once_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"enables 2 rollout-skip forms at once \(stepjournal, skip_manager.rollout_tq\)"):
        read_verl_config(_v1(stepjournal={"policy": "cache", "dump_dir": str(tmp_path)},
                             skip={"rollout_tq": {"enable": True, "steps": [1]}}))


def test_an_unsupported_v1_trainer_mode_is_a_config_error_naming_the_key(tmp_path):
    assert v1_trainer_mode(_v1()) == "sync"
    cfg = _v1(stepjournal={"policy": "cache", "dump_dir": str(tmp_path)})
    cfg["trainer"]["v1"]["trainer_mode"] = "fully_async"
    with pytest.raises(ConfigError, match=r"trainer.v1.trainer_mode='fully_async' is not a V1 mode"):
        attach_v1(object(), config=cfg)
    assert not os.path.exists(os.path.join(str(tmp_path), "stepjournal"))  # nothing half-written


def test_a_v1_config_that_journals_validation_under_the_policy_is_refused(tmp_path):
    cfg = _v1(stepjournal={"policy": "cache", "dump_dir": str(tmp_path), "bypass_modes": []})
    with pytest.raises(ConfigError, match="keep 'validate' in bypass_modes"):
        attach_v1(object(), config=cfg)


def test_attach_names_what_it_supports_when_given_another_trainer():
    class MyTrainer:
        config = {"stepjournal": {"policy": "cache", "path": "/tmp/never"}}

    with pytest.raises(VerlAdapterError, match=r"MyTrainer has no actor_rollout_wg: stepjournal journals verl's V1 PPOTrainer"):
        attach(MyTrainer())


def test_the_fingerprint_carries_model_sampling_and_data_for_both_trainers(tmp_path):
    def fp(use_v1, **rollout):
        cfg = _v1(stepjournal={"policy": "cache", "dump_dir": str(tmp_path)})
        cfg["trainer"]["use_v1"] = use_v1
        cfg["actor_rollout_ref"] = {"model": {"path": "/m/a", "tokenizer_path": "/t"},
                                    "rollout": {"n": 2, "temperature": 1.0, "top_p": 0.9, "top_k": -1, **rollout}}
        cfg["data"] = {"train_files": "/d/train.parquet", "train_batch_size": 8}
        return read_verl_config(cfg).fingerprint

    for use_v1 in (True, False):
        base = fp(use_v1)
        assert {k: base[k] for k in ("verl.model_path", "verl.tokenizer_path", "verl.temperature", "verl.top_p",
                                     "verl.top_k", "verl.train_files")} == {
            "verl.model_path": "/m/a", "verl.tokenizer_path": "/t", "verl.temperature": 1, "verl.top_p": 0.9,
            "verl.top_k": -1, "verl.train_files": "/d/train.parquet"}
        assert fp(use_v1, temperature=0.6)["verl.temperature"] == 0.6


def test_import_verl_on_a_folder_without_dumps_exits_non_zero_naming_the_layouts(tmp_path):
    (tmp_path / "dumps" / "something").mkdir(parents=True)
    (tmp_path / "dumps" / "something" / "notes.txt").write_text("x")
    with pytest.raises(VerlDumpError, match=r"no verl dumps found .* looked for .*tq_batch.pt"):
        import_verl_dumps(tmp_path / "dumps", tmp_path / "j", trust_pickle=True)
    result = run_cli("import-verl", str(tmp_path / "dumps"), "--into", str(tmp_path / "j"), "--trust-pickle")
    assert result.returncode != 0
    assert "no verl dumps found" in result.stderr and "gen_batch.dp" in result.stderr
    assert not (tmp_path / "j").exists()


def test_v1_dumps_are_refused_without_trust_pickle_and_none_is_read(tmp_path):
    step = tmp_path / "e_p" / "GBS4_N2_in8_out8" / "1" / "0"
    step.mkdir(parents=True)
    (step / "tq_batch.pt").write_bytes(b"not even a pickle")
    (step / "meta.json").write_text(json.dumps({"global_steps": 1}))
    from stepjournal.adapters.verl import PickleRefusedError, find_verl_dumps

    dumps, _ = find_verl_dumps(tmp_path)
    assert [(d.form, d.order, d.run) for d in dumps] == [("rollout_tq", 1, "e_p")]
    with pytest.raises(PickleRefusedError, match="refusing to import 1 verl dump") as caught:
        import_verl_dumps(tmp_path, tmp_path / "j")
    assert "dump files (tq_batch.pt (torch.save)) are Python pickles" in str(caught.value)
    assert ".dp" not in str(caught.value) and ".pkl" not in str(caught.value)  # it names the files it found
    report = import_verl_dumps(tmp_path, tmp_path / "j", trust_pickle=True)
    assert report.imported == () and len(report.failed) == 1  # an unreadable file is reported, not imported
