"""The legacy trainer's downstream stages: verl's own ``RayPPOTrainer`` stage methods, journaled by ``attach``.

Real (verl 0.9.1): ``RayPPOTrainer._compute_old_log_prob``, ``_compute_ref_log_prob`` and
``_compute_values`` (padding to no-padding and back, ``DataProto`` / ``TensorDict`` plumbing),
``compute_response_mask``, ``DataProto.union``, and the generate path of `MiniPPOTrainer`
(tests/verl_support.py: verl's ``_get_gen_batch``, ``repeat``, ``union``). Stand-ins (GPU): the
generator and the worker groups' ``compute_log_prob`` / ``compute_ref_log_prob`` / ``infer_batch``,
each counting its calls.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_response_mask

from stepjournal.adapters.verl import attach
from stepjournal.policies import StageInputMismatchError
from verl_support import FakeGenerator, MiniPPOTrainer, Workers, verl_config

ALL = "generate:cache/old_log_prob:cache/ref_log_prob:cache/values:cache"
FIELDS = ("old_log_probs", "ref_log_prob", "values")


class StageTrainer(MiniPPOTrainer):
    """`MiniPPOTrainer`'s generate step followed by verl's legacy stage calls as ``RayPPOTrainer.fit`` makes them."""

    _compute_old_log_prob = RayPPOTrainer._compute_old_log_prob
    _compute_ref_log_prob = RayPPOTrainer._compute_ref_log_prob
    _compute_values = RayPPOTrainer._compute_values

    def __init__(self, config, generator):
        config["actor_rollout_ref"]["actor"] = {}
        super().__init__(OmegaConf.create(config), generator, validate_at=())
        self.actor_rollout_wg = self.ref_policy_wg = self.critic_wg = Workers()
        self.ref_in_actor = False
        self.stages = {}

    def _generate(self, batch, call):
        batch = super()._generate(batch, call)
        batch.batch["response_mask"] = compute_response_mask(batch)
        batch.batch["position_ids"] = torch.clamp(torch.cumsum(batch.batch["attention_mask"], dim=1) - 1, min=0)
        old_log_prob, _mfu = self._compute_old_log_prob(batch)
        batch = batch.union(old_log_prob)
        batch = batch.union(self._compute_ref_log_prob(batch))
        batch = batch.union(self._compute_values(batch))
        self.stages[self.global_steps] = {name: batch.batch[name].clone() for name in FIELDS}
        return batch


def _run(tmp_path, policy, generator):
    trainer = StageTrainer(verl_config(str(tmp_path), policy=policy), generator)
    trainer.journaled = attach(trainer)
    try:
        trainer.fit(total=3)
    finally:
        trainer.journaled.close()
    return trainer


def test_a_legacy_replay_computes_no_old_ref_log_prob_or_values_and_unions_the_same_fields(tmp_path):
    recorded = _run(tmp_path, ALL, FakeGenerator())
    assert recorded.actor_rollout_wg.calls == {"old_log_prob": 3, "ref_log_prob": 3, "values": 3}
    replayed = _run(tmp_path, ALL, FakeGenerator(fail=True))
    assert replayed.actor_rollout_wg.calls == {"old_log_prob": 0, "ref_log_prob": 0, "values": 0}
    assert [(o.action, o.ctx.stage, o.ctx.step) for o in replayed.journaled.stages.outcomes] == [
        ("replayed", stage, step) for step in (1, 2, 3) for stage in ("old_log_prob", "ref_log_prob", "values")]
    for step in (1, 2, 3):
        for name in FIELDS:
            assert torch.equal(replayed.stages[step][name], recorded.stages[step][name]), (step, name)
    assert any(recorded.stages[1]["values"].flatten() != 0)


def test_legacy_log_probs_recorded_on_other_responses_are_refused(tmp_path):
    _run(tmp_path, ALL, FakeGenerator())
    with pytest.raises(StageInputMismatchError) as caught:
        _run(tmp_path, "generate:passthrough/old_log_prob:replay", FakeGenerator(seed=99))
    assert (caught.value.step, caught.value.stage) == (1, "old_log_prob")
