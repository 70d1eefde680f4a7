"""What the TRL adapter stores: the payload of one call, and the random-number state it leaves behind.

The output payload is a plain dict (``format`` `PAYLOAD_FORMAT`, ``kind`` the intercepted target,
the completion ids and log-probs or the whole ``rollout_func`` result, and ``rng``), which the
journal's payload codec stores as it is; `pack_output` builds it and `unpack_output` checks it and
gives back what the trainer's method returns.

The random-number state a generate call leaves behind is captured after recording and restored on
replay.

Sampling draws from torch's global generator (the CUDA one when the model is on a GPU). A replay that
skips sampling leaves that generator where it was, so every later draw (TRL shuffles each generation
batch with `torch.randperm`, dropout, the next sampling) would differ from the recorded run. Storing the
state each recorded call ended with, and setting it when the call is replayed, makes the replayed run
draw exactly what the recorded run drew.

Python's `random` and NumPy's global generator are not used by `model.generate`, but a custom
`rollout_func` (or a tool it calls) may use them, so they are captured too: restoring a state the call
did not change is harmless. The state is plain tensors, tuples and arrays, which the payload codec
stores as they are.
"""

from __future__ import annotations

import random
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
import torch

from stepjournal.log import get_logger

from ._config import ROLLOUT_FUNC, SINGLE_TURN, SUPPORTED_TRL
from ._errors import TrlAdapterError, TrlSignatureError

__all__ = [
    "PAYLOAD_FORMAT",
    "pack_output",
    "unpack_output",
    "capture_rng_state",
    "restore_rng_state",
]

log = get_logger(__name__)

# The `format` of every output payload this adapter stores; bump when its keys change meaning.
PAYLOAD_FORMAT = "stepjournal.trl/1"


def pack_output(target: str, result: Any, rng: Dict[str, Any], *, pairs: bool, trainer_name: str) -> Dict[str, Any]:
    """The output payload of one call: what `target` returned and the random-number state after it.

    Args:
        target: `SINGLE_TURN` or `ROLLOUT_FUNC`.
        result: what the intercepted function returned.
        rng: `capture_rng_state()` taken right after the call.
        pairs: the single-turn method returns ``(completion_ids, logprobs)`` (GRPO), not bare ids (RLOO).
        trainer_name: the trainer family, for messages.
    """
    if target == ROLLOUT_FUNC:
        if not isinstance(result, Mapping):
            raise TrlSignatureError(
                f"rollout_func returned a {type(result).__name__}; TRL {SUPPORTED_TRL} expects a dict with "
                "prompt_ids, completion_ids and logprobs"
            )
        return {"format": PAYLOAD_FORMAT, "kind": ROLLOUT_FUNC, "rollout": dict(result), "rng": rng}
    if pairs:
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TrlSignatureError(
                f"{trainer_name}.{SINGLE_TURN} returned a {type(result).__name__}, not (completion_ids, logprobs) "
                f"as in trl {SUPPORTED_TRL}; install a supported TRL (`pip install 'trl{SUPPORTED_TRL}'`)"
            )
        completion_ids, logprobs = result
    else:
        completion_ids, logprobs = result, None
    return {"format": PAYLOAD_FORMAT, "kind": SINGLE_TURN, "completion_ids": completion_ids, "logprobs": logprobs,
            "rng": rng}


def unpack_output(payload: Any, target: str, *, pairs: bool, where: str, recorded_at: Optional[int]) -> Any:
    """What the intercepted function returns, from a served payload (checked to be this adapter's).

    Args:
        payload: the served output payload.
        target: what this trainer intercepts (`SINGLE_TURN` or `ROLLOUT_FUNC`).
        pairs: return ``(completion_ids, logprobs)`` rather than bare ids.
        where: the call, for messages (``"step 3 index 0"``).
        recorded_at: the step the payload was recorded at, when known.
    """
    if not (isinstance(payload, dict) and payload.get("format") == PAYLOAD_FORMAT):
        raise TrlAdapterError(
            f"the generation served for {where} (recorded at step "
            f"{recorded_at if recorded_at is not None else '?'}) was not recorded by the stepjournal TRL adapter "
            f"(format {payload.get('format') if isinstance(payload, dict) else type(payload).__name__!r}, "
            f"expected {PAYLOAD_FORMAT!r}); record into a separate journal or run key"
        )
    if payload.get("kind") != target:
        raise TrlAdapterError(
            f"the generation served for {where} was recorded from "
            f"{payload.get('kind')!r} but this trainer generates through {target!r}; replay with the "
            "same rollout_func setting the journal was recorded with"
        )
    if target == ROLLOUT_FUNC:
        return payload["rollout"]
    if pairs:
        return (payload["completion_ids"], payload["logprobs"])
    return payload["completion_ids"]


def capture_rng_state() -> Dict[str, Any]:
    """The state of every global generator a generate call may have drawn from, as storable values.

    Keys: ``torch`` (the CPU generator, a uint8 tensor), ``python`` (`random.getstate()`), ``numpy``
    (`np.random.get_state()`), and ``cuda`` (one uint8 tensor per device) when CUDA has been initialised
    in this process (without that, nothing can have drawn from it).
    """
    state: Dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: Mapping[str, Any]) -> Tuple[str, ...]:
    """Set the global generators to a state `capture_rng_state` returned; return the keys restored.

    A CUDA state is restored only when this process sees as many CUDA devices as the recording did;
    otherwise the CPU part is still restored and a warning says that CUDA draws may differ.
    """
    restored = []
    if "torch" in state:
        torch.set_rng_state(state["torch"])
        restored.append("torch")
    if "python" in state:
        random.setstate(state["python"])
        restored.append("python")
    if "numpy" in state:
        np.random.set_state(state["numpy"])
        restored.append("numpy")
    cuda = state.get("cuda")
    if cuda:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
            torch.cuda.set_rng_state_all(cuda)
            restored.append("cuda")
        else:
            log.warning(
                "cuda_rng_not_restored",
                recorded_devices=len(cuda),
                visible_devices=torch.cuda.device_count() if torch.cuda.is_available() else 0,
                hint="replay on as many CUDA devices as the recording used for bit-exact results",
            )
    elif torch.cuda.is_available() and torch.cuda.is_initialized():
        log.warning(
            "cuda_rng_not_recorded",
            hint="the call was recorded without CUDA; CUDA draws after this replay may differ",
        )
    return tuple(restored)
