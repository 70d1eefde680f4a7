"""Which stages of a TRL step the adapter journals, and with which policy: the per-stage spec of `attach`.

The stages (docs/trl.md):

- ``generate``: the intercepted generation (``_generate_single_turn`` or the ``rollout_func``);
- ``reward.<name>``: one per reward function, by TRL's name for it (``trainer.reward_func_names``:
  a function's ``__name__``); ``reward`` in a spec stands for every reward function not named alone;
- ``old_log_prob``: the policy model's per-token log-probs, when TRL computes them;
- ``ref_log_prob``: the reference model's per-token log-probs (``beta > 0``);
- ``metrics``: what the trainer logs at each logging step; recorded (``dump``) unless the spec names it,
  and never replayed: its declared role is record-only (`STAGES`), which the engine enforces;
- ``tool.<name>``: a `GRPOTrainer`'s ``tools=`` function, or its environment (``tool.<class name>``),
  and ``tools`` for every one the spec does not name (`stepjournal.adapters.trl._tools`); they take the
  tool rules (``cache``, ``replay``, ``dump``, ``passthrough``, ``bypass``).

One spec (``"cache"``, a policy object) is generate's policy alone: the downstream
stages are opt-in, each by naming it in a per-stage spec (``"generate:replay/reward:replay"`` or a
mapping). A stage a per-stage spec does not name runs as TRL runs it and is not journaled.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from torch import nn

from stepjournal.events import EVERY_TOOL, tool_stage
from stepjournal.policies import Dump, StagePolicies, check_stage_roles, parse_stages
from stepjournal.vocabulary import Stage, StageRole

from ._errors import TrlAdapterError
from ._tools import trainer_tools

__all__ = [
    "GENERATE",
    "REWARD",
    "OLD_LOG_PROB",
    "REF_LOG_PROB",
    "METRICS",
    "STAGES",
    "reward_stage",
    "journaled_rewards",
    "declared_stages",
    "stage_policies",
]

GENERATE = "generate"
REWARD = "reward"
OLD_LOG_PROB = "old_log_prob"
REF_LOG_PROB = "ref_log_prob"
METRICS = "metrics"
# The stages of a TRL step and their roles (``reward`` has a part per reward function: ``reward.<name>``).
STAGES = (
    Stage("generate"),
    Stage("reward", parts=True),
    Stage("old_log_prob"),
    Stage("ref_log_prob"),
    Stage("metrics", StageRole.RECORD_ONLY),
)


def reward_stage(name: str) -> str:
    """The stage of the reward function TRL names `name` (``"reward.accuracy"``)."""
    return f"{REWARD}.{name}"


def journaled_rewards(trainer: Any) -> Dict[int, str]:
    """Index in ``trainer.reward_funcs`` -> stage, for each reward function the adapter can journal.

    Reward models (``nn.Module``) are called by TRL on tokenized text, not through a function call
    the adapter can wrap: they are not stages.
    """
    return {
        i: reward_stage(name)
        for i, (func, name) in enumerate(zip(trainer.reward_funcs, trainer.reward_func_names))
        if not isinstance(func, nn.Module)
    }


def declared_stages(trainer: Any) -> Tuple[str, ...]:
    """Every stage name a per-stage spec may use for `trainer` (``reward`` stands for every reward function,
    ``tools`` for every tool stage, present when the trainer has tools)."""
    tools = tuple(tool_stage(name) for name in trainer_tools(trainer))
    return (GENERATE, REWARD, *journaled_rewards(trainer).values(), OLD_LOG_PROB, REF_LOG_PROB, METRICS,
            *((EVERY_TOOL, *tools) if tools else ()))


def stage_policies(trainer: Any, policy: Any) -> StagePolicies:
    """The policy of each journaled stage, from what `attach` was given.

    Raises:
        SpecError: a per-stage spec names a stage this trainer does not have (with the closest name)
            or a policy that does not parse.
        StageRoleError: it gives ``metrics`` (record-only) a policy that may replay.
        TrlAdapterError: it names ``old_log_prob`` or ``ref_log_prob`` where the adapter cannot tell
            them apart (a PEFT model with ``beta > 0``: both are forwards of the policy model).
    """
    parsed = parse_stages(policy, stages=declared_stages(trainer))
    if not isinstance(parsed, StagePolicies):  # one spec: generate's alone
        parsed = StagePolicies({GENERATE: parsed}, name=f"{GENERATE}:{parsed.name}")
    policies = dict(parsed.policies)
    every_reward = policies.pop(REWARD, None)
    if every_reward is not None:
        for stage in journaled_rewards(trainer).values():
            policies.setdefault(stage, every_reward)
    if ({OLD_LOG_PROB, REF_LOG_PROB} & set(policies)) and trainer.ref_model is None and trainer.beta != 0.0:
        raise TrlAdapterError(
            "this trainer computes its reference log-probs with the policy model itself (a PEFT adapter "
            "disabled), which the stepjournal TRL adapter cannot tell from the old-policy log-probs: leave "
            "old_log_prob and ref_log_prob out of the per-stage spec"
        )
    policies.setdefault(METRICS, Dump())
    chosen = StagePolicies(policies, name=parsed.name)
    check_stage_roles(chosen, STAGES)
    return chosen
