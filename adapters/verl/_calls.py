"""What a verl generate call is, and how verl runs it: its prompts, step and mode; verl's decorators undone.

`JournaledRollout` (``_hooks``) reads each call through these; `attach` (``_attach``) picks the step
function for a trainer. Nothing here decides or journals anything.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
from typing import Any, Optional

from ._errors import VerlStepError

__all__ = [
    "prompts_of",
    "validate_mode",
    "meta_step",
    "parse_feed_index",
    "feed_index_step",
    "undecorated",
    "is_async",
    "run_blocking",
]


# -- what a call is: its prompts, step and mode -------------------------------------------------------


def prompts_of(args: tuple, kwargs: dict) -> Any:
    if "prompts" in kwargs:
        return kwargs["prompts"]
    if "batch" in kwargs:
        return kwargs["batch"]
    if args:
        return args[0]
    raise TypeError("generate_sequences was called without a batch; pass the DataProto as its first argument")


def validate_mode(prompts: Any) -> str:
    """``"validate"`` for calls whose ``meta_info["validate"]`` is true (verl's validation), else ``"train"``."""
    meta = getattr(prompts, "meta_info", None) or {}
    return "validate" if bool(meta.get("validate", False)) else "train"


def meta_step(prompts: Any) -> int:
    """The step verl's trainer writes into ``meta_info["global_steps"]`` of every generation batch."""
    meta = getattr(prompts, "meta_info", None) or {}
    if "global_steps" not in meta:
        raise VerlStepError(
            "the generation batch has no meta_info['global_steps']: verl's RayPPOTrainer sets it; in your own "
            "loop set gen_batch.meta_info['global_steps'] = step, or use stepjournal.adapters.verl.attach(trainer)"
        )
    return meta["global_steps"]


def parse_feed_index(uid: str) -> int:
    """The feed index in ``uid_sample_{epoch}_{index}`` / ``sample_{epoch}_{index}`` (fully-async rollouter)."""
    text = uid[4:] if uid.startswith("uid_") else uid
    parts = text.split("_")
    if len(parts) != 3 or parts[0] != "sample" or not parts[1].isdigit() or not parts[2].isdigit():
        raise VerlStepError(
            f"uid {uid!r} is not sample_<epoch>_<feed index>: the fully-async rollouter names samples so; "
            "use step_source='global_steps' for other trainers"
        )
    return int(parts[2])


def feed_index_step(prompts: Any) -> int:
    """The fully-async rollouter's step: the feed index parsed from ``non_tensor_batch["uid"][0]``."""
    uids = (getattr(prompts, "non_tensor_batch", None) or {}).get("uid")
    if uids is None or len(uids) == 0:
        raise VerlStepError("the batch has no non_tensor_batch['uid'] to read the fully-async feed index from")
    return parse_feed_index(str(uids[0]))


# -- undoing verl's SkipManager decorator -------------------------------------------------------------


def _skip_manager_file() -> Optional[str]:
    try:
        import verl.utils.skip.skip_manager as module
    except ImportError:  # pragma: no cover - verl without SkipManager
        return None
    return os.path.realpath(module.__file__)


def undecorated(fn: Any) -> Any:
    """`fn` without verl's `SkipManager.annotate` (and the layers around it), so only stepjournal decides.

    verl's SkipManager reads the same config keys a user migrates from; left in place it would dump and
    serve its own pickles under ours.
    """
    skip_file = _skip_manager_file()
    func = getattr(fn, "__func__", fn)
    layers: list = []
    while func is not None and len(layers) < 32:
        layers.append(func)
        func = getattr(func, "__wrapped__", None)
    decorated = any(
        os.path.realpath(getattr(getattr(layer, "__code__", None), "co_filename", "") or "") == skip_file
        for layer in layers
    )
    if not decorated:
        return fn
    inner = layers[-1]
    owner = getattr(fn, "__self__", None)
    return inner.__get__(owner) if owner is not None else inner


def is_async(fn: Any) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    func = getattr(fn, "__func__", fn)
    return inspect.iscoroutinefunction(inspect.unwrap(func))


def run_blocking(coro: Any) -> Any:
    """Run a coroutine to its end from synchronous code (as verl's `auto_await` does)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        in_loop = False
    else:
        in_loop = True
    # Outside the `except`: an error of the call itself must not carry "no running event loop" as its context.
    if not in_loop:
        return asyncio.run(coro)
    # A loop runs in this thread: blocking it would deadlock, so run in a helper thread.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
