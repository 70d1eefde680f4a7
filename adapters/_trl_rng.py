"""The random-number state a generate call leaves behind: captured after recording, restored on replay.

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
from typing import Any, Dict, Mapping, Tuple

import numpy as np
import torch

from stepjournal._log import get_logger

__all__ = ["capture_rng_state", "restore_rng_state"]

log = get_logger(__name__)


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
