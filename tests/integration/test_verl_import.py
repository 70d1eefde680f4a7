"""`import_verl_dumps` / ``stepjournal import-verl``: verl's pickle dumps become replayable journal records,
and nothing is unpickled without ``trust_pickle``."""

from __future__ import annotations

import json
import os
import pickle
import zlib

import pytest
from omegaconf import OmegaConf
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.skip import SkipManager

from stepjournal import Journal
from stepjournal.adapters.verl import (
    PickleRefusedError,
    dataproto_diff,
    find_verl_dumps,
    import_verl_dumps,
    read_verl_config,
    rollout_from_config,
)

from verl_support import GBS, N, FakeGenerator, fresh_skip_manager, make_rows, verl_config  # noqa: F401 (autouse)
from cli_support import run_cli

RUN, FOLDER = "exp_proj", "GBS4_N2_in6_out5"


def gen_batch(step: int, offset: int = 0) -> DataProto:
    batch = DataProto.from_single_dict(collate_fn(make_rows(step, GBS, offset=offset)))
    batch.pop(batch_keys=["dummy_tensor"])
    batch.meta_info = {"global_steps": step}
    return batch.repeat(N, interleave=True)


class Marker:
    """Unpickling this creates a file: proof that a pickle was (or was not) loaded."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def skip_manager_dumps(tmp_path):
    """Dumps written by verl 0.9.1's own SkipManager decorator, and the outputs it returned."""
    dump_dir = str(tmp_path / "dumps")
    cfg = verl_config(str(tmp_path))
    cfg["skip"] = {"rollout": {"enable": True, "dump_dir": dump_dir, "steps": [1, 2, 3], "action": "cache"}}
    config = OmegaConf.create(cfg)
    return config, dump_dir, run_under_skip_manager(config, (1, 2, 3, 4))


def run_under_skip_manager(config, steps) -> dict:
    """verl 0.9.1's own SkipManager decorating a generator, run at `steps` (it dumps per `config`): the outputs."""
    SkipManager.init(config)

    class Manager:
        def __init__(self):
            self.generator = FakeGenerator()

        @SkipManager.annotate(role="rollout")
        def generate_sequences(self, prompts):
            return self.generator.generate_sequences(prompts)

    manager, outputs = Manager(), {}
    for step in steps:
        SkipManager.set_step(step)
        outputs[step] = manager.generate_sequences(gen_batch(step))
    return outputs


def test_dumps_written_by_verls_skip_manager_import_and_replay(tmp_path):
    config, dump_dir, outputs = skip_manager_dumps(tmp_path)
    assert sorted(os.listdir(os.path.join(dump_dir, RUN, FOLDER))) == ["1", "2", "3"]
    journal_path = os.path.join(dump_dir, "stepjournal")
    seen = []
    report = import_verl_dumps(dump_dir, journal_path, trust_pickle=True, progress=lambda d, t: seen.append((d, t)))
    assert report.ok and not report.skipped
    assert [(r.run, r.step, r.gen_index, r.form, r.stored_input) for r in report.imported] == [
        (RUN, s, 0, "skip_manager", False) for s in (1, 2, 3)
    ]
    assert seen[-1] == (3, 3)
    with Journal(journal_path, readonly=True, run=RUN) as journal:
        records = journal.audit()
    assert [r.imported_from for r in records] == [f"verl-skip_manager:{RUN}/{FOLDER}/{s}" for s in (1, 2, 3)]

    # The same verl config, now served by stepjournal: steps 1-3 replay without the generator.
    SkipManager.skip_instances = {}
    found = read_verl_config(config)
    assert found.path == journal_path and found.policy == "cache@1-3;passthrough"
    rollout = rollout_from_config(found, FakeGenerator(fail=True).generate_sequences)
    try:
        for step in (1, 2, 3):
            replayed = rollout(gen_batch(step))
            assert rollout.last_outcome.action == "replayed"
            assert dataproto_diff(replayed, outputs[step]) == [], step
    finally:
        rollout.close()

    again = import_verl_dumps(dump_dir, journal_path, trust_pickle=True)
    assert not again.imported and [s.reason.split(" (")[0] for s in again.skipped] == ["already imported"] * 3


def test_without_trust_pickle_it_refuses_and_reads_nothing(tmp_path):
    folder = tmp_path / "dumps" / RUN / FOLDER / "1"
    folder.mkdir(parents=True)
    marker = tmp_path / "unpickled"
    (folder / "gen_batch.dp").write_bytes(pickle.dumps(Marker(str(marker))))
    (folder / "meta.json").write_text(json.dumps({"global_steps": 1}))
    journal_path = tmp_path / "journal"
    with pytest.raises(PickleRefusedError, match=r"pickles.*Nothing was read.*trust_pickle=True"):
        import_verl_dumps(tmp_path / "dumps", journal_path)
    assert not marker.exists() and not journal_path.exists()


def _write_v2(root, steps):
    """v2 layout: genstep_NNNNNN/{new_batch.dp, gen_batch.dp, meta.json}, DAPO calls as extra gen steps."""
    folder = root / RUN / FOLDER
    written = {}
    for gen_step, (train_step, offset) in enumerate(steps, 1):
        d = folder / f"genstep_{gen_step:06d}"
        d.mkdir(parents=True)
        new_batch, out = gen_batch(train_step, offset), None
        out = FakeGenerator().generate_sequences(new_batch)
        new_batch.save_to_disk(d / "new_batch.dp")
        out.save_to_disk(d / "gen_batch.dp")
        (d / "meta.json").write_text(json.dumps({"global_steps": train_step, "gen_steps": gen_step}))
        written[gen_step] = (new_batch, out)
    (folder / "train_step__gen_step.txt").write_text("".join(f"{t} {g}\n" for g, (t, _) in enumerate(steps, 1)))
    return written


def test_v2_dumps_keep_train_steps_dapo_order_and_inputs(tmp_path):
    written = _write_v2(tmp_path / "dumps", [(1, 0), (2, 0), (2, 10), (3, 0)])
    report = import_verl_dumps(tmp_path / "dumps", tmp_path / "j", trust_pickle=True)
    assert [(r.step, r.gen_index, r.stored_input) for r in report.imported] == [(1, 0, True), (2, 0, True), (2, 1, True), (3, 0, True)]
    with Journal(str(tmp_path / "j"), readonly=True, run=RUN) as journal:
        for gen_step, (step, index) in zip((1, 2, 3, 4), ((1, 0), (2, 0), (2, 1), (3, 0))):
            record = journal.lookup(step, index)
            assert dataproto_diff(journal.load_output(record), written[gen_step][1]) == []
            assert dataproto_diff(journal.load_input(record), written[gen_step][0]) == []
        assert journal.session_fingerprint(record.event.session) == {
            "verl.gen_batch_size": 4, "verl.rollout_n": 2, "verl.max_prompt_length": 6, "verl.max_response_length": 5}


def test_v2_pre_pickle_and_v1_single_file_dumps_import(tmp_path):
    root = tmp_path / "dumps"
    folder = root / RUN / FOLDER
    folder.mkdir(parents=True)
    new_batch = gen_batch(1)
    out = FakeGenerator().generate_sequences(new_batch)
    packed = {"new_batch": zlib.compress(pickle.dumps(new_batch)), "gen_batch": zlib.compress(pickle.dumps(out)),
              "compressed": ["gen_batch", "new_batch"], "compresser_name": "zlib"}
    (folder / "genstep_000004.pkl").write_bytes(pickle.dumps(packed))
    v1 = tmp_path / "v1"
    v1.mkdir()
    out.save_to_disk(v1 / "old_exp_proj_GBS4__N2")
    pre = import_verl_dumps(root, tmp_path / "j", trust_pickle=True)
    assert [(r.form, r.step, r.stored_input) for r in pre.imported] == [("rollout_skip_v2_pre", 4, True)]
    old = import_verl_dumps(v1, tmp_path / "j", trust_pickle=True)
    assert [(r.form, r.run, r.step) for r in old.imported] == [("rollout_skip_v1", "old_exp_proj", 1)]
    with Journal(str(tmp_path / "j"), readonly=True, run="old_exp_proj") as journal:
        record = journal.lookup(1)
        assert dataproto_diff(journal.load_output(record), out) == []
        # v1 names lack the lengths; they are read from the padded prompt/response shapes.
        assert journal.session_fingerprint(record.event.session)["verl.max_response_length"] == 5


def test_interrupted_dumps_and_links_out_of_the_folder_are_skipped(tmp_path):
    _, dump_dir, _ = skip_manager_dumps(tmp_path)
    base = os.path.join(dump_dir, RUN, FOLDER)
    os.remove(os.path.join(base, "2", "meta.json"))  # meta.json is written last: step 2 was cut short
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "gen_batch.dp").write_bytes(pickle.dumps(Marker(str(tmp_path / "unpickled"))))
    os.symlink(outside, os.path.join(base, "9"))
    found, left_out = find_verl_dumps(dump_dir)
    assert [d.order for d in found] == [1, 2, 3] and "link leaves the dump folder" in left_out[0].reason
    report = import_verl_dumps(dump_dir, tmp_path / "j", trust_pickle=True)
    assert [r.step for r in report.imported] == [1, 3]
    assert any("interrupted" in s.reason for s in report.skipped)
    assert not (tmp_path / "unpickled").exists()


def test_cli_import_verl_refuses_then_imports_with_trust_pickle(tmp_path):
    _, dump_dir, _ = skip_manager_dumps(tmp_path)
    journal = str(tmp_path / "j")
    command = ["import-verl", dump_dir, "--into", journal]
    refused = run_cli(*command)
    assert refused.returncode == 1
    assert "pickle" in refused.stderr and "--trust-pickle" in refused.stderr
    assert not os.path.exists(journal)
    done = run_cli(*command, "--trust-pickle", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["schema_version"] == 1
    assert [(r["step"], r["form"]) for r in result["imported"]] == [(1, "skip_manager"), (2, "skip_manager"), (3, "skip_manager")]
    audit = run_cli("audit", journal, "--json")
    assert [row["imported_from"].split(":")[0] for row in json.loads(audit.stdout)] == ["verl-skip_manager"] * 3


# -- dumps of verl's own SkipManager, replayed under the Hydra config that wrote them -----------------------
def hydra_skip_config(dump_dir: str, *extra: str):
    """verl 0.9.1's own legacy trainer config, composed by Hydra, with its rollout skip on (steps 1-3, cache)."""
    from verl_support import compose

    return compose("verl.trainer.main_ppo", [
        "trainer.use_v1=false", "trainer.experiment_name=exp", "trainer.project_name=proj",
        f"data.train_batch_size={GBS}", "data.max_prompt_length=6", "data.max_response_length=5",
        f"actor_rollout_ref.rollout.n={N}", "actor_rollout_ref.model.path=/models/qwen2.5-0.5b",
        "skip.rollout.enable=true", f"skip.rollout.dump_dir={dump_dir}", "skip.rollout.steps=[1,2,3]",
        "skip.rollout.action=cache", *extra,
    ])


def dumps_of_verls_skip_manager(config) -> dict:
    outputs = run_under_skip_manager(config, (1, 2, 3))
    SkipManager.skip_instances = {}
    return outputs


@pytest.mark.parametrize("with_config", [False, True])
def test_dumps_of_verls_skip_manager_replay_under_the_same_hydra_config(tmp_path, with_config):
    """What the dumps could not know is unknown, not different: the same config replays them, and says so."""
    dump_dir = str(tmp_path / "dumps")
    config = hydra_skip_config(dump_dir)
    outputs = dumps_of_verls_skip_manager(config)
    found = read_verl_config(config)
    assert {"verl.model_path", "verl.temperature", "verl.do_sample", "verl.train_files"} <= set(found.fingerprint)
    report = import_verl_dumps(dump_dir, found.path, trust_pickle=True, config=config if with_config else None)
    assert report.ok and [r.step for r in report.imported] == [1, 2, 3]

    rollout = rollout_from_config(found, FakeGenerator(fail=True).generate_sequences)
    try:
        for step in (1, 2, 3):
            assert dataproto_diff(rollout(gen_batch(step)), outputs[step]) == [], step
            assert rollout.last_outcome.action == "replayed"
    finally:
        rollout.close()
    with Journal(found.path, readonly=True, run=found.run) as journal:
        reasons = [r.reason for r in journal.audit() if r.action == "replayed"]
    assert len(reasons) == 3
    for reason in reasons:
        if with_config:  # the import recorded the config's keys: all of them were checked
            assert "unknown" not in reason
        else:
            unknown = reason.split("not checked, unknown to the imported record: ")[1].split(", ")
            assert {"verl.model_path", "verl.temperature", "verl.do_sample", "verl.train_files"} <= set(unknown)
            assert "verl.rollout_n" not in unknown and "verl.gen_batch_size" not in unknown


def test_a_known_setting_of_an_imported_dump_still_refuses_its_replay(tmp_path):
    """The keys the dump folder spells are known: another rollout.n is refused, naming it, with nothing waived."""
    from stepjournal.policies import FingerprintMismatchError

    dump_dir = str(tmp_path / "dumps")
    dumps_of_verls_skip_manager(hydra_skip_config(dump_dir))
    other = read_verl_config(hydra_skip_config(dump_dir, "actor_rollout_ref.rollout.max_model_len=64",
                                               "data.max_response_length=7"))
    import_verl_dumps(dump_dir, other.path, trust_pickle=True)
    rollout = rollout_from_config(other, FakeGenerator(fail=True).generate_sequences)
    try:
        with pytest.raises(FingerprintMismatchError) as caught:
            rollout(gen_batch(1))
    finally:
        rollout.close()
    assert set(caught.value.differences) == {"verl.max_response_length"}
    assert "verl.max_response_length: recorded 5, now 7" in str(caught.value)
