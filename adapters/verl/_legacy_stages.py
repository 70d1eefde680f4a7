"""The downstream stages of a legacy ``RayPPOTrainer`` step, journaled at verl's own stage methods.

verl 0.9.1's legacy ``fit`` computes each stage with one method on the step's ``DataProto`` and
unions what it returns into the batch: ``_compute_reward_colocate(batch)`` (a colocated reward
model: ``rm_scores``), ``_compute_old_log_prob(batch) -> (DataProto, mfu)``,
``_compute_ref_log_prob(batch)`` and ``_compute_values(batch)``. `LegacyStages` wraps each method a
per-stage spec names as one `Engine.call` of its stage: the input is the batch's model-input
tensors (`LEGACY_STAGE_READS`, rows in the batch's order; no uid), the weights version as for V1,
and a replay returns the recorded return value, which the trainer unions into its batch as it would
the computed one (the rows line up: the input digest says they are the same rows in the same order).
"""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

from stepjournal.log import get_logger
from stepjournal.policies import Engine, Outcome
from stepjournal.vocabulary import Action

from ._calls import validate_mode
from .v1._stages import STAGE_METHODS, named_downstream, stage_weights_version

__all__ = ["LegacyStages", "LEGACY_STAGE_READS"]

log = get_logger(__name__)

_MODEL_INPUT = ("input_ids", "attention_mask", "position_ids", "prompts", "responses", "response_mask")
LEGACY_STAGE_READS = {
    "reward": ("prompts", "responses", "attention_mask"),
    "old_log_prob": _MODEL_INPUT,
    "ref_log_prob": _MODEL_INPUT,
    "values": _MODEL_INPUT,
}


class LegacyStages:
    """The downstream stages of one legacy trainer, journaled through its rollout's `Engine`.

    Attributes:
        stages: the downstream stages the spec names (the ones wrapped).
        outcomes: the `Outcome` of every journaled stage call, in order.
    """

    def __init__(self, trainer: Any, engine: Engine) -> None:
        self.trainer = trainer
        self.engine = engine
        self.outcomes: List[Outcome] = []
        self.stages = named_downstream(engine.policy)

    def hooks(self) -> List[Tuple[Any, str, Callable[..., Any]]]:
        """(object, attribute, replacement) for each trainer method to journal."""
        return [(self.trainer, STAGE_METHODS[stage], self._wrapped(stage, getattr(self.trainer, STAGE_METHODS[stage])))
                for stage in self.stages]

    def install(self) -> "LegacyStages":
        for obj, attr, value in self.hooks():
            setattr(obj, attr, value)
        return self

    def _wrapped(self, stage: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def stage_call(batch: Any, *args: Any, **kwargs: Any) -> Any:
            reads = [name for name in LEGACY_STAGE_READS[stage] if name in batch.batch.keys()]
            outcome = self.engine.call(
                self.trainer.global_steps, lambda: original(batch, *args, **kwargs), stage=stage,
                mode=validate_mode(batch),
                input=batch.select(batch_keys=reads, non_tensor_batch_keys=[], meta_info_keys=[]),
                weights_version=stage_weights_version(self.trainer, stage),
            )
            self.outcomes.append(outcome)
            if outcome.action == Action.REPLAYED:
                source = outcome.source
                assert source is not None  # a replay names the record it served
                log.info("legacy_stage_replayed", stage=stage, step=outcome.ctx.step, source_step=source.step)
            return outcome.value

        stage_call.__wrapped__ = original  # type: ignore[attr-defined]
        return stage_call
