"""`import_verl_dumps` / ``stepjournal import-verl``: verl's pickle dumps become replayable journal records,
and nothing is unpickled without ``trust_pickle``."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
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

from test_verl_support import GBS, N, FakeGenerator, make_rows, verl_config

RUN, FOLDER = "exp_proj", "GBS4_N2_in6_out5"


@pytest.fixture(autouse=True)
def _reset_skip_manager():
    yield
    SkipManager.config = None
    SkipManager.step = -1
    SkipManager.skip_instances = {}


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
    SkipManager.init(config)

    class Manager:
        def __init__(self):
            self.generator = FakeGenerator()

        @SkipManager.annotate(role="rollout")
        def generate_sequences(self, prompts):
            return self.generator.generate_sequences(prompts)

    manager, outputs = Manager(), {}
    for step in (1, 2, 3, 4):
        SkipManager.set_step(step)
        outputs[step] = manager.generate_sequences(gen_batch(step))
    return config, dump_dir, outputs


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
    command = [sys.executable, "-m", "stepjournal", "import-verl", dump_dir, "--into", journal]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1
    assert "pickle" in refused.stderr and "--trust-pickle" in refused.stderr
    assert not os.path.exists(journal)
    done = subprocess.run(command + ["--trust-pickle", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["schema_version"] == 1
    assert [(r["step"], r["form"]) for r in result["imported"]] == [(1, "skip_manager"), (2, "skip_manager"), (3, "skip_manager")]
    audit = subprocess.run([sys.executable, "-m", "stepjournal", "audit", journal, "--json"],
                           capture_output=True, text=True, timeout=300)
    assert [row["imported_from"].split(":")[0] for row in json.loads(audit.stdout)] == ["verl-skip_manager"] * 3
