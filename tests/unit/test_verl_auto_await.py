"""Answer consistency through verl's ``auto_await``: a replay's outcome reaches the caller however verl dispatches.

verl 0.9.1's ``AgentLoopManager.generate_sequences`` is an ``async def`` under ``@auto_await`` and
``@SkipManager.annotate(role="rollout")``. ``auto_await`` runs it three ways: with ``asyncio.run``
when the caller is synchronous and no loop runs (``RayPPOTrainer.fit``), on a helper thread when the
caller is synchronous inside a running loop, and as a coroutine when the caller awaits. The first two
run the call in a copy of the caller's context, so an outcome kept in a context variable set inside
the call never reached ``matching_batch``: it returned the batch unchanged, and the rewards of step 3
were computed against step 3's ground truth for step 1's responses.

Real: verl's ``auto_await`` and ``SkipManager.annotate`` on an ``AgentLoopManager``-shaped class,
``attach``, the `MiniPPOTrainer` loop (verl's ``_get_gen_batch``, ``repeat``, ``union``). Stand-in
(GPU): the seeded generator behind the manager.
"""

from __future__ import annotations

import asyncio
import threading
import uuid

import numpy as np
import pytest
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.ray_utils import auto_await
from verl.utils.skip import SkipManager

from stepjournal.adapters.verl import NoOutcomeError, attach, make_journaled_agent_loop_manager, rollout_from_config
from verl_support import GBS, N, FakeGenerator, MiniPPOTrainer, make_rows, score, verl_config

POLICY = "cache@1-2;repeat"  # steps 1-2 generated and recorded, step 3 served step 1's record


class AgentLoopManagerShaped:
    """``AgentLoopManager.generate_sequences`` as verl 0.9.1 declares it, over a seeded generator."""

    def __init__(self, generator: FakeGenerator) -> None:
        self.generator = generator
        self.threads: list = []  # the thread each generating call ran on: which auto_await path ran

    @auto_await
    @SkipManager.annotate(role="rollout")
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        await asyncio.sleep(0)  # a real suspension point, as the agent loop's dispatch has
        self.threads.append(threading.current_thread())
        return self.generator.generate_sequences(prompts)


def trainer_for(tmp_path) -> MiniPPOTrainer:
    trainer = MiniPPOTrainer(verl_config(str(tmp_path), policy=POLICY), AgentLoopManagerShaped(FakeGenerator()),
                             validate_at=())
    trainer.journaled = attach(trainer)  # docs/verl.md: `self.stepjournal = attach(self)` and matching_batch
    return trainer


def assert_step_3_scored_against_step_1(trainer: MiniPPOTrainer) -> None:
    history = trainer.history
    assert trainer.journaled.last_outcome.action == "replayed"
    assert trainer.journaled.last_outcome.source.step == 1
    assert history[(3, 0)]["digest"] == history[(1, 0)]["digest"]  # step 1's responses were served
    assert history[(3, 0)]["truth"] == history[(1, 0)]["truth"]  # ... with step 1's ground truth
    assert history[(3, 0)]["truth"] != [rm["ground_truth"] for rm in step_batch(3).repeat(N, interleave=True)
                                        .non_tensor_batch["reward_model"]]
    assert history[(3, 0)]["reward"] == history[(1, 0)]["reward"]  # the rewards step 1 earned
    assert sum(history[(3, 0)]["reward"]) > 0  # and they depend on the pairing: some responses are right


def step_batch(step: int) -> DataProto:
    batch = DataProto.from_single_dict(collate_fn(make_rows(step, GBS)))
    batch.meta_info["temperature"] = 1.0
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(GBS)], dtype=object)
    return batch


def test_a_synchronous_fit_without_a_loop_gets_the_replayed_outcome_through_asyncio_run(tmp_path):
    trainer = trainer_for(tmp_path)
    try:
        trainer.fit(total=3)  # auto_await's asyncio.run path, as RayPPOTrainer.fit calls it
        assert_step_3_scored_against_step_1(trainer)
    finally:
        trainer.journaled.close()
    assert trainer.async_rollout_manager.threads == [threading.main_thread()] * 2  # steps 1 and 2 generated here


def test_a_synchronous_fit_inside_a_running_loop_gets_the_outcome_through_auto_awaits_thread(tmp_path):
    trainer = trainer_for(tmp_path)

    async def main() -> None:
        trainer.fit(total=3)  # synchronous code in a loop's thread: auto_await runs the call on a helper thread
        assert_step_3_scored_against_step_1(trainer)

    try:
        asyncio.run(main())
    finally:
        trainer.journaled.close()
    threads = trainer.async_rollout_manager.threads
    assert len(threads) == 2 and threading.main_thread() not in threads  # the helper-thread path really ran


def test_an_awaiting_caller_gets_the_replayed_outcome(tmp_path):
    trainer = trainer_for(tmp_path)
    manager, rollout = trainer.async_rollout_manager, trainer.journaled

    async def fit() -> dict:
        truths = {}
        for step in (1, 2, 3):
            trainer.global_steps = step
            batch = step_batch(step)
            gen_batch = RayPPOTrainer._get_gen_batch(trainer, batch)
            gen_batch.meta_info["global_steps"] = step
            output = await manager.generate_sequences(gen_batch.repeat(repeat_times=N, interleave=True))
            matched = rollout.matching_batch(batch).repeat(repeat_times=N, interleave=True)
            output.meta_info.pop("timing", None)
            scored = matched.union(output)
            truths[step] = ([rm["ground_truth"] for rm in scored.non_tensor_batch["reward_model"]],
                            score(scored).tolist())
        return truths

    try:
        truths = asyncio.run(fit())
        assert rollout.last_outcome is None  # asked outside the task that awaited: not this context's call
    finally:
        rollout.close()
    assert manager.threads == [threading.main_thread()] * 2
    assert truths[3] == truths[1] and sum(truths[3][1]) > 0


def test_matching_batch_raises_rather_than_guess_when_no_call_was_made_in_this_thread(tmp_path):
    trainer = trainer_for(tmp_path)
    caught = []
    try:
        trainer.fit(total=3)

        def elsewhere() -> None:
            try:
                trainer.journaled.matching_batch(step_batch(3))
            except NoOutcomeError as exc:
                caught.append(str(exc))

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    finally:
        trainer.journaled.close()
    assert len(caught) == 1 and "no generate call went through this JournaledRollout" in caught[0]
    assert "pass outcome=" in caught[0]


def test_the_no_code_manager_gives_its_caller_the_replayed_outcome(tmp_path):
    """``JournaledAgentLoopManager.generate_sequences`` (auto_await over acall) from synchronous code."""
    cls = make_journaled_agent_loop_manager()
    manager = cls.__new__(cls)  # verl's __init__ starts Ray workers; the journaled half is what is tested
    generator = FakeGenerator()

    async def generate(prompts):
        return generator.generate_sequences(prompts)

    config = verl_config(str(tmp_path), policy=POLICY)
    manager.stepjournal = rollout_from_config(config, generate)
    trainer = MiniPPOTrainer(config, manager, validate_at=())  # verl's _get_gen_batch reads its config
    try:
        for step in (1, 2, 3):
            gen_batch = RayPPOTrainer._get_gen_batch(trainer, step_batch(step))
            gen_batch.meta_info["global_steps"] = step
            manager.generate_sequences(gen_batch.repeat(repeat_times=N, interleave=True))
        outcome = manager.stepjournal.last_outcome
        assert (outcome.action, outcome.source.step) == ("replayed", 1)
        matched = manager.stepjournal.matching_batch(step_batch(3))
        assert [rm["ground_truth"] for rm in matched.non_tensor_batch["reward_model"]] == [
            rm["ground_truth"] for rm in step_batch(1).non_tensor_batch["reward_model"]
        ]
    finally:
        manager.stepjournal.close()


@pytest.mark.parametrize("policy", ["dump", "cache"])
def test_a_call_that_ran_returns_the_batch_itself(tmp_path, policy):
    trainer = MiniPPOTrainer(verl_config(str(tmp_path), policy=policy), AgentLoopManagerShaped(FakeGenerator()),
                             validate_at=())
    trainer.journaled = attach(trainer)
    try:
        trainer.fit(total=1)
        batch = step_batch(1)
        assert trainer.journaled.last_outcome.action == "generated"
        assert trainer.journaled.matching_batch(batch) is batch
    finally:
        trainer.journaled.close()
