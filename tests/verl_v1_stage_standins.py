"""Stand-ins for the GPU workers behind verl V1's downstream stages, each counting its calls.

verl's trainer methods (``_compute_reward_colocate``, ``_compute_old_log_prob``,
``_compute_ref_log_prob``, ``_compute_advantage``, ``_update_actor``, ``_compute_metrics``) run for
real around them; these replace only what needs a GPU, and write into TransferQueue what verl's
workers write:

- `LogProbActor`: the actor worker group's ``compute_log_prob`` (FSDP forward): ``log_probs`` and
  ``entropy`` over each whole sequence, nested, as verl's engine workers put them; they move with
  the actor's updates (its weights version). ``update_actor`` keeps the batch and returns a policy
  loss and a KL loss computed from the advantages and log-probs it was handed;
- `RefStandIn`: ``ref_policy_wg.compute_ref_log_prob``;
- `CriticStandIn`: ``critic_wg``'s ``infer_batch`` (``values`` over each sequence, moving with the
  critic's updates) and ``train_mini_batch``;
- `RewardModelStandIn`: a colocated reward model's ``RewardLoopManager`` (no streaming reward
  handles, so the trainer calls ``compute_rm_score`` itself): a score from the response tokens.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch


def _flat(value: Any) -> torch.Tensor:
    return value.values() if getattr(value, "is_nested", False) else value.reshape(-1)


def _nested(rows: List[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _sequences(batch: Any) -> List[torch.Tensor]:
    import transfer_queue as tq

    ids = tq.kv_batch_get(keys=list(batch.keys), partition_id=batch.partition_id, select_fields=["input_ids"])["input_ids"]
    return list(ids.unbind())


def _put(batch: Any, fields: Dict[str, torch.Tensor]) -> None:
    import transfer_queue as tq
    from tensordict import TensorDict

    tq.kv_batch_put(keys=list(batch.keys), partition_id=batch.partition_id,
                    fields=TensorDict(fields, batch_size=len(batch.keys)))


def make_log_prob_actor(base: type) -> type:
    """The harness's actor stand-in, with a counted ``compute_log_prob`` and a loss from what it is handed."""

    class LogProbActor(base):
        def __init__(self) -> None:
            super().__init__()
            self.log_prob_calls = 0

        def compute_log_prob(self, batch: Any) -> Any:
            self.log_prob_calls += 1
            version = len(self.updates)  # the weights move with every update
            seqs = _sequences(batch)
            _put(batch, {"log_probs": _nested([-(s % 7).float() / 10 - 0.01 * version - 0.05 for s in seqs]),
                         "entropy": _nested([(s % 3).float() / 10 for s in seqs])})
            return batch

        def update_actor(self, batch: Any) -> Dict[str, Any]:
            out = super().update_actor(batch)
            fields = self.updates[-1]["fields"]
            advantages, old = _flat(fields.get("advantages")), _flat(fields.get("old_log_probs"))
            metrics = {"mfu": [0.0], "pg_loss": [float(-(advantages * old.exp()).mean())]}
            if "ref_log_prob" in fields.keys():
                metrics["kl_loss"] = [float((old - _flat(fields.get("ref_log_prob"))).mean())]
            out["metrics"] = metrics
            return out

    return LogProbActor


class RefStandIn:
    """``ref_policy_wg``: counted ``compute_ref_log_prob`` writing ``log_probs`` as verl's ref worker does."""

    def __init__(self) -> None:
        self.calls = 0

    def compute_ref_log_prob(self, batch: Any) -> Any:
        self.calls += 1
        _put(batch, {"log_probs": _nested([-(s % 5).float() / 10 - 0.02 for s in _sequences(batch)])})
        return batch


class CriticStandIn:
    """``critic_wg``: counted ``infer_batch`` writing ``values``; ``train_mini_batch`` counts the critic's updates."""

    def __init__(self) -> None:
        self.calls = 0
        self.updates = 0

    def infer_batch(self, batch: Any) -> Any:
        from types import SimpleNamespace

        self.calls += 1
        _put(batch, {"values": _nested([(s % 4).float() / 10 + 0.01 * self.updates for s in _sequences(batch)])})
        return SimpleNamespace(futures=[])  # verl ray.get()s the futures of a DataProtoFuture

    def train_mini_batch(self, batch: Any) -> Any:
        from types import SimpleNamespace

        self.updates += 1
        metrics = {"mfu": [0.0], "vf_loss": [0.1 * self.updates]}
        return SimpleNamespace(get=lambda: {"metrics": metrics})


def reward_model_score(response_ids: List[int]) -> float:
    """The stand-in reward model's score of one response (its tokens, end-of-sequence included): their sum's parity."""
    return float(sum(int(t) for t in response_ids) % 2)


class RewardModelStandIn:
    """A colocated reward model's ``RewardLoopManager``: no streaming handles, a counted ``compute_rm_score``."""

    reward_loop_worker_handles = None

    def __init__(self) -> None:
        self.calls = 0

    def compute_rm_score(self, data: Any) -> Any:
        from tensordict import TensorDict
        from verl.protocol import DataProto

        self.calls += 1
        responses = data.batch["responses"]
        mask = data.batch["attention_mask"][:, -responses.size(1):]
        scores = torch.zeros(responses.shape, dtype=torch.float32)
        for i, length in enumerate(mask.sum(-1).tolist()):
            if length:
                scores[i, length - 1] = reward_model_score(responses[i, :length].tolist())
        return DataProto(batch=TensorDict({"rm_scores": scores}, batch_size=len(data)),
                         meta_info={"reward_extra_keys": []})


# -- the runs of the stage phases (tests/e2e/test_verl_v1_stages.py) --------------------------------------------

ALL_STAGES = "generate:cache/reward:cache/old_log_prob:cache/ref_log_prob:cache"


def stage_overrides(root: str, policy: str, journal_overrides: Any, extra: List[str] = (), *,
                    folder: str = "stages") -> List[str]:
    """A sync V1 run whose old log-probs are recomputed (no bypass) and which has a reference policy (KL loss)."""
    import os

    section = journal_overrides(os.path.join(root, folder), policy)
    return section + ["algorithm.rollout_correction.bypass_mode=false", "actor_rollout_ref.actor.use_kl_loss=true",
                      "trainer.experiment_name=v1_stages"] + list(extra)


def stage_passes(root: str, phase: str, journal_overrides: Any) -> List[Dict[str, Any]]:
    """stages_record: every stage recorded. stages_replay: replayed (the sampler raises), then with another
    advantage setting, then generating anew (another sampler seed) while replaying old log-probs."""
    def run(name: str, policy: str, extra: List[str] = (), folder: str = "stages", **more: Any) -> Dict[str, Any]:
        return dict(name=name, mode="sync", extra=stage_overrides(root, policy, journal_overrides, extra, folder=folder),
                    attach=True, stages=True, **more)

    # GAE: the critic's values, in a journal of its own (its generations are its own).
    gae = run("stages_gae", "generate:cache/values:cache", ["algorithm.adv_estimator=gae"], folder="stages_gae")
    if phase == "stages_record":
        return [run("stages", ALL_STAGES), gae]
    return [
        run("stages", ALL_STAGES),
        gae,
        run("stages_no_std", ALL_STAGES, ["algorithm.norm_adv_by_std_in_grpo=false"]),
        run("stages_new_batch", "generate:passthrough/old_log_prob:replay", server=(False, 8), expect_error=True),
    ]


def with_stage_standins(trainer: Any, rollout: Any, run: Dict[str, Any]) -> None:
    """Put the counted stand-ins in: actor log-probs, the reference policy and a colocated reward model."""
    import ray

    trainer.actor_rollout_wg = make_log_prob_actor(type(trainer.actor_rollout_wg))()
    trainer.ref_policy_wg = RefStandIn()
    trainer.ref_in_actor = False  # what _setup computes without LoRA (init_on_cpu skips _setup)
    trainer.reward_loop_manager = RewardModelStandIn()
    trainer.critic_wg = CriticStandIn()
    if "server" in run:
        ray.get(rollout.server.configure.remote(*run["server"]))


def stage_results(trainer: Any, journal: Any, error: Any) -> Dict[str, Any]:
    """What the stage tests read: each stage call's outcome, the counted stand-ins, the session, a refusal."""
    return {
        "stage_actions": [[o.action, o.ctx.stage, o.ctx.step, o.source.step if o.source is not None else None]
                          for o in journal.stage_outcomes],
        "counts": {"old_log_prob": trainer.actor_rollout_wg.log_prob_calls, "ref_log_prob": trainer.ref_policy_wg.calls,
                   "reward": trainer.reward_loop_manager.calls, "values": trainer.critic_wg.calls},
        "session": journal.journal.session,
        "journal": journal.journal.path,
        "error": error,
    }
