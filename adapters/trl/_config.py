"""What the TRL adapter was written against, and what it reads from a trainer.

The supported TRL range, the signature of each intercepted method and TRL's own call site of it
(checked at attach time, so a TRL that moved on fails before training, not in the middle), the
modes a call is journaled under, and the fingerprint of a trainer.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, Type

from stepjournal.log import get_logger

from .._tokenizer_keys import TOKENIZER_KEY
from ._errors import TrlAdapterError, TrlSignatureError

if TYPE_CHECKING:
    from stepjournal import Journal

__all__ = [
    "SUPPORTED_TRL",
    "SINGLE_TURN",
    "ROLLOUT_FUNC",
    "family_of",
    "check_drift",
    "mode_name",
    "mode_of",
    "trainer_fingerprint",
    "SAMPLING_ARGS",
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


def family_of(trainer: Any) -> Type[Any]:
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


def check_drift(trainer: Any, family: Type[Any], target: str) -> None:
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
                f"(`pip install 'trl{SUPPORTED_TRL}'`), or keep the method's parameters when overriding it"
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
                f"'trl{SUPPORTED_TRL}'`) or a newer stepjournal"
            )
    if untested:
        log.warning("trl_version_untested", installed=trl.__version__, supported=SUPPORTED_TRL)


def mode_name(trainer: Any, mode: str) -> str:
    """`mode` as journaled: with more than one process, the process index is appended (``train/p1``)."""
    accelerator = trainer.accelerator
    return f"{mode}/p{accelerator.process_index}" if accelerator.num_processes > 1 else mode


def recorded_processes(journal: "Journal", mode: str) -> int:
    """How many processes recorded `mode` (``train``, ``eval``) of the journal's run: 1 for plain
    records, N for ``mode/p0`` .. ``mode/p{N-1}``, 0 for none (one cursor read per process)."""
    if journal.step_count(mode=mode):
        return 1
    count = 0
    while journal.step_count(mode=f"{mode}/p{count}"):
        count += 1
    return count


def topology_hint(journal: "Journal", trainer: Any, mode: str) -> Optional[str]:
    """Why a replay missed, when the run was recorded by another number of processes; else None."""
    running = trainer.accelerator.num_processes
    recorded = recorded_processes(journal, mode.split("/p", 1)[0])
    if recorded in (0, running):
        return None
    return (f"run {journal.run!r} was recorded by {recorded} process(es) (num_processes={recorded}) and this launch "
            f"runs {running}: each process replays the shard it recorded, so launch with --num_processes {recorded} "
            "(or record again with this topology)")


def mode_of(trainer: Any) -> str:
    # TRL's own rule (`_generate`, `_prepare_inputs`): the model's training flag tells train from eval.
    return mode_name(trainer, "train" if trainer.model.training else "eval")


# Sampling settings of GRPOConfig / RLOOConfig that change what a generate call returns (None when
# the installed TRL's config has no such field).
SAMPLING_ARGS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_completion_length",
    "use_vllm",
    "vllm_mode",
    "use_transformers_paged",
    "cache_implementation",
    "vllm_structured_outputs_regex",
    "max_tool_calling_iterations",
)


def _digest(value: Any) -> Optional[str]:
    """A short, stable digest of a JSON-like value (None stays None)."""
    if value is None:
        return None
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _config_dict(config: Any) -> Any:
    if config is None:
        return None
    to_dict = getattr(config, "to_dict", None)
    return to_dict() if callable(to_dict) else vars(config)


def trainer_fingerprint(trainer: Any) -> Dict[str, Any]:
    """What a recorded generation depends on, read from a trainer: pass it as the journal's fingerprint.

    A replay under another fingerprint is refused (see `Engine`), so a journal recorded with another
    model, tokenizer, batch shape, sampling setting or number of processes is not served by mistake.
    Every key is listed in docs/trl.md; extend it with your own keys (``{**trainer_fingerprint(t),
    "reward": "v2"}``) or relax it by leaving keys out (``fp.pop("seed")``).
    """
    family = family_of(trainer)
    args = trainer.args
    model = trainer.model
    config = getattr(model, "config", None)
    processing = getattr(trainer, "processing_class", None)
    tokenizer = getattr(processing, "tokenizer", processing)  # a multimodal processor holds its tokenizer
    get_vocab = getattr(tokenizer, "get_vocab", None)
    # The transformers path samples with the trainer's own GenerationConfig, built from the args.
    generation_config = getattr(trainer, "generation_config", None) or getattr(model, "generation_config", None)
    fingerprint: Dict[str, Any] = {
        "trainer": family.__name__,
        "model": getattr(config, "_name_or_path", None) or getattr(config, "model_type", None),
        "model_config": _digest(_config_dict(config)),
        TOKENIZER_KEY: getattr(tokenizer, "name_or_path", None) or None,  # where the CLI finds the tokenizer
        "tokenizer_vocab_size": len(tokenizer) if tokenizer is not None else None,
        "tokenizer_vocab": _digest(sorted(get_vocab().items())) if callable(get_vocab) else None,
        "chat_template": _digest(getattr(processing, "chat_template", None)
                                 or getattr(tokenizer, "chat_template", None)),
        "generation_config": _digest(_config_dict(generation_config)),
        "generation_kwargs": _digest(getattr(args, "generation_kwargs", None) or None),
        "chat_template_kwargs": _digest(getattr(args, "chat_template_kwargs", None) or None),
        "num_generations": getattr(trainer, "num_generations", None),
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "steps_per_generation": getattr(args, "steps_per_generation", None),
        "num_iterations": getattr(args, "num_iterations", None),
        "seed": args.seed,
        "num_processes": trainer.accelerator.num_processes,
        "rollout_func": getattr(trainer, ROLLOUT_FUNC, None) is not None,
    }
    for name in SAMPLING_ARGS:
        fingerprint[name] = getattr(args, name, None)
    return fingerprint
