"""What the TRL adapter was written against, and what it reads from a trainer.

The supported TRL range, the signature of each intercepted method and TRL's own call site of it
(checked at attach time, so a TRL that moved on fails before training, not in the middle), the
modes a call is journaled under, and the fingerprint of a trainer.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Tuple

from stepjournal._log import get_logger

from ._errors import TrlAdapterError, TrlSignatureError

__all__ = [
    "SUPPORTED_TRL",
    "SINGLE_TURN",
    "ROLLOUT_FUNC",
    "family_of",
    "check_drift",
    "mode_name",
    "mode_of",
    "trainer_fingerprint",
]

log = get_logger(__name__)

# Keep in step with the `trl` extra in pyproject.toml (a test checks that they agree).
SUPPORTED_TRL = ">=1.16.0,<1.17"
# What can be intercepted: the trainer's single-turn generation, or the user's rollout_func.
SINGLE_TURN = "_generate_single_turn"
ROLLOUT_FUNC = "rollout_func"


def _expected_params() -> Dict[type, Tuple[str, ...]]:
    """The parameters of `_generate_single_turn` this adapter was written against, per trainer family."""
    from trl import GRPOTrainer, RLOOTrainer

    return {
        GRPOTrainer: ("self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"),
        RLOOTrainer: ("self", "prompt_ids", "images", "multimodal_fields"),
    }

# How each family's `_generate` calls what is intercepted (checked in TRL's source at attach time).
_CALL_SITES = {
    SINGLE_TURN: "self._generate_single_turn(",
    ROLLOUT_FUNC: "self.rollout_func(prompts, self)",
}


def family_of(trainer: Any) -> type:
    """The TRL trainer class `trainer` is an instance of (`GRPOTrainer` or `RLOOTrainer`)."""
    for base in _expected_params():
        if isinstance(trainer, base):
            return base
    raise TrlAdapterError(
        f"attach() takes a trl.GRPOTrainer or trl.RLOOTrainer (or a subclass), got {type(trainer).__name__}; "
        "for other loops wrap the rollout function with stepjournal.journaled"
    )


def _version_supported() -> bool:
    import trl
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return Version(trl.__version__) in SpecifierSet(SUPPORTED_TRL)


def check_drift(trainer: Any, family: type, target: str) -> None:
    """Fail before training when what `attach` intercepts is not what this adapter was written for."""
    import trl

    untested = "" if _version_supported() else f" (TRL {trl.__version__} is outside the tested range {SUPPORTED_TRL})"
    if target == SINGLE_TURN:
        method = getattr(type(trainer), SINGLE_TURN, None)
        found = tuple(inspect.signature(method).parameters) if callable(method) else None
        expected = _expected_params()[family]
        if found != expected:
            owner = next((c.__qualname__ for c in type(trainer).__mro__ if SINGLE_TURN in vars(c)), "nothing")
            raise TrlSignatureError(
                f"{type(trainer).__name__}.{SINGLE_TURN} (defined by {owner}) takes {found}, but the stepjournal "
                f"TRL adapter expects {expected} as in trl {SUPPORTED_TRL}{untested}; install a supported TRL "
                f"(`pip install 'stepjournal[trl]'`), or keep the method's parameters when overriding it"
            )
    # TRL's own `_generate` must still call what is wrapped, or nothing would ever be journaled.
    try:
        source = inspect.getsource(family._generate)
    except (OSError, TypeError):  # no source shipped (zipped install): the signature check must do
        log.debug("trl_source_unavailable", method=f"{family.__name__}._generate")
    else:
        if _CALL_SITES[target] not in source:
            raise TrlSignatureError(
                f"{family.__name__}._generate no longer calls `{_CALL_SITES[target]}...)`{untested}; the "
                f"stepjournal TRL adapter supports trl {SUPPORTED_TRL}: install that (`pip install "
                "'stepjournal[trl]'`) or upgrade stepjournal"
            )
    if untested:
        log.warning("trl_version_untested", installed=trl.__version__, supported=SUPPORTED_TRL)


def mode_name(trainer: Any, mode: str) -> str:
    """`mode` as journaled: with more than one process, the process index is appended (``train/p1``)."""
    accelerator = trainer.accelerator
    return f"{mode}/p{accelerator.process_index}" if accelerator.num_processes > 1 else mode


def mode_of(trainer: Any) -> str:
    # TRL's own rule (`_generate`, `_prepare_inputs`): the model's training flag tells train from eval.
    return mode_name(trainer, "train" if trainer.model.training else "eval")


def trainer_fingerprint(trainer: Any) -> Dict[str, Any]:
    """What a recorded generation depends on, read from a trainer: pass it as the journal's fingerprint.

    A replay under another fingerprint is refused (see `Engine`), so a journal recorded with another
    model, batch shape, sampling setting or number of processes is not served by mistake.
    """
    family = family_of(trainer)
    args = trainer.args
    config = getattr(trainer.model, "config", None)
    return {
        "trainer": family.__name__,
        "model": getattr(config, "_name_or_path", None) or getattr(config, "model_type", None),
        "num_generations": getattr(trainer, "num_generations", None),
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "steps_per_generation": getattr(args, "steps_per_generation", None),
        "num_iterations": getattr(args, "num_iterations", None),
        "max_completion_length": getattr(args, "max_completion_length", None),
        "temperature": getattr(args, "temperature", None),
        "seed": args.seed,
        "num_processes": trainer.accelerator.num_processes,
        "rollout_func": getattr(trainer, ROLLOUT_FUNC, None) is not None,
    }
