"""verl 0.9.1's own ``RayPPOTrainer.fit``, with docs/verl.md's trainer edit applied, on CPU (no tests here).

`edited_fit` reads the edit from docs/verl.md's ```text block (the line marked ``# +`` and the verl
line it goes before), checks that the block's other lines are verl's own, in order, and compiles
``inspect.getsource(RayPPOTrainer.fit)`` with the line inserted, in ``ray_trainer``'s globals.
`legacy_trainer` builds a ``RayPPOTrainer`` subclass without ``__init__`` (which starts Ray and GPU
workers) and sets what ``fit`` reads. Stand-ins only for what needs a GPU: the agent-loop manager (over
the seeded `FakeGenerator`), the actor worker group, the colocated reward model and the checkpoint
manager's weight sync.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import torch
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.single_controller.ray import ResourcePoolManager
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.reward import resolve_reward_manager_cls
from verl.trainer.ppo.utils import need_critic, need_reference_policy, need_reward_model
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.ray_utils import auto_await
from verl.utils.skip import SkipManager

from verl_support import Workers as StageWorkers
from verl_support import GBS, N, PROMPT_LEN, RESPONSE_LEN, FakeGenerator, make_rows, score
from verl_support import compose

DOC = Path(__file__).resolve().parent.parent / "docs" / "verl.md"
ADDED = "# +"  # how the docs' block marks the line a user adds to verl's fit
STEPS = 3


# -- the docs' edit, applied to verl's own fit ---------------------------------------------------------------


def docs_edit() -> Tuple[List[str], str, str]:
    """The docs' trainer-edit block: (its verl lines, the added line, the verl line it goes before)."""
    blocks = re.findall(r"^```text\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)
    found = [b for b in blocks if "self.stepjournal.matching_batch(" in b]
    assert len(found) == 1, "docs/verl.md should show the trainer edit in exactly one ```text block"
    lines = [line.strip() for line in found[0].splitlines() if line.strip()]
    added = [i for i, line in enumerate(lines) if ADDED in line]
    assert len(added) == 1 and added[0] + 1 < len(lines), f"one line marked {ADDED!r}, followed by verl's line"
    verl_lines = [line for i, line in enumerate(lines) if i != added[0] and line != "..."]
    return verl_lines, lines[added[0]], lines[added[0] + 1]


def fit_source() -> str:
    return textwrap.dedent(inspect.getsource(RayPPOTrainer.fit))


def edited_fit() -> Callable[..., Any]:
    """verl's ``RayPPOTrainer.fit`` with the docs' added line inserted before its anchor, compiled in verl's globals."""
    verl_lines, added, anchor = docs_edit()
    source = fit_source()
    stripped = [line.strip() for line in source.splitlines()]
    at = 0
    for line in verl_lines:  # the block's verl lines are verl's own, in this order
        assert line in stripped[at:], f"docs/verl.md shows {line!r}, which verl's RayPPOTrainer.fit does not have there"
        at = stripped.index(line, at) + 1
    assert stripped.count(anchor) == 1, f"the anchor {anchor!r} should occur once in verl's fit"
    out = []
    for line in source.splitlines(keepends=True):
        if line.strip() == anchor:
            out.append(line[: len(line) - len(line.lstrip())] + added + "\n")
        out.append(line)
    namespace: Dict[str, Any] = {}
    exec(compile("".join(out), "<verl RayPPOTrainer.fit + docs/verl.md edit>", "exec"), vars(ray_trainer), namespace)
    return namespace["fit"]


# -- config ---------------------------------------------------------------------------------------------------


def legacy_config(dump_dir: str, policy: str) -> Any:
    """verl's own Hydra config for the legacy trainer (``main_ppo``), small, quiet, with a stepjournal section."""
    return compose("verl.trainer.main_ppo", [
        "trainer.use_v1=false",
        f"data.train_batch_size={GBS}",
        f"actor_rollout_ref.rollout.n={N}",
        f"data.max_prompt_length={PROMPT_LEN}",
        f"data.max_response_length={RESPONSE_LEN}",
        "trainer.logger=[console]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.total_epochs=1",
        "trainer.balance_batch=false",
        "algorithm.adv_estimator=grpo",
        "critic.enable=false",  # GRPO needs none (verl warns when it has to guess)
        "reward.reward_model.enable=true",  # use_rm: the trainer scores its own batch (_compute_reward_colocate)
        f"+stepjournal.policy='{policy}'",  # what the shell hands Hydra for "+stepjournal.policy='...'"
        f"+stepjournal.dump_dir={dump_dir}",
    ])


# -- stand-ins for what needs a GPU ---------------------------------------------------------------------------


class AgentLoopManager:
    """verl 0.9.1's ``AgentLoopManager.generate_sequences`` declaration and output shape, over the seeded generator.

    Like verl's manager it adds ``priority`` to the prompts; like its ``_postprocess`` without a reward
    loop in the agent loop, it returns response_mask, position_ids, multi_modal_inputs, the extra
    fields and the input's non-tensor fields, with the rollout timing in ``meta_info["timing"]``.
    """

    def __init__(self, generator: FakeGenerator) -> None:
        self.generator = generator

    @auto_await
    @SkipManager.annotate(role="rollout")
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        if "priority" not in prompts.non_tensor_batch:
            prompts.non_tensor_batch["priority"] = np.arange(len(prompts), dtype=np.int64)
        output = self.generator.generate_sequences(prompts)
        rows = len(output)
        attention = output.batch["attention_mask"]
        output.batch["response_mask"] = attention[:, PROMPT_LEN:].clone()
        output.batch["position_ids"] = torch.clamp(torch.cumsum(attention, dim=1) - 1, min=0)
        output.batch.pop("ref_log_prob_bf16")
        output.non_tensor_batch["multi_modal_inputs"] = np.array([{} for _ in range(rows)], dtype=object)
        for key in ("turn_scores", "tool_rewards", "min_global_steps", "max_global_steps", "extras"):
            output.non_tensor_batch[key] = np.array([None] * rows, dtype=object)
        timing = output.meta_info.pop("timing")
        output.meta_info = {"timing": {"agent_loop/generate_sequences/mean": timing["gen"]}}
        return output


class ActorRolloutWorkers(StageWorkers):
    """``actor_rollout_wg``: log-probs shaped as verl's engine workers return them, and ``update_actor``.

    ``update_actor`` keeps, per call, what the trainer trains on: scores, advantages, ground truths, responses.
    """

    def __init__(self) -> None:
        super().__init__()
        self.updates: List[Dict[str, Any]] = []

    def update_actor(self, td: TensorDict) -> TensorDict:
        self.updates.append({
            "token_level_scores": td["token_level_scores"].clone(),
            "advantages": td["advantages"].clone(),
            "ground_truth": [rm["ground_truth"] for rm in tu.get(td, "reward_model")],
            "responses": td["responses"].clone(),
        })
        out = tu.get_tensordict({"dummy": torch.zeros(len(td["token_level_scores"]))})
        tu.assign_non_tensor(out, metrics={"mfu": 0.0, "pg_loss": 0.0})
        return out


class RewardModel:
    """The colocated reward model's ``compute_rm_score``: `score` per response, placed by verl's reward manager."""

    def __init__(self, config: Any) -> None:
        self.manager_cls = resolve_reward_manager_cls(config)
        self.scored: List[List[float]] = []

    def compute_rm_score(self, data: DataProto) -> DataProto:
        scores = score(data).tolist()
        self.scored.append(scores)
        rm_scores = self.manager_cls.assemble_rm_scores(data, scores)
        return DataProto(batch=TensorDict({"rm_scores": rm_scores}, batch_size=len(data)), non_tensor_batch={},
                         meta_info={"reward_extra_keys": []})


class CheckpointManager:
    """Weight sync between trainer and rollout replicas: records what ``fit`` asks of it."""

    def __init__(self) -> None:
        self.updates: List[int] = []
        self.sleeps = 0

    def update_weights(self, step: int) -> None:
        self.updates.append(step)

    def sleep_replicas(self) -> None:
        self.sleeps += 1


# -- the trainer ----------------------------------------------------------------------------------------------


def legacy_trainer(config: Any, generator: FakeGenerator, *, fit: Callable[..., Any]) -> RayPPOTrainer:
    """A ``RayPPOTrainer`` subclass whose ``fit`` is `fit`, with the attributes ``fit`` reads and no workers started."""
    cls = type("LegacyFitTrainer", (RayPPOTrainer,), {"fit": fit})
    trainer = object.__new__(cls)
    trainer.config = config
    trainer.train_dataloader = [collate_fn(make_rows(step, GBS)) for step in range(1, STEPS + 1)]
    trainer.train_dataset = None
    trainer.total_training_steps = STEPS
    trainer.use_rm = need_reward_model(config)
    trainer.use_reference_policy = need_reference_policy(config)
    trainer.use_critic = need_critic(config)
    trainer.ref_in_actor = False
    trainer.async_rollout_manager = AgentLoopManager(generator)
    trainer.actor_rollout_wg = ActorRolloutWorkers()
    trainer.reward_loop_manager = RewardModel(config)
    trainer.checkpoint_manager = CheckpointManager()
    trainer.resource_pool_manager = ResourcePoolManager(resource_pool_spec={"global_pool": [1]}, mapping={})
    trainer._init_dump_executor()
    return trainer
