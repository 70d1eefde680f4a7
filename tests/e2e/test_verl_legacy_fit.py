"""Answer consistency through verl 0.9.1's own ``RayPPOTrainer.fit``, with docs/verl.md's one-line edit.

A ``cache@1-2;repeat`` run of 3 steps serves step 3 step 1's responses. With the docs' line
(``batch = self.stepjournal.matching_batch(batch)``, read from docs/verl.md and inserted textually
into ``inspect.getsource(RayPPOTrainer.fit)``), the trainer's colocated reward path
(``use_rm`` → ``_compute_reward_colocate``) scores them against step 1's ground truth, and the actor
is updated on step 1's rewards. Without it, verl's ``DataProto.union`` stops the run.

Real (verl 0.9.1): ``fit`` (``SkipManager.init``, ``Tracking``, ``_get_gen_batch``, ``repeat``,
``union``, ``compute_response_mask``, ``_compute_reward_colocate``, ``extract_reward``,
``_compute_old_log_prob``, rollout-correction metrics, ``compute_advantage`` (GRPO), ``_update_actor``,
``compute_data_metrics`` and the other metrics), the Hydra config from ``main_ppo``'s
``ppo_trainer.yaml``, ``auto_await`` and ``SkipManager.annotate`` on the manager, the reward manager's
``assemble_rm_scores``, ``ResourcePoolManager``, ``attach``, LMDB. Stand-ins (GPU): the agent-loop
manager's generation (the seeded `FakeGenerator`), the actor worker group, the reward model's scores,
the checkpoint manager's weight sync (tests/verl_legacy_fit_harness.py).
"""

from __future__ import annotations

import pytest
import torch
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from stepjournal.events import GenerationRecorded, ReplayServed
from stepjournal.adapters.verl import attach
from verl_support import GBS, N, FakeGenerator, make_rows
from verl_legacy_fit_harness import STEPS, docs_edit, edited_fit, legacy_config, legacy_trainer

pytestmark = pytest.mark.e2e  # verl's RayPPOTrainer.fit end to end: `make test-fast` leaves it out

POLICY = "cache@1-2;repeat"  # steps 1-2 generated and recorded, step 3 served step 1's record


def attached_trainer(tmp_path, fit):
    trainer = legacy_trainer(legacy_config(str(tmp_path), POLICY), FakeGenerator(), fit=fit)
    trainer.stepjournal = attach(trainer)  # docs/verl.md: `self.stepjournal = attach(self)` at the start of fit
    return trainer


def truths(step: int) -> list:
    """The ground truths of the dataset's rows at `step`, one per response (``repeat(n, interleave=True)``)."""
    return [row["reward_model"]["ground_truth"] for row in make_rows(step, GBS) for _ in range(N)]


def test_the_docs_edit_goes_into_verls_fit_before_the_batch_is_repeated():
    verl_lines, added, anchor = docs_edit()
    assert added.startswith("batch = self.stepjournal.matching_batch(batch)")
    assert anchor == "batch = batch.repeat(repeat_times=self.config.actor_rollout_ref.rollout.n, interleave=True)"
    assert "self.async_rollout_manager.generate_sequences(" in verl_lines[0]
    assert edited_fit() is not RayPPOTrainer.fit


def test_verls_fit_with_the_docs_edit_scores_a_replayed_step_against_the_served_records_ground_truth(tmp_path):
    trainer = attached_trainer(tmp_path, edited_fit())
    try:
        trainer.fit()
        outcome = trainer.stepjournal.last_outcome
        events = [e for _, e in trainer.stepjournal.journal.events(types=[GenerationRecorded, ReplayServed])]
    finally:
        trainer.stepjournal.close()
    assert (outcome.action, outcome.ctx.step, outcome.source.step) == ("replayed", 3, 1)
    assert [(type(e).__name__, e.step) for e in events] == [
        ("GenerationRecorded", 1), ("GenerationRecorded", 2), ("ReplayServed", 3)]
    assert (events[2].source_step, events[2].source_gen_index) == (1, 0)  # the journal's audit says so too
    assert trainer.async_rollout_manager.generator.calls == [1, 2]  # step 3 generated nothing
    assert trainer.checkpoint_manager.updates == [0, 1, 2, 3]  # fit ran every step to its weight sync

    updates = trainer.actor_rollout_wg.updates
    assert len(updates) == STEPS
    step1, step3 = updates[0], updates[2]
    assert torch.equal(step3["responses"], step1["responses"])  # step 1's responses were served
    assert step3["ground_truth"] == step1["ground_truth"] == truths(1)  # ... and scored against step 1's truth
    assert step3["ground_truth"] != truths(3)
    assert torch.equal(step3["token_level_scores"], step1["token_level_scores"])  # the rewards step 1 earned
    assert torch.equal(step3["advantages"], step1["advantages"])
    assert step3["token_level_scores"].sum() > 0  # and they depend on the pairing: some responses are right
    scored = trainer.reward_loop_manager.scored
    assert len(scored) == STEPS and scored[2] == scored[0] and 0 < sum(scored[0]) < GBS * N


def test_verls_fit_without_the_docs_edit_stops_at_the_replayed_step(tmp_path):
    trainer = attached_trainer(tmp_path, RayPPOTrainer.fit)
    try:
        with pytest.raises(AssertionError, match="not the same object"):
            trainer.fit()
        assert trainer.stepjournal.last_outcome.action == "replayed"
    finally:
        trainer.stepjournal.close()
    assert len(trainer.actor_rollout_wg.updates) == 2  # steps 1 and 2 trained; step 3 never reached the actor
