"""The downstream stages of a TRL step under the recorder's engine: reward functions, log-probs, metrics.

Hook points (each on the one trainer instance, undone by `StageHooks.uninstall`):

- ``reward.<name>``: each reward function in ``trainer.reward_funcs`` (plain or ``async``) is
  replaced by a wrapper; TRL calls it as before, from ``_calculate_rewards``. Input: the prompts,
  completions, completion ids and the dataset columns TRL passes (``trainer_state``, ``log_extra``,
  ``log_metric`` and ``environments`` left out). Output: the rewards, the ``log_metric`` /
  ``log_extra`` calls the function made (issued again on a replay) and the random-number state.
- ``old_log_prob`` and ``ref_log_prob``: the trainer's ``_get_per_token_logps_and_entropies``, when
  ``_generate_and_score_completions`` calls it (not the loss's own forward): with the reference model
  it is ``ref_log_prob``, with the policy model ``old_log_prob``. Input digest: the token ids, masks,
  ``logits_to_keep``, chunk size and the model inputs TRL passes, and the weights version (not stored:
  the ids are already in the generate record). Output: the log-probs (entropies, aux loss when TRL
  asked for them) and the random-number state.
- ``metrics``: the trainer's ``log``: after TRL logs, the entry it appended to ``state.log_history``
  (timings left out) is recorded; it is never fed back into training.

Every exact replay (the same step, index and mode) restores the random-number state the recorded call
left behind, as generate's replays do, so a replayed run stays bit for bit on the recorded one.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

from trl.trainer.utils import is_async_callable

from stepjournal.errors import UnsupportedValueError
from stepjournal.log import get_logger
from stepjournal.policies import CallHooks, Engine, Outcome

from ._codec import capture_rng_state, restore_rng_state
from ._config import mode_of
from ._errors import TrlAdapterError
from ._stage_spec import METRICS, OLD_LOG_PROB, REF_LOG_PROB, journaled_rewards

__all__ = ["StageHooks", "STAGE_FORMAT", "LOGPS_METHOD", "SCORE_METHOD", "logged_metrics", "weights_version"]

log = get_logger(__name__)

# The `format` of every downstream-stage payload this adapter stores.
STAGE_FORMAT = "stepjournal.trl.stage/1"
LOGPS_METHOD = "_get_per_token_logps_and_entropies"
SCORE_METHOD = "_generate_and_score_completions"
# What TRL adds to every reward function's keywords that is not data of the batch.
_NOT_INPUT = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments")


def _timing(key: str) -> bool:
    return "time" in key or "per_second" in key


def logged_metrics(entry: Dict[str, Any]) -> Dict[str, Any]:
    """What the ``metrics`` stage stores of one ``log_history`` entry: all of it but the timings.

    A timing (a key holding ``time`` or ``per_second``: ``step_time``, ``train_runtime``,
    ``train_samples_per_second`` ...) differs between any two runs; the rest is the training's outcome.
    """
    return {key: value for key, value in entry.items() if not _timing(key)}


def weights_version(trainer: Any, stage: str) -> int:
    """The weights version a log-prob stage is journaled with: a global step.

    ``old_log_prob``: ``trainer.state.global_step``, the optimizer steps the policy model has taken.
    ``ref_log_prob``: the step the reference model was last synced at (``sync_ref_model``: TRL syncs
    every ``ref_model_sync_steps``), else 0 (the initial weights, for the whole run).
    """
    step = int(trainer.state.global_step)
    if stage == OLD_LOG_PROB:
        return step
    args = trainer.args
    if getattr(args, "sync_ref_model", False):
        every = int(args.ref_model_sync_steps)
        return step - step % every
    return 0


class StageHooks:
    """The journaled downstream stages of one trainer, installed and removed together.

    Args:
        trainer: the attached trainer.
        engine: the recorder's `Engine` (its policy decides each stage).
        stages: the stages to journal (those the per-stage spec names), beyond generate.
        restore_rng: restore the recorded random-number state on exact replays.

    Attributes:
        counts: stage -> action -> calls so far.
    """

    def __init__(self, trainer: Any, engine: Engine, stages: Tuple[str, ...], *, restore_rng: bool) -> None:
        self.trainer = trainer
        self.engine = engine
        self.stages = stages
        self.restore_rng = restore_rng
        self.counts: Dict[str, Dict[str, int]] = {}
        self._rewards: Dict[int, Any] = {}  # index in reward_funcs -> the user's function
        self._methods: List[str] = []  # instance attributes installed
        self._scoring = 0  # inside _generate_and_score_completions (depth)

    # -- installing ----------------------------------------------------------------------------------
    def install(self) -> None:
        trainer = self.trainer
        for index, stage in journaled_rewards(trainer).items():
            if stage in self.stages:
                self._rewards[index] = trainer.reward_funcs[index]
                trainer.reward_funcs[index] = self._reward_wrapper(trainer.reward_funcs[index], stage)
        if OLD_LOG_PROB in self.stages or REF_LOG_PROB in self.stages:
            self._check_logps_call_site()
            self._wrap(SCORE_METHOD, self._scoring_wrapper)
            self._wrap(LOGPS_METHOD, self._logps_wrapper)
        if METRICS in self.stages:
            self._wrap("log", self._log_wrapper)

    def uninstall(self) -> None:
        for index, func in self._rewards.items():
            self.trainer.reward_funcs[index] = func
        for name in self._methods:
            vars(self.trainer).pop(name, None)
        self._rewards, self._methods = {}, []

    def _wrap(self, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(self.trainer, name)  # the bound method
        setattr(self.trainer, name, functools.wraps(original)(make(original)))
        self._methods.append(name)

    def _check_logps_call_site(self) -> None:
        method = getattr(type(self.trainer), LOGPS_METHOD, None)
        found = tuple(inspect.signature(method).parameters)[:5] if callable(method) else None
        expected = ("self", "model", "input_ids", "attention_mask", "logits_to_keep")
        try:
            source = inspect.getsource(getattr(type(self.trainer), SCORE_METHOD))
        except (OSError, TypeError):
            source = f"self.{LOGPS_METHOD}("  # no source shipped: the signature check must do
        if found != expected or f"self.{LOGPS_METHOD}(" not in source:
            raise TrlAdapterError(
                f"{type(self.trainer).__name__}.{LOGPS_METHOD} takes {found} (expected {expected}), or "
                f"{SCORE_METHOD} no longer calls it; the old_log_prob and ref_log_prob stages need the TRL "
                "the adapter supports: leave them out of the per-stage spec, or install a supported TRL"
            )

    # -- one stage call --------------------------------------------------------------------------------
    def _hooks(self, prepare: Callable[[], Tuple[Any, Optional[str]]],
               side_effects: Callable[[Any], None]) -> CallHooks:
        return CallHooks(prepare_input=prepare, from_stored=lambda outcome: self._serve(outcome, side_effects))

    def _serve(self, outcome: Outcome, side_effects: Callable[[Any], None]) -> Any:
        payload, ctx, source = outcome.value, outcome.ctx, outcome.source
        if not (isinstance(payload, dict) and payload.get("format") == STAGE_FORMAT):
            raise TrlAdapterError(
                f"the {ctx.stage!r} record served at step {ctx.step} index {ctx.gen_index} was not recorded by "
                f"the stepjournal TRL adapter (expected format {STAGE_FORMAT!r}); record into a separate journal "
                "or run key"
            )
        side_effects(payload)
        exact = source is not None and (source.event.run, source.event.mode, source.step, source.gen_index) == (
            ctx.run, ctx.mode, ctx.step, ctx.gen_index,
        )
        if self.restore_rng and exact and "rng" in payload:
            restore_rng_state(payload["rng"])
        return payload

    def _count(self, outcome: Outcome) -> Any:
        per_stage = self.counts.setdefault(outcome.ctx.stage, {})
        per_stage[outcome.action] = per_stage.get(outcome.action, 0) + 1
        return outcome.value

    def _digest_of(self, given: Dict[str, Any], stage: str, *, store: bool) -> Tuple[Any, Optional[str]]:
        journal = self.engine.journal
        try:
            prepared = journal.prepare(given, store=store)
        except UnsupportedValueError as exc:
            # A dataset column the codec cannot encode: the batch's own data still identifies the input.
            log.warning("trl_stage_input_partly_digested", stage=stage, why=str(exc))
            prepared = journal.prepare({k: v for k, v in given.items() if k != "columns"}, store=store)
        return (prepared if store else None), prepared.digest

    # -- reward functions ------------------------------------------------------------------------------
    def _reward_wrapper(self, func: Any, stage: str) -> Any:
        def given_of(kwargs: Dict[str, Any]) -> Dict[str, Any]:
            columns = {k: v for k, v in kwargs.items() if k not in _NOT_INPUT}
            return {name: kwargs.get(name) for name in _NOT_INPUT[:3]} | {"columns": columns}

        def watched(kwargs: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, list]]:
            calls: Dict[str, list] = {"log_metric": [], "log_extra": []}
            kwargs = dict(kwargs)
            for name in calls:
                forward = kwargs.get(name)
                if callable(forward):
                    kwargs[name] = functools.partial(_logged_call, calls[name], forward)
            return kwargs, calls

        def payload(rewards: Any, calls: Dict[str, list]) -> Dict[str, Any]:
            return {"format": STAGE_FORMAT, "kind": "reward", "rewards": list(rewards), **calls,
                    "rng": capture_rng_state()}

        def replay_logs(kwargs: Dict[str, Any]) -> Callable[[Any], None]:
            def again(payload: Dict[str, Any]) -> None:
                for name in ("log_metric", "log_extra"):
                    forward = kwargs.get(name)
                    for args in payload.get(name, ()):
                        if callable(forward):
                            forward(*args)
            return again

        def prepare(kwargs: Dict[str, Any]) -> Callable[[], Tuple[Any, Optional[str]]]:
            return lambda: self._digest_of(given_of(kwargs), stage, store=True)

        if is_async_callable(func):  # TRL's own test: it awaits the wrapper exactly when it awaited `func`

            @functools.wraps(func)
            async def journaled_async(*args: Any, **kwargs: Any) -> Any:
                live, calls = watched(kwargs)

                async def compute() -> Any:
                    return payload(await func(*args, **live), calls)

                outcome = await self.engine.acall(
                    self._step(), compute, mode=mode_of(self.trainer), stage=stage,
                    hooks=self._hooks(prepare(kwargs), replay_logs(kwargs)),
                )
                return self._count(outcome)["rewards"]

            return journaled_async

        @functools.wraps(func)
        def journaled(*args: Any, **kwargs: Any) -> Any:
            live, calls = watched(kwargs)
            outcome = self.engine.call(
                self._step(), lambda: payload(func(*args, **live), calls), mode=mode_of(self.trainer), stage=stage,
                hooks=self._hooks(prepare(kwargs), replay_logs(kwargs)),
            )
            return self._count(outcome)["rewards"]

        return journaled

    # -- log-probs -------------------------------------------------------------------------------------
    def _scoring_wrapper(self, original: Any) -> Any:
        def scoring(*args: Any, **kwargs: Any) -> Any:
            self._scoring += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._scoring -= 1

        return scoring

    def _logps_wrapper(self, original: Any) -> Any:
        def logps(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: Any, *args: Any,
                  **kwargs: Any) -> Any:
            trainer = self.trainer
            stage = None
            if self._scoring:
                if trainer.ref_model is not None and model is trainer.ref_model:
                    stage = REF_LOG_PROB
                elif model is trainer.model:
                    stage = OLD_LOG_PROB
            if stage not in self.stages:  # the loss's forward, or a stage the spec does not name
                return original(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            given = {
                "input_ids": input_ids, "attention_mask": attention_mask, "logits_to_keep": int(logits_to_keep),
                "args": list(args), "kwargs": {k: v for k, v in kwargs.items() if v is not None},
            }

            def compute() -> Dict[str, Any]:
                found = original(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
                rng = capture_rng_state()
                return {"format": STAGE_FORMAT, "kind": "log_probs", "outputs": list(found), "rng": rng}

            outcome = self.engine.call(
                self._step(), compute, mode=mode_of(trainer), stage=stage,
                weights_version=weights_version(trainer, stage),
                hooks=self._hooks(lambda: self._digest_of(given, stage, store=False), lambda payload: None),
            )
            outputs = self._count(outcome)["outputs"]
            device = input_ids.device
            return tuple(o.to(device) if hasattr(o, "to") else o for o in outputs)

        return logps

    # -- metrics ---------------------------------------------------------------------------------------
    def _log_wrapper(self, original: Any) -> Any:
        def logged(logs: Dict[str, float], *args: Any, **kwargs: Any) -> Any:
            trainer = self.trainer
            mode = mode_of(trainer)  # before TRL logs: its rule for the mode is the same
            history = trainer.state.log_history
            before = len(history)
            result = original(logs, *args, **kwargs)
            if len(history) > before:
                step = self._step()
                entry = logged_metrics(history[-1])
                outcome = self.engine.call(step, lambda: entry, mode=mode, stage=METRICS, input={"step": step})
                self._count(outcome)  # a replayed record is not fed back: the trainer logged its own
            return result

        return logged

    def _step(self) -> int:
        return int(self.trainer.state.global_step)


def _logged_call(calls: list, forward: Callable[..., Any], *args: Any) -> Any:
    calls.append(list(args))
    return forward(*args)
