"""The verl adapter in a PPO-shaped loop: record, replay without the generator, DAPO, validation,
resume after a kill, answer consistency, and the trainer/config/async ways of installing it.

The loop is built from verl's own DataProto operations (``from_single_dict``, ``_get_gen_batch``,
``repeat``, ``union``) with a seeded fake generator (tests/verl_support.py).
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import uuid

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.skip import SkipManager

from stepjournal import Journal
from stepjournal.events import CallBypassed, GenerationRecorded, ReplayServed
from stepjournal.adapters.verl import (
    JournaledRollout,
    MissingInputError,
    VerlAdapterError,
    VerlStepError,
    attach,
    dataproto_diff,
    install_fully_async,
    rollout_from_config,
)
from stepjournal.policies import ConfigError, Engine, parse

from verl_support import (
    DAPO,
    GBS,
    N,
    FakeGenerator,
    MiniPPOTrainer,
    fresh_skip_manager,  # noqa: F401  (an autouse fixture)
    make_output,
    make_rows,
    record_until_killed,
    verl_config,
)
from cli_support import run_cli
from reliability_support import worker_context


def _journal(tmp) -> Journal:
    return Journal(os.path.join(str(tmp), "stepjournal"), readonly=True, run="exp_proj")


def _run(tmp, policy="cache", *, fail=False, dapo=DAPO, start=1, **kw) -> MiniPPOTrainer:
    trainer = MiniPPOTrainer(verl_config(str(tmp), policy=policy), FakeGenerator(fail=fail), dapo=dapo, **kw)
    trainer.journaled = attach(trainer)
    try:
        trainer.fit(start=start)
    finally:
        trainer.journaled.close()
    return trainer


def _train_keys(history):
    return sorted(k for k in history if k[0] != "validate")


# -- record, replay, DAPO, validation ----------------------------------------------------------------


def test_twelve_step_loop_records_then_replays_without_calling_the_generator(tmp_path):
    first = _run(tmp_path)
    second = _run(tmp_path, fail=True)  # raises on any training call
    keys = _train_keys(first.history)
    assert keys == _train_keys(second.history)
    assert len(keys) == 12 + sum(n - 1 for n in DAPO.values())
    for key in keys:
        a, b = first.history[key], second.history[key]
        assert a["digest"] == b["digest"] and a["reward"] == b["reward"] and a["truth"] == b["truth"]
        assert dataproto_diff(a["output"], b["output"]) == [], key
        assert isinstance(b["output"], DataProto)
    with _journal(tmp_path) as journal:
        replay_session = journal.sessions()[-1][1].session
        second_calls = [e for _, e in journal.events() if getattr(e, "session", None) == replay_session and not hasattr(e, "fingerprint")]
        assert {type(e) for e in second_calls} == {ReplayServed, CallBypassed}
        assert sum(isinstance(e, ReplayServed) for e in second_calls) == len(keys)


def test_dapo_calls_get_increasing_indices_and_replay_call_for_call(tmp_path):
    _run(tmp_path)
    second = _run(tmp_path, fail=True)
    with _journal(tmp_path) as journal:
        for step, calls in DAPO.items():
            assert journal.recorded_indices(step) == list(range(calls))
        replays = [e for _, e in journal.events(types=[ReplayServed])]
    assert {(e.step, e.gen_index) for e in replays} == set(_train_keys(second.history))
    assert all((e.source_step, e.source_gen_index) == (e.step, e.gen_index) for e in replays)
    # Each DAPO call got its own data, not the first call's (verl's SkipManager served call 0 twice).
    assert second.history[(8, 1)]["digest"] != second.history[(8, 0)]["digest"]


def test_validation_calls_are_bypassed_and_journaled_as_bypassed(tmp_path):
    trainer = _run(tmp_path, dapo={})
    assert trainer.history[("validate", 0)]["rows"] == GBS
    with _journal(tmp_path) as journal:
        bypassed = [e for _, e in journal.events(types=[CallBypassed])]
        recorded = [e for _, e in journal.events(types=[GenerationRecorded])]
    assert sorted(e.step for e in bypassed) == [0, 6, 12]
    assert {e.mode for e in bypassed} == {"validate"}
    assert all(e.mode == "train" for e in recorded)


def test_resume_after_a_kill_at_step_7_continues_call_for_call(tmp_path):
    child = worker_context().Process(target=record_until_killed, args=(str(tmp_path),))
    child.start()
    child.join(300)
    assert child.exitcode == -9, "the recording run should die by SIGKILL at step 7"
    with _journal(tmp_path) as journal:
        assert journal.recorded_steps()[-1] == 7 and journal.recorded_indices(7) == [0]

    resumed = _run(tmp_path, start=7)  # as from the step-6 checkpoint, generator alive
    with _journal(tmp_path) as journal:
        last = journal.sessions()[-1][1].session
        mine = {(e.step, e.gen_index): type(e).__name__ for _, e in journal.events()
                if getattr(e, "session", "") == last and getattr(e, "mode", "") == "train"}
        recorded = [(e.step, e.gen_index) for _, e in journal.events(types=[GenerationRecorded])]
    assert mine[(7, 0)] == "ReplayServed" and mine[(7, 1)] == "GenerationRecorded"
    assert all(mine[k] == "GenerationRecorded" for k in mine if k[0] > 7)
    assert len(recorded) == len(set(recorded)), "no call was recorded twice"

    replay = _run(tmp_path, fail=True)
    reference = MiniPPOTrainer(verl_config(str(tmp_path)), FakeGenerator(), dapo=DAPO)
    reference.fit()  # the same seeded run without any journal
    assert _train_keys(replay.history) == _train_keys(reference.history)
    for key in _train_keys(reference.history):
        assert replay.history[key]["digest"] == reference.history[key]["digest"], key
        assert replay.history[key]["reward"] == reference.history[key]["reward"], key
    assert resumed.history[(7, 1)]["digest"] == reference.history[(7, 1)]["digest"]


# -- answer consistency --------------------------------------------------------------------------------


def test_repeat_serves_other_steps_and_rewards_use_their_own_ground_truth(tmp_path):
    trainer = MiniPPOTrainer(verl_config(str(tmp_path), policy="dump@1-3;repeat"), FakeGenerator(), dapo={}, validate_at=())
    trainer.journaled = attach(trainer)
    trainer.fit(total=6)
    trainer.journaled.close()
    history = trainer.history
    for step, source in ((4, 1), (5, 2), (6, 3)):
        assert history[(step, 0)]["digest"] == history[(source, 0)]["digest"]
        assert history[(step, 0)]["truth"] == history[(source, 0)]["truth"]
        assert history[(step, 0)]["reward"] == history[(source, 0)]["reward"]
        assert sum(history[(step, 0)]["reward"]) > 0  # the ground truth matched the responses


def test_without_the_matching_batch_verl_refuses_to_union_another_steps_responses(tmp_path):
    trainer = MiniPPOTrainer(verl_config(str(tmp_path), policy="dump@1;repeat_last"), FakeGenerator(), dapo={}, validate_at=())
    rollout = attach(trainer)  # not handed to the trainer: it keeps its own batch
    try:
        with pytest.raises(AssertionError, match="not the same object"):
            trainer.fit(total=2)
    finally:
        rollout.close()


def test_matching_batch_lines_up_before_and_after_repeat(tmp_path):
    config = verl_config(str(tmp_path), policy="dump@1;repeat_last")
    rollout = rollout_from_config(config, FakeGenerator().generate_sequences)
    try:
        batches = []
        for step in (1, 2):
            batch = DataProto.from_single_dict(collate_fn(make_rows(step, GBS)))
            batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(GBS)], dtype=object)
            gen = batch.select(non_tensor_batch_keys=list(batch.non_tensor_batch), deepcopy=True)
            gen.meta_info["global_steps"] = step
            rollout(gen.repeat(N, interleave=True))
            batches.append(batch)
        assert rollout.last_outcome.action == "replayed"
        before = rollout.matching_batch(batches[1])
        after = rollout.matching_batch(batches[1].repeat(N, interleave=True))
        assert list(before.non_tensor_batch["uid"]) == list(batches[0].non_tensor_batch["uid"])
        assert [r["ground_truth"] for r in after.non_tensor_batch["reward_model"]] == [
            r["ground_truth"] for r in batches[0].repeat(N, interleave=True).non_tensor_batch["reward_model"]
        ]
        assert torch.equal(before.batch["dummy_tensor"], batches[1].batch["dummy_tensor"])
    finally:
        rollout.close()


def test_a_record_without_input_has_no_matching_batch_unless_told_to_keep(tmp_path):
    journal = Journal(os.path.join(str(tmp_path), "j"), run="r")
    engine = Engine(journal, parse("replay"))
    prompts = DataProto.from_dict(non_tensors={"reward_model": np.array([{"ground_truth": "1"}], dtype=object),
                                               "raw_prompt": np.array(["1 + 0?"], dtype=object)},
                                  meta_info={"global_steps": 1})
    journal.record(1, make_output(prompts, 0, 1, 0), policy="import-verl")  # no input, as verl's SkipManager dumps
    rollout = JournaledRollout(FakeGenerator(fail=True).generate_sequences, engine, step_of=lambda p: 1)
    rollout(prompts)
    with pytest.raises(MissingInputError, match="stored no input"):
        rollout.matching_batch(prompts)
    assert rollout.matching_batch(prompts, missing="keep") is prompts
    rollout.close()


class _GeneratorDown(RuntimeError):
    """The user's own error, raised by the generator."""


def _chain(exc: BaseException) -> list:
    """`exc` and every exception chained to it (as __cause__ or __context__)."""
    found = []
    while exc is not None and exc not in found:
        found.append(exc)
        exc = exc.__cause__ or exc.__context__
    return found


@pytest.mark.parametrize("kind", ["sync generate", "async generate, sync caller", "async generate, awaited"])
def test_an_error_of_the_generator_reaches_the_caller_without_an_unrelated_chained_traceback(tmp_path, kind):
    import traceback

    def sync_generate(prompts):
        raise _GeneratorDown("the model server is down")

    async def async_generate(prompts):
        raise _GeneratorDown("the model server is down")

    journal = Journal(str(tmp_path / "j"), run="r")
    engine = Engine(journal, parse("cache"))
    rollout = JournaledRollout(sync_generate if kind == "sync generate" else async_generate, engine, step_of=lambda p: 1)
    with pytest.raises(_GeneratorDown) as caught:
        if kind == "async generate, awaited":
            asyncio.run(rollout.acall(_gen_batch(1)))
        else:
            rollout(_gen_batch(1))
    assert [type(e) for e in _chain(caught.value)] == [_GeneratorDown]
    printed = "".join(traceback.format_exception(caught.value))
    assert "no running event loop" not in printed and "During handling" not in printed
    assert printed.rstrip().endswith("_GeneratorDown: the model server is down")
    rollout.close()


# -- installing it on real verl objects ------------------------------------------------------------------


class _FakeWorkerMethod:
    """``worker.generate_sequences.remote(chunk)``: an awaitable result, like a Ray ObjectRef."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, chunk):
        async def run():
            await asyncio.sleep(0)
            return self.fn(chunk)

        return run()


class _FakeAgentLoopWorker:
    def __init__(self, generator: FakeGenerator):
        self.generator = generator
        self.generate_sequences = _FakeWorkerMethod(self.generate)

    def generate(self, chunk: DataProto) -> DataProto:
        out = self.generator.generate_sequences(chunk)
        rows = len(out)
        out.meta_info["metrics"] = [
            {"generate_sequences": 0.1, "tool_calls": 0.0, "compute_score": 0.0, "num_preempted": 0} for _ in range(rows)
        ]
        out.meta_info.pop("timing", None)
        return out


def _manager_config(tmp, **extra):
    cfg = verl_config(str(tmp), **extra)
    cfg["actor_rollout_ref"]["model"] = {}
    cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = (
        "stepjournal.adapters.verl.JournaledAgentLoopManager"
    )
    return OmegaConf.create(cfg)


def _gen_batch(step: int, rows: int = GBS, *, validate=False) -> DataProto:
    batch = DataProto.from_single_dict(collate_fn(make_rows(step, rows)))
    batch.pop(batch_keys=["dummy_tensor"])
    batch.meta_info = {"global_steps": step, "validate": validate}
    return batch.repeat(N, interleave=True)


def _manager(config, generator):
    from verl.utils.import_utils import load_class_from_fqn

    cls = load_class_from_fqn(config.actor_rollout_ref.rollout.agent.agent_loop_manager_class, "AgentLoopManager")
    manager = cls(config=config, llm_client=None)
    manager.agent_loop_workers = [_FakeAgentLoopWorker(generator) for _ in range(2)]
    return manager


def test_agent_loop_manager_class_from_config_journals_every_call(tmp_path):
    from verl.experimental.agent_loop import AgentLoopManager

    config = _manager_config(tmp_path, policy="cache")
    first = _manager(config, FakeGenerator())
    assert isinstance(first, AgentLoopManager)
    outputs = {step: first.generate_sequences(_gen_batch(step)) for step in (1, 2)}
    first.generate_sequences(_gen_batch(2, validate=True))
    first.stepjournal.close()

    second = _manager(config, FakeGenerator(fail=True))

    async def awaited():  # verl's manager is auto_await: awaiting callers get a coroutine
        return await second.generate_sequences(_gen_batch(2))

    assert dataproto_diff(second.generate_sequences(_gen_batch(1)), outputs[1]) == []
    assert dataproto_diff(asyncio.run(awaited()), outputs[2]) == []
    second.stepjournal.close()
    with _journal(tmp_path) as journal:
        actions = [(type(e).__name__, e.step, e.mode) for _, e in journal.events() if hasattr(e, "mode")]
    assert actions == [
        ("GenerationRecorded", 1, "train"), ("GenerationRecorded", 2, "train"), ("CallBypassed", 2, "validate"),
        ("ReplayServed", 1, "train"), ("ReplayServed", 2, "train"),
    ]


def test_an_existing_skip_manager_config_is_served_by_stepjournal_not_by_verl(tmp_path):
    dump_dir = str(tmp_path / "dumps")
    config = _manager_config(tmp_path)
    config.skip = {"rollout": {"enable": True, "dump_dir": dump_dir, "steps": [1, 2], "action": "cache"}}
    SkipManager.init(config)  # what verl's trainer does: its decorator is live
    SkipManager.set_step(1)
    manager = _manager(config, FakeGenerator())
    for step in (1, 2, 3):
        SkipManager.set_step(step)
        manager.generate_sequences(_gen_batch(step))
    manager.stepjournal.close()
    assert os.listdir(dump_dir) == ["stepjournal"], "verl's SkipManager wrote no pickles"
    with Journal(os.path.join(dump_dir, "stepjournal"), readonly=True, run="exp_proj") as journal:
        stored = [(e.step, e.output is not None) for _, e in journal.events(types=[GenerationRecorded])]
        assert journal.sessions()[0][1].run == "exp_proj"
    assert stored == [(1, True), (2, True), (3, False)]  # cache@1,2 ; passthrough


def test_attach_on_a_real_ray_ppo_trainer_wraps_its_agent_loop_manager(tmp_path):
    from verl.experimental.agent_loop import AgentLoopManager
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    config = _manager_config(tmp_path, policy="dump")
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # the real class; its Ray workers are not started
    trainer.config = config
    trainer.async_rollout_manager = AgentLoopManager(config=config, llm_client=None)
    trainer.async_rollout_manager.agent_loop_workers = [_FakeAgentLoopWorker(FakeGenerator())]
    rollout = attach(trainer)
    with pytest.raises(VerlAdapterError, match="already journaled"):
        attach(trainer)
    for step in (1, 2):
        trainer.global_steps = step
        batch = DataProto.from_single_dict(collate_fn(make_rows(step, GBS)))
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(GBS)], dtype=object)
        gen_batch = trainer._get_gen_batch(batch)
        out = trainer.async_rollout_manager.generate_sequences(gen_batch.repeat(N, interleave=True))
        assert "timing" in out.meta_info and len(out) == GBS * N

    async def awaited():  # verl's one-step-off trainer awaits the manager; attach keeps that working
        return await trainer.async_rollout_manager.generate_sequences(_gen_batch(3))

    trainer.global_steps = 3
    assert len(asyncio.run(awaited())) == GBS * N
    rollout.close()
    assert not isinstance(trainer.async_rollout_manager.generate_sequences, JournaledRollout)
    with _journal(tmp_path) as journal:
        assert journal.recorded_steps() == [1, 2, 3]


def test_attach_needs_an_enabled_form_and_a_step(tmp_path):
    trainer = MiniPPOTrainer(verl_config(str(tmp_path)), FakeGenerator())
    with pytest.raises(ConfigError, match="enables neither"):
        attach(trainer)
    rollout = attach(trainer, policy="cache", dump_dir=str(tmp_path))
    trainer.global_steps = None
    with pytest.raises(VerlStepError, match="global_steps"):
        trainer.async_rollout_manager.generate_sequences(_gen_batch(1))
    rollout.close()


# -- fully-async rollouter ---------------------------------------------------------------------------------


class AsyncManagerLike:
    """Shaped like verl's FullyAsyncAgentLoopManager: an async ``generate_sequences_single`` under
    verl's real ``SkipManager.annotate(role="async_rollout")`` (verl's class itself needs torchtitan)."""

    def __init__(self, config, generator):
        self.config = config
        self.generator = generator

    @SkipManager.annotate(role="async_rollout")
    async def generate_sequences_single(self, prompts: DataProto) -> DataProto:
        await asyncio.sleep(random.random() / 200)
        return self.generator.generate_sequences(prompts)


def _sample(index: int) -> DataProto:
    batch = _gen_batch(index, rows=1)
    batch.non_tensor_batch["uid"] = np.array([f"uid_sample_0_{index}"] * len(batch), dtype=object)
    batch.meta_info = {}
    return batch


def test_fully_async_steps_come_from_feed_indices_and_concurrent_calls_are_safe(tmp_path):
    dump_dir = str(tmp_path / "dumps")
    cfg = verl_config(str(tmp_path))
    cfg["data"].update(train_batch_size=0, gen_batch_size=1)
    cfg["skip"] = {"async_rollout": {"enable": True, "dump_dir": dump_dir, "steps": list(range(40)), "action": "cache"}}
    config = OmegaConf.create(cfg)
    SkipManager.init(config)
    install_fully_async(AsyncManagerLike)
    assert install_fully_async(AsyncManagerLike) is AsyncManagerLike  # idempotent

    class StepFree(FakeGenerator):
        def generate_sequences(self, prompts):
            index = int(prompts.non_tensor_batch["uid"][0].rsplit("_", 1)[1])
            prompts.meta_info["global_steps"] = index
            return super().generate_sequences(prompts)

    first = AsyncManagerLike(config, StepFree())

    async def many(manager, indices):
        return await asyncio.gather(*[manager.generate_sequences_single(_sample(i)) for i in indices])

    recorded = dict(zip(range(24), asyncio.run(many(first, range(24)))))
    threads_out = {}

    def in_thread(i):
        threads_out[i] = asyncio.run(first.generate_sequences_single(_sample(i)))

    threads = [threading.Thread(target=in_thread, args=(i,)) for i in range(24, 32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    recorded.update(threads_out)
    first.stepjournal.close()

    second = AsyncManagerLike(config, StepFree(fail=True))
    replayed = dict(zip(range(32), asyncio.run(many(second, range(32)))))
    second.stepjournal.close()
    for i in range(32):
        assert dataproto_diff(replayed[i], recorded[i]) == [], i
    assert os.listdir(dump_dir) == ["stepjournal"]
    with Journal(os.path.join(dump_dir, "stepjournal"), readonly=True, run="exp_proj") as journal:
        assert journal.recorded_steps() == list(range(32))
        assert all(journal.recorded_indices(i) == [0] for i in range(32))
        replays = [e for _, e in journal.events(types=[ReplayServed])]
    assert sorted((e.step, e.source_step) for e in replays) == [(i, i) for i in range(32)]


def test_a_uid_that_is_not_a_feed_index_is_a_clear_error(tmp_path):
    cfg = verl_config(str(tmp_path), policy="cache", step_source="feed_index")
    rollout = rollout_from_config(cfg, FakeGenerator().generate_sequences)
    batch = _gen_batch(1, rows=1)
    batch.non_tensor_batch["uid"] = np.array(["3f2a"] * len(batch), dtype=object)
    with pytest.raises(VerlStepError, match="sample_<epoch>_<feed index>"):
        rollout(batch)
    rollout.close()


# -- the command line on a journal this adapter made ----------------------------------------------------


def test_cli_audits_verifies_and_shows_a_journal_made_by_the_verl_adapter(tmp_path):
    import json

    _run(tmp_path)
    _run(tmp_path, fail=True)
    path = os.path.join(str(tmp_path), "stepjournal")

    audit = run_cli("audit", path, "--json")
    assert audit.returncode == 0, audit.stderr
    rows = json.loads(audit.stdout)
    replayed = [r for r in rows if r["action"] == "replayed"]
    assert len(replayed) == 12 + sum(n - 1 for n in DAPO.values())
    assert all((r["source_step"], r["source_gen_index"]) == (r["step"], r["gen_index"]) for r in replayed)
    assert {r["mode"] for r in rows if r["action"] == "bypassed"} == {"validate"}
    assert run_cli("verify", path).returncode == 0
    # `show` reads a DataProto's stored structure without importing verl's codec or running its code.
    shown = run_cli("show", path, "8", "--index", "1")
    assert shown.returncode == 0, shown.stderr
    assert "verl.DataProto" in shown.stdout and "responses" in shown.stdout
