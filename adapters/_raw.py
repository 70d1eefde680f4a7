"""`journaled`: put any rollout function (sync or async) under a journal and a policy."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, Tuple, TypeVar, Union

from stepjournal import Journal
from stepjournal.errors import UnsupportedValueError
from stepjournal.payloads import PreparedPayload
from stepjournal.policies import CallHooks, Engine, EngineOptions, Policy

__all__ = ["journaled", "default_input_of"]

F = TypeVar("F", bound=Callable[..., Any])

_NO_INPUT = CallHooks()


def default_input_of(*args: Any, **kwargs: Any) -> dict:
    """What a call was given, as stored by default: its positional and keyword arguments."""
    return {"args": list(args), "kwargs": dict(kwargs)}


def journaled(
    fn: F,
    journal: Journal,
    policy: Union[Policy, str] = "cache",
    *,
    step_of: Optional[Callable[..., int]] = None,
    mode_of: Optional[Callable[..., str]] = None,
    input_of: Optional[Callable[..., Any]] = default_input_of,
    options: Optional[EngineOptions] = None,
    stage: str = "generate",
    weights_version_of: Optional[Callable[..., Any]] = None,
    **option_keywords: Any,
) -> F:
    """Wrap a rollout function so each call is recorded, replayed or bypassed as the policy decides.

    The wrapped function takes the train step as the keyword ``step=`` (or `step_of(*args, **kwargs)`
    computes it), counts the generate calls within a step itself, and returns exactly what `fn` would
    return: replayed values decode to the same types. ``step`` is passed on to `fn` only when `fn`
    has a parameter named ``step``.

    Args:
        fn: the function that makes a rollout (``def`` or ``async def``).
        journal: an open, writable `Journal`.
        policy: the policy of this function's stage: a policy object or spec string (``"cache"``,
            ``"dump@1-5;repeat"`` ...). A per-stage spec (``"generate:cache/reward:replay@1-5"`` or a
            mapping) is taken too, so several wrapped functions can share one: its entry for `stage`
            decides, and a stage it does not name is bypassed.
        step_of: computes the train step from the call's arguments, instead of ``step=``.
        mode_of: computes the call's mode (default ``"train"``); modes in `bypass_modes` are bypassed.
        input_of: what to store as the call's input (default: its arguments); None stores no input.
            It is not called for a bypassed mode (nothing is stored then).
        options: the engine's `EngineOptions`.
        stage: the stage the calls belong to (default ``"generate"``; e.g. ``"reward"``). A stage other
            than ``"generate"`` needs an input (`input_of` not None): its records replay only onto the
            same input (`StageInputMismatchError` otherwise).
        weights_version_of: for a model-dependent stage, computes the weights version from the call's
            arguments (a JSON scalar such as the global step); it is part of the input digest.
        **option_keywords: each option as its own keyword (``verify_input=True`` ...), the same as
            passing them in `options`; not together with it.

    Returns:
        The wrapper, with the `Engine` as its ``engine`` attribute and the last call's `Outcome` as
        ``last_outcome``.
    """
    if stage != "generate" and input_of is None:
        raise TypeError(
            f"journaled(stage={stage!r}) needs input_of: a stage's record replays only onto the input it was "
            "computed on, so its input must be known (leave input_of at its default to use the arguments)"
        )
    engine = Engine(journal, policy, options=EngineOptions.from_keywords(options, option_keywords, where="journaled"))
    takes_step = "step" in inspect.signature(fn).parameters
    name = getattr(fn, "__qualname__", repr(fn))

    def prepare(value: Any) -> Tuple[PreparedPayload, str]:
        try:
            prepared = journal.prepare(value)
        except UnsupportedValueError as exc:
            raise UnsupportedValueError(
                f"{exc}\n(this is the input of {name}; pass input_of=... to journaled to choose what to store, "
                "or input_of=None to store none)"
            ) from None
        return prepared, prepared.ref.digest

    def call_of(args: tuple, kwargs: dict) -> Tuple[int, str, dict, CallHooks, Any]:
        """The call's step, mode, the keyword arguments `fn` gets, how its input is stored, its weights version."""
        step = kwargs.pop("step", None) if step_of is None else step_of(*args, **kwargs)
        if step is None:
            raise TypeError(
                f"{name} is journaled: call it with step=<train step>, or wrap it with step_of=..."
            )
        if takes_step and step_of is None:
            kwargs["step"] = step
        mode = mode_of(*args, **kwargs) if mode_of is not None else "train"
        hooks = _NO_INPUT if input_of is None else CallHooks(prepare_input=lambda: prepare(input_of(*args, **kwargs)))
        weights = weights_version_of(*args, **kwargs) if weights_version_of is not None else None
        return step, mode, kwargs, hooks, weights

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            step, mode, kwargs, hooks, weights = call_of(args, kwargs)
            outcome = await engine.acall(
                step, lambda: fn(*args, **kwargs), mode=mode, hooks=hooks, stage=stage, weights_version=weights
            )
            wrapper.last_outcome = outcome  # type: ignore[attr-defined]
            return outcome.value

    else:

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            step, mode, kwargs, hooks, weights = call_of(args, kwargs)
            outcome = engine.call(
                step, lambda: fn(*args, **kwargs), mode=mode, hooks=hooks, stage=stage, weights_version=weights
            )
            wrapper.last_outcome = outcome  # type: ignore[attr-defined]
            return outcome.value

    wrapper.engine = engine  # type: ignore[attr-defined]
    wrapper.last_outcome = None  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
