"""The TRL hook point: a trainer's generate calls put under a journal and a policy.

`attach(trainer, journal, policy)` puts one trainer's generate calls under a journal and a policy. It
intercepts the narrowest point that still lets TRL do everything around generation (decoding, tool
calls, rewards, advantages, loss, metrics): the trainer's ``_generate_single_turn``, or the trainer's
``rollout_func`` when the user gave one. `JournaledTrainerMixin` (and the ready-made
`JournaledGRPOTrainer`, `JournaledRLOOTrainer`) does the same from the constructor.

Each call is keyed by:

- step: ``trainer.state.global_step`` when the call is made (TRL generates once every
  ``steps_per_generation * num_iterations`` micro-steps, so only some steps have calls);
- generation index: the call's position within that step, counted per mode (GRPO's tool loop calls
  ``_generate_single_turn`` again within the same step; evaluation makes one call per eval batch);
- mode: ``"train"`` or ``"eval"`` (TRL's own rule: ``trainer.model.training``); with more than one
  process, the process index is appended, as in ``"train/p1"``, so each process records and replays its
  own shard. A single-process run uses the plain names, as every other stepjournal adapter does.

What is stored: the input payload holds the prompt token ids (``{"prompt_ids", "num_generations"}``;
``{"prompts"}`` for a ``rollout_func``); the output payload holds the completion ids and log-probs
(or the whole dict a ``rollout_func`` returned) and the random-number state the call left behind. On
an exact replay (the same step, index and mode) that state is restored, so the replayed run draws the
same random numbers as the recorded one and reproduces it bit for bit.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

import attrs
from trl import GRPOTrainer, RLOOTrainer

from stepjournal.log import get_logger
from stepjournal import Journal
from stepjournal.errors import UnsupportedValueError
from stepjournal.policies import (
    CallHooks,
    Engine,
    EngineOptions,
    Outcome,
    Policy,
    ReplayMissError,
    StagePolicies,
    ToolEngine,
)

from .._tokenizer import record_tokenizer
from ._codec import capture_rng_state, pack_output, restore_rng_state, unpack_output
from ._config import ROLLOUT_FUNC, SINGLE_TURN, check_drift, family_of, mode_name, mode_of, topology_hint
from ._errors import TrlAdapterError
from ._stage_spec import GENERATE, STAGES, declared_stages, stage_policies
from ._stages import StageHooks
from ._tools import ToolHooks, names_tools, trainer_tools

__all__ = ["attach", "TrlRecorder", "JournaledTrainerMixin", "JournaledGRPOTrainer", "JournaledRLOOTrainer"]

# What `attach` takes as a policy: a policy object, a spec string, or a per-stage mapping of specs.
PolicySpec = Union[Policy, str, Mapping[str, Any]]

log = get_logger(__name__)

_HANDLE_ATTR = "_stepjournal"


class TrlRecorder:
    """A trainer's generate calls under a journal and a policy: the handle `attach` returns.

    It records and replays through its `Engine`; it is not a journal (``recorder.journal`` is).
    `TrlJournal` is its former name, kept as an alias.

    Attributes:
        trainer: the trainer attached to.
        journal: the journal the calls go to.
        engine: the `Engine` that decides and journals each call.
        target: what is intercepted: ``"_generate_single_turn"`` or ``"rollout_func"``.
        restore_rng: whether exact replays restore the recorded random-number state.
        counts: calls so far per action (``generated``, ``replayed``, ``bypassed``).
        rng_restored: how many of the replays restored the recorded random-number state (the exact ones).
        last_outcome: the `Outcome` of the latest generate call, or None.
        stages: the stages journaled (``generate`` first, then those the per-stage spec names and
            ``metrics``).
        stage_counts: calls so far per stage other than ``generate``, per action.
        tool_engine: the `ToolEngine` of the trainer's tool and environment calls, when the spec names a
            tool stage (``tools``, ``tool.<name>``); else None.
        tool_counts: tool calls so far per tool stage, per action (empty without a `tool_engine`).
    """

    def __init__(self, trainer: Any, engine: Engine, *, target: str, restore_rng: bool,
                 tool_engine: Optional[ToolEngine] = None) -> None:
        self.trainer = trainer
        self.journal: Journal = engine.journal
        self.engine = engine
        self.target = target
        self.restore_rng = restore_rng
        self.counts: Dict[str, int] = {"generated": 0, "replayed": 0, "bypassed": 0}
        self.rng_restored = 0
        self.last_outcome: Optional[Outcome] = None
        self._family = family_of(trainer)
        self._original: Any = None
        policies = engine.policy.policies if isinstance(engine.policy, StagePolicies) else {GENERATE: engine.policy}
        self.stages: Tuple[str, ...] = tuple(policies)
        self._stage_hooks = StageHooks(
            trainer, engine, tuple(s for s in policies if s != GENERATE), restore_rng=restore_rng
        )
        self.tool_engine = tool_engine
        self._tool_hooks = None if tool_engine is None else ToolHooks(trainer, tool_engine)

    @property
    def tool_counts(self) -> Dict[str, Dict[str, int]]:
        """Tool calls so far per tool stage (``tool.<name>``), per action."""
        return {} if self._tool_hooks is None else self._tool_hooks.counts

    @property
    def stage_counts(self) -> Dict[str, Dict[str, int]]:
        """Calls so far per stage other than ``generate`` (``reward.<name>``, ``metrics`` ...), per action."""
        return self._stage_hooks.counts

    def __repr__(self) -> str:
        return (
            f"TrlRecorder({type(self.trainer).__name__}, target={self.target!r}, journal={self.journal.path!r}, "
            f"policy={getattr(self.engine.policy, 'name', self.engine.policy)!r}, counts={self.counts})"
        )

    # -- installing ------------------------------------------------------------------------------------
    def _install(self) -> None:
        trainer = self.trainer
        if self.target == ROLLOUT_FUNC:
            self._original = trainer.rollout_func

            @functools.wraps(self._original)
            def rollout_func(prompts: Any, trainer_arg: Any) -> Any:
                return self._call(lambda: self._original(prompts, trainer_arg), {"prompts": prompts})

            trainer.rollout_func = rollout_func
        else:
            self._original = getattr(trainer, SINGLE_TURN)  # the bound method
            signature = inspect.signature(self._original)
            with_generations = "num_generations" in signature.parameters

            @functools.wraps(self._original)
            def generate_single_turn(*args: Any, **kwargs: Any) -> Any:
                bound = signature.bind(*args, **kwargs).arguments
                given: Dict[str, Any] = {"prompt_ids": bound["prompt_ids"]}
                if with_generations:
                    given["num_generations"] = bound["num_generations"]
                return self._call(lambda: self._original(*args, **kwargs), given)

            # An instance attribute shadows the class's method for this trainer only.
            setattr(trainer, SINGLE_TURN, generate_single_turn)
        self._stage_hooks.install()
        if self._tool_hooks is not None:
            self._tool_hooks.install()
        setattr(trainer, _HANDLE_ATTR, self)

    def detach(self) -> None:
        """Give the trainer back its own generation; later calls are not journaled. Safe to call twice."""
        trainer = self.trainer
        if getattr(trainer, _HANDLE_ATTR, None) is not self:
            return
        if self._tool_hooks is not None:
            self._tool_hooks.uninstall()  # first: its hooks sit over generate's and the stages'
        if self.target == ROLLOUT_FUNC:
            trainer.rollout_func = self._original
        else:
            vars(trainer).pop(SINGLE_TURN, None)
        self._stage_hooks.uninstall()
        delattr(trainer, _HANDLE_ATTR)
        log.info("trl_detached", trainer=type(trainer).__name__, counts=dict(self.counts))

    # -- one call --------------------------------------------------------------------------------------
    def _call(self, generate: Callable[[], Any], given: Dict[str, Any]) -> Any:
        trainer = self.trainer
        step = int(trainer.state.global_step)
        mode = mode_of(trainer)
        hooks = CallHooks(
            prepare_input=lambda: self._prepare(given, step, mode),
            # The random state is captured first thing after sampling, before anything else draws.
            to_stored=lambda result: self._payload(result, capture_rng_state()),
            from_stored=self._serve,
        )
        try:
            outcome = self.engine.call(step, generate, mode=mode, hooks=hooks)
        except ReplayMissError as exc:
            hint = topology_hint(self.journal, trainer, mode)
            if hint is None:
                raise
            raise ReplayMissError(f"{exc}; {hint}", step=exc.step, gen_index=exc.gen_index) from None
        self._count(outcome)
        return outcome.value

    def _prepare(self, given: Dict[str, Any], step: int, mode: str) -> Tuple[Any, Optional[str]]:
        try:
            prepared = self.journal.prepare(given)
        except UnsupportedValueError as exc:
            # Multimodal prompts may hold images the codec cannot store; the call is still journaled.
            log.warning("trl_input_not_stored", step=step, mode=mode, why=str(exc))
            return None, None
        return prepared, prepared.digest

    def _payload(self, result: Any, rng: Dict[str, Any]) -> Dict[str, Any]:
        return pack_output(self.target, result, rng, pairs=self._family is GRPOTrainer,
                           trainer_name=self._family.__name__)

    def _serve(self, outcome: Outcome) -> Any:
        payload = outcome.value
        ctx = outcome.ctx
        value = unpack_output(
            payload,
            self.target,
            pairs=self._family is GRPOTrainer,
            where=f"step {ctx.step} index {ctx.gen_index}",
            recorded_at=outcome.source.step if outcome.source else None,
        )
        source = outcome.source
        exact = source is not None and (source.event.run, source.event.mode, source.step, source.gen_index) == (
            ctx.run,
            ctx.mode,
            ctx.step,
            ctx.gen_index,
        )
        if self.restore_rng and exact and "rng" in payload:
            restored = restore_rng_state(payload["rng"])
            self.rng_restored += 1
            log.debug("trl_rng_restored", step=ctx.step, gen_index=ctx.gen_index, generators=restored)
        elif self.restore_rng:
            # Serving another step's data: that step's random state belongs to another point of the run.
            log.debug("trl_rng_kept", step=ctx.step, gen_index=ctx.gen_index, exact=exact)
        return value

    def _count(self, outcome: Outcome) -> None:
        self.counts[outcome.action] = self.counts.get(outcome.action, 0) + 1
        self.last_outcome = outcome


def attach(
    trainer: Any,
    journal: Journal,
    policy: PolicySpec = "cache",
    *,
    restore_rng: bool = True,
    bypass_eval: bool = True,
    check_prompts: str = "same_step",
    options: Optional[EngineOptions] = None,
    **option_keywords: Any,
) -> TrlRecorder:
    """Put a `GRPOTrainer`'s or `RLOOTrainer`'s generate calls under a journal and a policy.

    Call it after building the trainer and before `trainer.train()`. With ``policy="replay"`` every
    training generation is served from the journal and the model never samples; with ``"cache"``
    recorded steps are served and the others generated and stored.

    Args:
        trainer: a `trl.GRPOTrainer` or `trl.RLOOTrainer` (or a subclass) instance.
        journal: an open, writable `Journal`.
        policy: a policy object or spec (``"cache"``, ``"replay"``, ``"dump@0-10;replay"`` ...): the
            generate stage's (the other stages then run as TRL runs them); or a per-stage spec (a mapping, or
            ``"generate:replay/reward:replay/ref_log_prob:replay"``) naming each stage to journal:
            ``generate``, ``reward`` (every reward function) or ``reward.<name>`` (one),
            ``old_log_prob``, ``ref_log_prob``, ``metrics`` (recorded with ``dump`` unless named), and
            for a `GRPOTrainer` with ``tools=`` or an ``environment_factory``: ``tool.<name>`` (a tool
            function's name, or an environment's class name) and ``tools`` (every tool stage not named),
            each taking a tool rule (``cache``, ``replay``, ``dump``, ``passthrough``, ``bypass``; see
            docs/agents.md).
        restore_rng: on an exact replay (same step, index and mode), restore the random-number state
            the recorded call left behind, so the replayed run matches the recorded one bit for bit.
        bypass_eval: evaluation calls generate outside the journal (journaled as bypassed), as
            validation does in the other adapters; False records and replays them under mode ``"eval"``.
        check_prompts: ``"same_step"`` (default): a replay of the call's own step and index is served
            only when the trainer asks with the prompt ids recorded there; otherwise the call is
            decided as if it were not recorded (``cache`` generates and stores it, ``replay`` raises
            `InputMismatchError` naming the step). ``"off"``: serve the record whatever the prompts.
        options: the engine's `EngineOptions` (its ``bypass_modes`` is set from `bypass_eval`).
        **option_keywords: each engine option as its own keyword (``verify_input=True``,
            ``on_corrupt="regenerate"`` ...); not together with `options`.

    Returns:
        The `TrlRecorder` handle (also reachable as ``trainer._stepjournal``); ``handle.detach()`` undoes it.

    Raises:
        TrlAdapterError: the trainer is not a GRPO/RLOO trainer, or is already attached, or
            `check_prompts` is neither ``"same_step"`` nor ``"off"``, or the spec names a log-prob
            stage this trainer's TRL does not compute where the adapter can find it, or tool stages
            for a trainer with a ``rollout_func``.
        SpecError: a per-stage spec names a stage this trainer does not have, or a policy that does not parse.
        TypeError: a keyword is not an option, `options` and option keywords were both given, or
            ``bypass_modes`` was given (`bypass_eval` sets it).
        OptionError: an option has a value it does not take.
        TrlSignatureError: the installed TRL (or an override in a subclass) does not have the method
            signature this adapter intercepts.
    """
    family = family_of(trainer)
    if getattr(trainer, _HANDLE_ATTR, None) is not None:
        raise TrlAdapterError(
            f"this {type(trainer).__name__} is already attached to {trainer._stepjournal.journal.path!r}; call "
            "detach() on its handle first"
        )
    target = ROLLOUT_FUNC if getattr(trainer, ROLLOUT_FUNC, None) is not None else SINGLE_TURN
    check_drift(trainer, family, target)
    default_bypass = EngineOptions().bypass_modes
    if "bypass_modes" in option_keywords or (options is not None and options.bypass_modes != default_bypass):
        raise TypeError("attach() sets bypass_modes from bypass_eval: pass bypass_eval=True or False instead")
    options = EngineOptions.from_keywords(options, option_keywords, where="attach")
    if check_prompts not in ("same_step", "off"):
        raise TrlAdapterError(f"attach(check_prompts={check_prompts!r}): use 'same_step' (the default) or 'off'")
    eval_mode = mode_name(trainer, "eval")
    policies = stage_policies(trainer, policy)
    engine = Engine(
        journal,
        policies,
        options=attrs.evolve(
            options, bypass_modes=(eval_mode,) if bypass_eval else (), check_prompts=check_prompts
        ),
        stages=declared_stages(trainer),
        roles=STAGES,
    )
    tool_engine = None
    if names_tools(policies.stages):
        if target == ROLLOUT_FUNC:
            raise TrlAdapterError(
                "the spec names tool stages, but this trainer generates with a rollout_func, whose tool calls "
                "are its own: journal them inside it (stepjournal.adapters.journaled_tool), or leave the tool "
                "stages out of the spec"
            )
        # Tool calls are decided by request, in their own sample and step: their own engine, the same journal.
        tool_engine = ToolEngine(journal, policies, tools=trainer_tools(trainer), options=attrs.evolve(
            options, bypass_modes=(eval_mode,) if bypass_eval else ()))
    # The run's tokenizer, kept once in the journal: `show --text` and `report` decode with it, with no flag.
    # One rank keeps it: the ranks of one launch share the run, and each would be a session recording it.
    if trainer.accelerator.process_index == 0:
        record_tokenizer(journal, getattr(trainer, "processing_class", None))
    handle = TrlRecorder(trainer, engine, target=target, restore_rng=restore_rng, tool_engine=tool_engine)
    handle._install()
    log.info(
        "trl_attached",
        trainer=type(trainer).__name__,
        target=target,
        policy=getattr(engine.policy, "name", repr(engine.policy)),
        journal=journal.path,
        run=journal.run,
        process_index=trainer.accelerator.process_index,
    )
    return handle


class JournaledTrainerMixin:
    """Mix into a TRL trainer to journal its generations from the constructor.

    ``class MyTrainer(JournaledTrainerMixin, GRPOTrainer): ...`` accepts three more keyword arguments:
    ``journal`` (an open `Journal`, required), ``journal_policy`` (default ``"cache"``) and
    ``journal_options`` (a dict of `attach`'s keyword arguments). The handle is ``trainer.stepjournal``.
    """

    def __init__(
        self,
        *args: Any,
        journal: Journal,
        journal_policy: PolicySpec = "cache",
        journal_options: Optional[Mapping[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        attach(self, journal, journal_policy, **dict(journal_options or {}))

    @property
    def stepjournal(self) -> Optional[TrlRecorder]:
        """The `TrlRecorder` handle, or None after `detach()`."""
        return getattr(self, _HANDLE_ATTR, None)


class JournaledGRPOTrainer(JournaledTrainerMixin, GRPOTrainer):
    """`trl.GRPOTrainer` whose generations are journaled (see `JournaledTrainerMixin`)."""


class JournaledRLOOTrainer(JournaledTrainerMixin, RLOOTrainer):
    """`trl.RLOOTrainer` whose generations are journaled (see `JournaledTrainerMixin`)."""


# An alias of the handle (a recorder bound to a trainer, not a journal), for code that names it so.
TrlJournal = TrlRecorder
