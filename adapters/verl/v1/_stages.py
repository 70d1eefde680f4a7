"""The downstream stages of a verl V1 step, journaled: reward, old/ref log-probs, values, and the step's metrics.

verl's V1 trainer runs each stage of ``PPOTrainer._step_once`` as one method on a ``KVBatchMeta``
(keys and tags; the data lives in TransferQueue): the method reads the batch's fields, calls a worker
(``actor_rollout_wg.compute_log_prob``, ``ref_policy_wg.compute_ref_log_prob``,
``critic_wg.infer_batch``, the colocated reward model's ``compute_rm_score``) and writes its result
fields back. `V1Stages` wraps each method a per-stage spec names, as one `Engine.call` of its stage:

- the call's input is the batch the stage reads: the fields its worker reads (`STAGE_READS`), in
  the batch's key order, under keys with the per-run prompt uids renamed by first appearance (verl
  draws fresh uuid4 uids every run), so a record is valid for the same trajectories in the same
  order and nothing else (`StageInputMismatchError` otherwise, by default);
- model-dependent stages pass a weights version (`stage_weights_version`);
- what is stored: the fields the method wrote into TransferQueue (`STAGE_WRITES` and any new field)
  and the metrics it added; a replay writes those fields back under the current batch's keys and
  adds the same metrics, so the trainer's advantage and update code reads what it read when recorded;
- ``metrics``: after ``_compute_metrics`` the step's logged metrics (less timings and throughput,
  which differ every run) are recorded, never replayed into training.

Decisions are the policies'; this module moves fields in and out of TransferQueue and hands calls to the engine.
"""

from __future__ import annotations

import numbers
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from stepjournal.events import EVERY_TOOL, TOOL_STAGE_PREFIX
from stepjournal.log import get_logger
from stepjournal.policies import ConfigError, Engine, Outcome, SpecError, StagePolicies, check_stage_roles, parse_stages
from stepjournal.vocabulary import Action, Stage, StageRole, stage_names

from .._nodes import select
from ._codec import TQBatch

__all__ = [
    "V1Stages",
    "VERL_STAGES",
    "STAGES",
    "DOWNSTREAM_STAGES",
    "STAGE_READS",
    "STAGE_WRITES",
    "check_verl_stages",
    "named_downstream",
    "stage_weights_version",
    "loggable_metrics",
    "STAGE_METHODS",
]

log = get_logger(__name__)

# The stages of a verl step, in the order the trainer runs them, each with its role: metrics describe
# the step and are recorded, never replayed into training (the engine enforces it).
STAGES = (
    Stage("generate"),
    Stage("reward"),
    Stage("old_log_prob"),
    Stage("ref_log_prob"),
    Stage("values"),
    Stage("metrics", StageRole.RECORD_ONLY),
)
VERL_STAGES = stage_names(STAGES)
DOWNSTREAM_STAGES = VERL_STAGES[1:-1]
STAGE_METHODS = {
    "reward": "_compute_reward_colocate",
    "old_log_prob": "_compute_old_log_prob",
    "ref_log_prob": "_compute_ref_log_prob",
    "values": "_compute_values",
}
# What a model worker reads of a trajectory (verl's agent loop writes these into TransferQueue).
_MODEL_INPUT = ("input_ids", "position_ids", "attention_mask", "prompts", "responses", "response_mask",
                "multi_modal_inputs")
STAGE_READS = {
    "reward": ("prompts", "responses", "raw_prompt"),  # what _compute_reward_colocate selects
    "old_log_prob": _MODEL_INPUT + ("rollout_log_probs",),  # bypass mode copies them; debug metrics read them
    "ref_log_prob": _MODEL_INPUT,
    "values": _MODEL_INPUT,
}
# What each stage writes into TransferQueue: the worker's own output (``log_probs`` over the whole
# sequence, ``values``) and the trainer's response slice of it; any field the call adds is kept too.
STAGE_WRITES = {
    "reward": ("rm_scores",),  # and the reward's extra keys
    "old_log_prob": ("log_probs", "entropy", "old_log_probs"),
    "ref_log_prob": ("log_probs", "ref_log_prob"),
    "values": ("values",),
}
# Metrics that measure time or speed differ in every run: not recorded.
_UNSTABLE_METRICS = re.compile(r"^(timing_s|timing_per_token_ms|perf)/")


def check_verl_stages(policy: Any) -> Any:
    """The policy of a verl journal, its stage names checked (`VERL_STAGES`) and their roles (`STAGES`:
    ``metrics`` may not replay).

    Raises:
        ConfigError: a per-stage spec names a stage verl does not journal (with the closest name; tool stages
            ``tool.<name>`` and ``tools`` are taken).
        StageRoleError: a ConfigError: it gives ``metrics`` a policy that may replay.
    """
    try:
        # Tool stages (``tool.<name>``, ``tools``) are the agent loop's (JournaledToolAgentLoop): verl's tools are
        # named in its tool configs, which the trainer does not read, so any tool name is taken here.
        named = parse_stages(policy)
        tools = tuple(s for s in getattr(named, "stages", ()) if s == EVERY_TOOL or s.startswith(TOOL_STAGE_PREFIX))
        parsed = parse_stages(policy, stages=VERL_STAGES + tools)
    except SpecError as exc:
        raise ConfigError(f"stepjournal.policy: {exc}") from None
    check_stage_roles(parsed, STAGES)
    return parsed


def named_downstream(policy: Any) -> Tuple[str, ...]:
    """The downstream stages a per-stage spec names, in step order (none for one spec: generate only)."""
    return tuple(s for s in DOWNSTREAM_STAGES if isinstance(policy, StagePolicies) and s in policy.stages)


def stage_weights_version(trainer: Any, stage: str) -> Any:
    """What names the weights a stage ran with, as the trainer sees them (None: no model weights).

    ``old_log_prob`` / ``values``: the actor's / critic's updates so far, named by the trainer's
    ``global_steps`` and the mini-batch within it (``local_trigger_step``; the actor and critic
    update once per mini-batch). ``ref_log_prob``: the reference weights, which training never
    changes (the model itself is in the fingerprint). ``reward``: a colocated reward model's path,
    when the config names one.
    """
    step = f"{trainer.global_steps}.{getattr(trainer, 'local_trigger_step', 0)}"
    if stage == "old_log_prob":
        return f"actor@{step}"
    if stage == "values":
        return f"critic@{step}"
    if stage == "ref_log_prob":
        return "ref@initial"
    path = select(getattr(trainer, "config", None), "reward.reward_model.model_path", None)
    return f"reward_model@{path}" if isinstance(path, str) and path else None


def loggable_metrics(metrics: Dict[str, Any]) -> Dict[str, Any]:
    """A step's metrics as plain numbers and strings, less timing and throughput (``timing_s/``, ``perf/`` ...)."""
    out: Dict[str, Any] = {}
    for key in sorted(metrics):
        value = metrics[key]
        if _UNSTABLE_METRICS.match(str(key)):
            continue
        if getattr(value, "ndim", None) == 0 or (hasattr(value, "numel") and value.numel() == 1):
            value = value.item()  # numpy and torch scalars
        if isinstance(value, bool) or isinstance(value, str):
            out[str(key)] = value
        elif isinstance(value, numbers.Integral):
            out[str(key)] = int(value)
        elif isinstance(value, numbers.Real):
            out[str(key)] = float(value)
    return out


def _normal_keys(keys: List[str]) -> List[str]:
    """Trajectory keys with their prompt uids renamed ``p0, p1 ...`` by first appearance."""
    names: Dict[str, str] = {}
    out = []
    for key in keys:
        parts = str(key).rsplit("_", 2)
        uid = parts[0]
        rest = "_".join(parts[1:])
        out.append(f"{names.setdefault(uid, f'p{len(names)}')}_{rest}")
    return out


def _rows(fields: Any, names: Any, keys: List[str], partition_id: Any) -> TQBatch:
    return TQBatch(fields.select(*names), keys=keys, tags=[{} for _ in keys], partition_id=partition_id)


class V1Stages:
    """The downstream stages and metrics of one V1 trainer, journaled through its `Engine`.

    Args:
        trainer: the V1 ``PPOTrainer``.
        engine: the journal's engine (its policy a per-stage spec, or one spec for generate only).
        metrics_engine: the engine that records ``metrics`` (the same engine when the spec names the stage).

    Attributes:
        outcomes: the `Outcome` of every journaled stage call, in order.
    """

    def __init__(self, trainer: Any, engine: Engine, metrics_engine: Engine) -> None:
        self.trainer = trainer
        self.engine = engine
        self.metrics_engine = metrics_engine
        self.outcomes: List[Outcome] = []
        self.stages = named_downstream(engine.policy)

    def hooks(self) -> List[Tuple[Any, str, Callable[..., Any]]]:
        """(object, attribute, replacement) for each trainer method to journal."""
        trainer = self.trainer
        out: List[Tuple[Any, str, Callable[..., Any]]] = []
        for stage in self.stages:
            original = getattr(trainer, STAGE_METHODS[stage])
            out.append((trainer, STAGE_METHODS[stage], self._wrapped(stage, original)))
        compute_metrics = trainer._compute_metrics

        def _compute_metrics(batch: Any, metrics: Dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            result = compute_metrics(batch, metrics, *args, **kwargs)
            self.record_metrics(metrics)
            return result

        out.append((trainer, "_compute_metrics", _compute_metrics))
        return out

    def record_metrics(self, metrics: Dict[str, Any]) -> Outcome:
        """Journal one step's metrics (stage ``metrics``); the trainer logs its own dict whatever the journal holds."""
        plain = loggable_metrics(metrics)
        journal = self.metrics_engine.journal
        outcome = self.metrics_engine.call(
            self.trainer.global_steps, lambda: plain, stage="metrics", input_digest=journal.prepare(plain).digest
        )
        self.outcomes.append(outcome)
        return outcome

    def _wrapped(self, stage: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def stage_call(batch: Any, metrics: Optional[Dict[str, Any]] = None) -> Any:
            return self.call(stage, original, batch, metrics)

        stage_call.__wrapped__ = original  # type: ignore[attr-defined]
        return stage_call

    def call(self, stage: str, original: Callable[..., Any], batch: Any, metrics: Optional[Dict[str, Any]]) -> Any:
        """One journaled stage call: computed and recorded, or its recorded fields put back into TransferQueue."""
        import transfer_queue as tq

        keys, partition = list(batch.keys), batch.partition_id
        before = tq.kv_batch_get(keys=keys, partition_id=partition)
        normal = _normal_keys(keys)
        reads = [name for name in STAGE_READS[stage] if name in before.keys()]
        stage_input = _rows(before, reads, normal, partition)
        ran: Dict[str, Any] = {}

        def compute() -> Dict[str, Any]:
            added: Dict[str, Any] = {}
            ran["result"] = original(batch, metrics=added)
            after = tq.kv_batch_get(keys=keys, partition_id=partition)
            written = [n for n in after.keys() if n in STAGE_WRITES[stage] or n not in before.keys()]
            if metrics is not None:
                metrics.update(added)
            return {"fields": _rows(after, written, normal, partition), "metrics": loggable_metrics(added)}

        outcome = self.engine.call(
            self.trainer.global_steps, compute, stage=stage, input=stage_input,
            weights_version=stage_weights_version(self.trainer, stage),
        )
        self.outcomes.append(outcome)
        if outcome.action != Action.REPLAYED:
            return ran["result"]
        recorded, source = outcome.value, outcome.source
        assert source is not None  # a replay names the record it served
        put = tq.kv_batch_put(keys=keys, partition_id=partition, fields=recorded["fields"].fields)
        if metrics is not None:
            metrics.update(recorded["metrics"])
        log.info("v1_stage_replayed", stage=stage, step=outcome.ctx.step, source_step=source.step,
                 fields=sorted(recorded["fields"].fields.keys()))
        # verl's _compute_old_log_prob hands on the meta its put returned; the other stages the batch itself.
        return put if stage == "old_log_prob" else batch
