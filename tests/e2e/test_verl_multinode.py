"""verl's fully-async rollouter on another Ray node records into one logical recording (two journals
pushed to one S3 remote) that replays bit for bit on a different topology (one node).

Real Ray multi-node: a ``ray.cluster_utils.Cluster`` whose head node ("trainer") runs this process,
the Ray driver, as the trainer side (it scores each sample and journals that ``reward`` stage in its
own folder), and whose second node carries the ``rollout`` resource, so the rollouter and its
agent-loop workers run there and journal into the second node's folder. The rollouter runs verl's real ``FullyAsyncAgentLoopManager.generate_sequences_single``,
patched in its own process by the Ray setup hook ``install_fully_async`` (job runtime_env
``worker_process_setup_hook``, as docs/verl.md's command line sets it), never by the test. The manager
is built with ``__new__`` plus ``config`` and ``agent_loop_workers`` (verl's ``__init__`` starts
GPU-bound LLM servers); the agent-loop workers are Ray actors with a seeded sampler in place of the
LLM, the only stand-in. The S3 server is moto on 127.0.0.1. The command lines are the ones in
docs/sharing.md "Topologies", run through the shell on the node they are written for.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from ray.cluster_utils import Cluster

import sharing_docs
from s3_server import client_env, make_bucket, s3_server  # noqa: F401  (fixture)
from stepjournal import Journal, journaled
from stepjournal.payloads._object_client import Remote  # private: the object client under test
from stepjournal.adapters.verl import dataproto_diff
from verl_support import answer_token
from verl_ray_support import RUN_KEY, Rollouter, SeededSampler, reward, rollout_config, shell

pytestmark = pytest.mark.e2e  # Ray clusters of several nodes: `make test-fast` leaves it out

TESTS = Path(__file__).resolve().parent.parent
FEED = list(range(10))  # feed indices: the steps of the fully-async rollouter
HOOK = "stepjournal.adapters.verl.install_fully_async"


DOC_LINES = sharing_docs.topology_doc_lines({"the rollout node", "the trainer node", "machine C", "machine D",
                                            "the rollout node (payloads on S3)", "the trainer node (payloads on S3)"})


def topology_commands() -> list:
    """(node, line) of each command line of docs/sharing.md's Topologies section written for verl's nodes."""
    return sharing_docs.topology_commands({"the rollout node", "the trainer node", "machine C"})


def refusal_excerpts() -> list:
    """The error texts quoted in the refusal table of docs/sharing.md's Topologies section."""
    section = sharing_docs.topology_section()
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and "Error` |" in line]
    assert len(rows) == 3, rows
    return [row[2].strip().strip("`") for row in rows]


def runtime_env(endpoint: str) -> dict:
    env = client_env(endpoint)  # credentials as the client reads them: environment variables
    env["PYTHONPATH"] = str(TESTS)  # workers import verl_ray_support by name
    env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"  # `stepjournal`
    return {"worker_process_setup_hook": HOOK, "env_vars": env}


@pytest.fixture
def two_nodes(s3_server):  # noqa: F811
    """A head node ("trainer") and a second node ("rollout"), this process connected; shut down after."""
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"trainer": 1}, "include_dashboard": False, "object_store_memory": 80 << 20})
    try:
        rollout_node = cluster.add_node(num_cpus=3, resources={"rollout": 1}, object_store_memory=80 << 20)
        ray.init(address=cluster.address, runtime_env=runtime_env(s3_server), log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster, rollout_node.node_id
    finally:
        ray.shutdown()
        cluster.shutdown()

def answer_tokens(rolled: list) -> dict:
    """Feed index -> the answer token of each of its samples (`rolled` holds feed indices 0, 1 ... in order,
    as `Rollouter.roll(FEED)` returns them)."""
    return {i: torch.tensor([answer_token(rm["ground_truth"]) for rm in rolled[i].non_tensor_batch["reward_model"]])
            for i in range(len(rolled))}


def scored(journal: Journal, policy: str, rolled: list, truths: dict) -> dict:
    """The trainer side: feed index -> the reward of its responses, journaled as the ``reward`` stage."""
    score = journaled(reward, journal, policy, stage="reward")
    return {i: score(rolled[i].batch["responses"], truths[i], step=i) for i in truths}


def on_node(lines, node, run, cwd):
    for where, line in lines:
        if where == node:
            done = run(line, cwd)
            assert done["rc"] == 0, (line, done["stderr"])


def test_a_rollouter_on_another_ray_node_and_the_trainer_push_to_one_remote_that_replays_exactly_on_one_node(
        tmp_path, two_nodes, s3_server, monkeypatch):  # noqa: F811
    cluster, rollout_node = two_nodes
    for var, value in runtime_env(s3_server)["env_vars"].items():  # this process's shell: as the workers'
        monkeypatch.setenv(var, value)
    bucket = f"s3://{make_bucket(s3_server)}"
    lines = [(node, line.replace("s3://bucket", bucket)) for node, line in topology_commands()]
    assert [node for node, _ in lines] == ["the rollout node", "the trainer node", "machine C", "machine C"]
    for folder in ("rollout", "trainer", "machine-c"):
        (tmp_path / folder).mkdir()

    # -- machines A (rollout node) and T (head node): record -----------------------------------------
    pin_rollout = {"resources": {"rollout": 0.01}}
    workers = [SeededSampler.options(**pin_rollout).remote() for _ in range(2)]
    rollouter = Rollouter.options(**pin_rollout).remote(rollout_config(str(tmp_path / "rollout")), workers)
    where = ray.get(rollouter.where.remote())
    assert where["node"] == rollout_node != cluster.head_node.node_id == ray.get_runtime_context().get_node_id()
    assert where["installed"] and where["patched_by"] == "stepjournal.adapters.verl._attach"  # by the hook
    from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncAgentLoopManager

    assert not getattr(FullyAsyncAgentLoopManager, "_stepjournal_installed", False)  # the driver ran no hook
    recorded = ray.get(rollouter.roll.remote(FEED))  # every feed index at once
    calls = ray.get([w.calls.remote() for w in workers])
    assert sum(calls) == len(FEED) and min(calls) > 0  # verl's round robin over both workers
    # The trainer side is this process (a Ray driver runs on the head node): it scores each sample and
    # journals that reward stage in its own folder, under the same run key.
    truths = answer_tokens(recorded)
    with Journal(str(tmp_path / "trainer"), run=RUN_KEY) as journal:
        rewards = scored(journal, "cache", recorded, truths)
    assert ray.get(rollouter.journal_path.remote()) == str(tmp_path / "rollout" / "stepjournal")
    ray.get(rollouter.close.remote())

    on_node(lines, "the rollout node", lambda line, cwd: ray.get(rollouter.shell.remote(line, cwd)), str(tmp_path))
    on_node(lines, "the trainer node", _local, str(tmp_path))
    ray.shutdown()
    cluster.shutdown()

    # -- machine C: one node, clone, replay with samplers that raise ----------------------------------
    clone_lines = [(n, line) for n, line in lines if "audit" not in line]
    on_node(clone_lines, "machine C", _local, str(tmp_path))
    ray.init(num_cpus=2, runtime_env=runtime_env(s3_server), log_to_driver=False, include_dashboard=False,
             object_store_memory=80 << 20)
    try:
        failing = SeededSampler.remote(fail=True)  # one worker where there were two, on one node
        machine_c = str(tmp_path / "machine-c")
        rollouter = Rollouter.remote(rollout_config(machine_c), [failing])
        replayed = ray.get(rollouter.roll.remote(FEED))
        assert ray.get(failing.calls.remote()) == 0
        for index in FEED:
            assert dataproto_diff(replayed[index], recorded[index]) == [], index

        # Topologies that cannot replay exactly are refused, each with a typed error.
        ray.get(rollouter.configure.remote(rollout_config(machine_c, n=4)))  # 4 responses per feed index, not 2
        refused = ray.get(rollouter.try_roll.remote([0]))
        assert refused["type"] == "FingerprintMismatchError", refused
        assert "verl.rollout_n: recorded 2, now 4" in refused["message"]
        assert refused["differences"] == {"verl.rollout_n": (2, 4)}
        messages = [refused["message"]]
        ray.get(rollouter.configure.remote(rollout_config(machine_c, experiment="other", policy="replay")))
        refused = ray.get(rollouter.try_roll.remote([0]))
        assert refused["type"] == "ReplayMissError", refused
        assert f"Run 'other_proj' has no recorded generations in {machine_c}/stepjournal" in refused["message"]
        assert f"which holds run(s) '{RUN_KEY}'" in refused["message"]
        messages.append(refused["message"])
        ray.get(rollouter.configure.remote(rollout_config(machine_c, policy="replay")))
        refused = ray.get(rollouter.try_roll.remote([len(FEED)]))  # a feed index past the recording
        assert refused["type"] == "ReplayMissError" and "has no recorded generations" not in refused["message"]
        assert f"nothing recorded at step {len(FEED)}" in refused["message"]
        messages.append(refused["message"])
        ray.get(rollouter.close.remote())
    finally:
        ray.shutdown()

    # docs/sharing.md quotes each refusal as it reads.
    quoted = [m.replace(f"{tmp_path}{os.sep}", "") for m in messages]
    for excerpt in refusal_excerpts():
        assert any(excerpt in message for message in quoted), excerpt

    # The trainer side replays its reward stage there too, on the replayed responses.
    with Journal(str(tmp_path / "machine-c" / "stepjournal"), run=RUN_KEY) as journal:
        assert all(torch.equal(got, rewards[i]) for i, got in scored(journal, "replay", replayed, truths).items())

    # -- machine C: the audit shows where each call came from ------------------------------------------
    (_, audit_line), = [(n, line) for n, line in lines if "audit" in line]
    done = _local(audit_line, str(tmp_path))
    assert done["rc"] == 0, done["stderr"]
    rows = json.loads(done["stdout"])
    pushed = {"rollout": _source(tmp_path / "rollout" / "stepjournal"), "trainer": _source(tmp_path / "trainer")}
    recorded_rows = [r for r in rows if r["action"] == "generated"]
    assert {(r["stage"], r["origin_journal"]) for r in recorded_rows} == {
        ("generate", pushed["rollout"]), ("reward", pushed["trainer"])}
    assert sorted(r["step"] for r in recorded_rows if r["stage"] == "generate") == FEED
    replays = [r for r in rows if r["action"] == "replayed" and r["run"] == RUN_KEY]
    assert sorted((r["stage"], r["step"], r["source_step"]) for r in replays) == sorted(
        [("generate", i, i) for i in FEED] + [("reward", i, i) for i in FEED])


def test_nodes_writing_payloads_straight_to_the_remote_push_events_only_and_the_clone_replays_exactly(
        tmp_path, two_nodes, s3_server, monkeypatch):  # noqa: F811
    cluster, rollout_node = two_nodes
    for var, value in runtime_env(s3_server)["env_vars"].items():
        monkeypatch.setenv(var, value)
    bucket = f"s3://{make_bucket(s3_server)}"
    url = f"{bucket}/runs/exp2"
    nodes = {"the rollout node (payloads on S3)", "the trainer node (payloads on S3)", "machine D"}
    lines = [(node, line.replace("s3://bucket", bucket)) for node, line in sharing_docs.topology_commands(nodes)]
    assert [node for node, _ in lines] == ["the rollout node (payloads on S3)", "the trainer node (payloads on S3)",
                                           "machine D"]
    assert all(url in line for _, line in lines)
    feed = FEED[:4]

    # -- record: the rollouter (second node) and the trainer (head node) write payloads to the remote --
    pin_rollout = {"resources": {"rollout": 0.01}}
    workers = [SeededSampler.options(**pin_rollout).remote() for _ in range(2)]
    config = rollout_config(str(tmp_path / "rollout"), policy="cache", payload_store=url)
    rollouter = Rollouter.options(**pin_rollout).remote(config, workers)
    assert ray.get(rollouter.where.remote())["node"] == rollout_node != cluster.head_node.node_id
    recorded = ray.get(rollouter.roll.remote(feed))
    ray.get(rollouter.close.remote())
    truths = answer_tokens(recorded)
    with Journal(str(tmp_path / "trainer"), run=RUN_KEY, payload_store=url) as journal:
        rewards = scored(journal, "cache", recorded, truths)
    ray.shutdown()
    cluster.shutdown()

    # Every payload of both journals is on the remote before anything is pushed.
    on_remote = {key[len("payloads/"):] for key in Remote(url).keys("payloads/")}
    for folder, distinct in (("rollout/stepjournal", len(feed)), ("trainer", None)):  # equal rewards are one object
        with Journal(str(tmp_path / folder), readonly=True) as journal:
            digests = {r.digest for r in journal.audit() if r.action == "generated"}
        assert digests and digests <= on_remote and len(digests) == (distinct or len(digests)), folder

    # -- push: events only; clone on machine D ---------------------------------------------------------
    for node in ("the rollout node (payloads on S3)", "the trainer node (payloads on S3)"):
        (printed,) = [_local(line, str(tmp_path)) for where, line in lines if where == node]
        assert printed["rc"] == 0, printed["stderr"]
        report = json.loads(printed["stdout"])
        assert report["events_sent"] > len(feed) and report["payloads_sent"] == 0, report
    on_node(lines, "machine D", _local, str(tmp_path))

    # -- replay on machine D from the clone alone: one worker that must not be called -----------------
    ray.init(num_cpus=2, runtime_env=runtime_env(s3_server), log_to_driver=False, include_dashboard=False,
             object_store_memory=80 << 20)
    try:
        failing = SeededSampler.remote(fail=True)
        rollouter = Rollouter.remote(rollout_config(str(tmp_path / "machine-d"), policy="replay"), [failing])
        replayed = ray.get(rollouter.roll.remote(feed))
        assert ray.get(failing.calls.remote()) == 0
        for index in feed:
            assert dataproto_diff(replayed[index], recorded[index]) == [], index
        ray.get(rollouter.close.remote())
    finally:
        ray.shutdown()
    with Journal(str(tmp_path / "machine-d" / "stepjournal"), run=RUN_KEY) as journal:
        assert all(torch.equal(got, rewards[i]) for i, got in scored(journal, "replay", replayed, truths).items())


def _local(line: str, cwd: str) -> dict:
    done = shell(line, cwd)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def _source(path: Path) -> str:
    from stepjournal.sharing._remote import journal_id  # private: the remote layout

    with Journal(str(path), readonly=True) as journal:
        return journal_id(journal)


# -- the run-key refusal, in one process (fast) ------------------------------------------------------


class ManagerLike:
    """A class with verl's ``generate_sequences_single`` signature: the one `install_fully_async` patches."""

    def __init__(self, config, generator):
        self.config = config
        self.generator = generator

    async def generate_sequences_single(self, prompts):
        return self.generator.generate_sequences(prompts)


def _one_sample(index):
    from omegaconf import OmegaConf
    from verl.experimental.fully_async_policy.detach_utils import prepare_single_generation_data
    from verl.utils.dataset.rl_dataset import collate_fn

    from verl_support import make_rows

    batch = prepare_single_generation_data(collate_fn(make_rows(index, 1)), OmegaConf.create(rollout_config("x")))
    batch.non_tensor_batch["uid"] = np.array([f"uid_sample_0_{index}"] * len(batch), dtype=object)
    return batch


def test_a_replay_under_another_run_key_is_refused_naming_the_recorded_runs_and_the_keys_to_set(tmp_path):
    import asyncio

    from omegaconf import OmegaConf

    from stepjournal.adapters.verl import install_fully_async
    from stepjournal.policies import ReplayMissError
    from verl_support import FakeGenerator

    install_fully_async(ManagerLike)
    dump_dir = str(tmp_path)

    def roll(generator, index=3, **config):
        manager = ManagerLike(OmegaConf.create(rollout_config(dump_dir, **config)), generator)
        try:
            return asyncio.run(manager.generate_sequences_single(_one_sample(index)))
        finally:
            manager.stepjournal.close()

    with pytest.raises(ReplayMissError) as empty:  # an empty journal: nothing to point at
        roll(FakeGenerator(fail=True), policy="replay")
    assert "has no recorded generations" not in str(empty.value)
    roll(FakeGenerator(), policy="cache")
    with pytest.raises(ReplayMissError) as other:
        roll(FakeGenerator(fail=True), policy="replay", experiment="exp2")
    message = str(other.value)
    assert (other.value.step, other.value.gen_index) == (3, 0)
    assert f"Run 'exp2_proj' has no recorded generations in {dump_dir}/stepjournal, which holds run(s) 'exp_proj'" in message
    assert "'{trainer.experiment_name}_{trainer.project_name}'; set those (or stepjournal.run)" in message
    assert isinstance(other.value.__cause__, ReplayMissError)  # the engine's own refusal, kept as the cause
    with pytest.raises(AssertionError, match="generator was called"):  # under cache it is a miss: it generates
        roll(FakeGenerator(fail=True), policy="cache", experiment="exp2")
    with pytest.raises(ReplayMissError) as past:  # the recorded run key, a step never recorded: as it was
        roll(FakeGenerator(fail=True), index=4, policy="replay")
    assert "has no recorded generations" not in str(past.value)
    assert roll(FakeGenerator(fail=True), policy="replay") is not None  # and the recorded step replays
