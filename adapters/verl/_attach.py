"""Ways to install the verl hook point: on a trainer, by config alone, on the fully-async rollouter.

`attach` wraps a trainer's rollout manager (or worker group) with the step from
``trainer.global_steps``; `JournaledAgentLoopManager` (built by `make_journaled_agent_loop_manager`) is
the same thing selected purely by config; `install_fully_async` does it for the fully-async
rollouter, whose step is the feed index in ``sample_{epoch}_{index}`` uids.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Type, Union

from verl.protocol import DataProto

from stepjournal.log import get_logger
from stepjournal.policies import ConfigError, Engine, ReplayMissError, open_engine

from .._tokenizer import record_tokenizer
from ._config import VerlJournalConfig, read_verl_config
from ._nodes import select
from ._errors import VerlAdapterError, VerlStepError
from ._calls import feed_index_step, meta_step, undecorated
from ._hooks import JournaledRollout

if TYPE_CHECKING:
    from verl.experimental.agent_loop import AgentLoopManager

    from .v1._hooks import V1Journal

__all__ = [
    "attach",
    "wrap_generate_sequences",
    "rollout_from_config",
    "install_fully_async",
    "make_journaled_agent_loop_manager",
]

log = get_logger(__name__)


# -- ways to install it -------------------------------------------------------------------------------------


def _step_function(
    config: Optional[VerlJournalConfig], trainer: Any = None, *, fully_async: bool = False
) -> Callable[[Any], int]:
    source = config.step_source if config is not None else "auto"
    if source == "feed_index" or (source == "auto" and fully_async):
        return feed_index_step
    if trainer is not None:

        def trainer_step(prompts: Any) -> int:
            step = getattr(trainer, "global_steps", None)
            if step is None:
                raise VerlStepError(f"{type(trainer).__name__} has no global_steps yet; call generate inside fit()")
            return step

        return trainer_step
    return meta_step


def rollout_from_config(
    config: Any,
    generate: Callable[..., Any],
    *,
    trainer: Any = None,
    step_of: Optional[Callable[[Any], int]] = None,
    **overrides: Any,
) -> Optional[JournaledRollout]:
    """Read a verl config, open its journal and engine, and wrap `generate`; None when no form is enabled.

    Args:
        config: the verl config (dict or OmegaConf), or an already read `VerlJournalConfig`.
        generate: the function to wrap.
        trainer: when given, steps come from ``trainer.global_steps`` (else from ``meta_info``, or
            from the uid feed index for the fully-async form).
        step_of: overrides where steps come from.
        overrides: native ``stepjournal`` keys (``policy=``, ``path=`` ...) applied on top.
    """
    cfg = config if isinstance(config, VerlJournalConfig) else read_verl_config(config, **overrides)
    if cfg is None:
        return None
    engine = open_engine(cfg.engine)
    return JournaledRollout(
        undecorated(generate),
        engine,
        step_of=step_of or _step_function(cfg, trainer),
        rollout_n=cfg.rollout_n,
        config=cfg,
    )


def attach(trainer: Any, *, config: Any = None, target: Optional[str] = None,
           **overrides: Any) -> Union[JournaledRollout, V1Journal]:
    """Journal a verl trainer's rollouts: wrap its rollout entry point, steps from ``trainer.global_steps``.

    Call it before ``trainer.fit()``. For verl's V1 ``PPOTrainer`` (after ``trainer.init()``) it
    journals the trainer's submit and sample calls and returns a `V1Journal` (see `attach_v1`). For
    the legacy ``RayPPOTrainer`` (after ``trainer.init_workers()``) it wraps
    ``trainer.async_rollout_manager.generate_sequences`` (verl's `AgentLoopManager`), or
    ``trainer.actor_rollout_wg.generate_sequences`` when there is no manager.

    Args:
        trainer: the trainer (e.g. verl's ``RayPPOTrainer``).
        config: the verl config to read (default ``trainer.config``).
        target: the attribute holding the rollout object, to choose it yourself.
        overrides: native ``stepjournal`` keys (``policy=``, ``path=``, ``fingerprint=`` ...).

    Returns:
        The installed `JournaledRollout` (its ``matching_batch`` gives the batch that matches a replay), or
        the `V1Journal` of a V1 trainer.

    Raises:
        ConfigError: the config enables no form (and no ``policy=`` was given), or enables two.
    """
    from .v1._hooks import attach_v1, is_v1_trainer

    if is_v1_trainer(trainer):
        return attach_v1(trainer, config=config, **overrides)
    config = config if config is not None else getattr(trainer, "config", None)
    if target is None:
        manager = getattr(trainer, "async_rollout_manager", None)
        target = "async_rollout_manager" if manager is not None else "actor_rollout_wg"
    obj = getattr(trainer, target, None)
    if obj is None:
        raise VerlAdapterError(
            f"{type(trainer).__name__} has no {target}: stepjournal journals verl's V1 PPOTrainer (any "
            "trainer.v1.trainer_mode) and the legacy RayPPOTrainer; call attach(trainer) after "
            "trainer.init_workers() (legacy) or trainer.init() (V1), or pass target= for your own trainer"
        )
    cfg = (config if isinstance(config, VerlJournalConfig)
           else read_verl_config(config if config is not None else {}, **overrides))
    if cfg is None:
        raise ConfigError(
            "the verl config enables neither a stepjournal section nor a rollout-skip form: add "
            "stepjournal.policy (e.g. +stepjournal.policy=cache) or pass attach(trainer, policy='cache')"
        )
    # A per-stage spec naming reward, old_log_prob, ref_log_prob or values journals those methods too.
    from ._legacy_stages import LegacyStages
    from .v1._stages import check_verl_stages

    check_verl_stages(cfg.policy)  # before the journal opens: a refused spec leaves no session behind
    rollout = rollout_from_config(cfg, obj.generate_sequences, trainer=trainer)
    # A read config enables a form, and its rollout journals: an engine and its journal.
    assert rollout is not None and rollout.engine is not None and rollout.journal is not None
    record_tokenizer(rollout.journal, getattr(trainer, "tokenizer", None))  # `show --text` decodes with it
    rollout.install(obj, "generate_sequences")
    rollout.stages = LegacyStages(trainer, rollout.engine).install()
    log.info("verl_attached", target=target, policy=cfg.policy, journal=rollout.journal.path)
    return rollout


def wrap_generate_sequences(
    obj: Any,
    *,
    config: Any = None,
    engine: Optional[Engine] = None,
    step_of: Callable[[Any], int] = meta_step,
    attr: str = "generate_sequences",
    rollout_n: int = 1,
    **overrides: Any,
) -> JournaledRollout:
    """Journal ``obj.generate_sequences`` of any rollout object (a worker group, your own manager).

    Give either a verl `config` (read with `read_verl_config`, plus `overrides`) or a ready `engine`.
    Steps come from `step_of` (default: ``meta_info["global_steps"]``).
    """
    generate = getattr(obj, attr)
    if engine is not None:
        return JournaledRollout(undecorated(generate), engine, step_of=step_of, rollout_n=rollout_n).install(obj, attr)
    rollout = rollout_from_config(config if config is not None else {}, generate, step_of=step_of, **overrides)
    if rollout is None:
        raise ConfigError("the config enables no stepjournal or rollout-skip form; pass policy=... or engine=...")
    return rollout.install(obj, attr)


# -- the config-only routes -----------------------------------------------------------------------------------

_MANAGER_CLASS: Any = None
_MANAGER_LOCK = threading.Lock()


def make_journaled_agent_loop_manager() -> Type[AgentLoopManager]:
    """Build (once) `JournaledAgentLoopManager`, a subclass of verl's ``AgentLoopManager``.

    Select it with ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=
    stepjournal.adapters.verl.JournaledAgentLoopManager``: verl's trainer then builds it instead of its
    own manager, and every ``generate_sequences`` call is journaled per the config's stepjournal
    section (or verl skip form), with the step from ``meta_info["global_steps"]``.
    """
    global _MANAGER_CLASS
    with _MANAGER_LOCK:
        if _MANAGER_CLASS is not None:
            return _MANAGER_CLASS
        from verl.experimental.agent_loop import AgentLoopManager
        from verl.utils.ray_utils import auto_await

        class JournaledAgentLoopManager(AgentLoopManager):
            """verl's AgentLoopManager with journaled ``generate_sequences``.

            See `make_journaled_agent_loop_manager`.
            """

            @classmethod
            def create(cls, *args: Any, **kwargs: Any) -> Any:
                config = kwargs.get("config", args[0] if args else None)
                if select(config, "trainer.use_v1", False) is True:
                    # verl's default V1 trainer moves batches through TransferQueue: its own manager class.
                    from .v1._hooks import make_journaled_agent_loop_manager_tq

                    return make_journaled_agent_loop_manager_tq().create(*args, **kwargs)
                return super().create(*args, **kwargs)

            def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
                super().__init__(config, *args, **kwargs)
                journaled = rollout_from_config(config, self._stepjournal_generate)
                if journaled is None:
                    log.warning(
                        "journaled_manager_disabled",
                        reason="the config enables no stepjournal section or rollout-skip form",
                    )
                    journaled = JournaledRollout(super().generate_sequences, None, step_of=meta_step)
                self.stepjournal = journaled

            async def _stepjournal_generate(self, prompts: DataProto) -> DataProto:
                return await undecorated(AgentLoopManager.generate_sequences)(self, prompts)

            # verl's own calling convention for this method: awaiting callers get a coroutine,
            # synchronous ones the DataProto. A plain function returning `acall`'s coroutine, so the
            # call's outcome reaches the caller's context (`last_outcome`) however auto_await runs it.
            @auto_await
            def generate_sequences(self, prompts: DataProto) -> Any:
                return self.stepjournal.acall(prompts)

        JournaledAgentLoopManager.__module__ = "stepjournal.adapters.verl"
        JournaledAgentLoopManager.__qualname__ = "JournaledAgentLoopManager"
        _MANAGER_CLASS = JournaledAgentLoopManager
        return _MANAGER_CLASS


def _other_run_key(rollout: JournaledRollout, exc: ReplayMissError) -> ReplayMissError:
    """`exc`, told that the journal holds generations of other run keys only (a replay under another name).

    A recording cloned onto another machine replays only under the run key it was recorded under;
    a replay configured with another experiment or project name finds nothing at any step.
    """
    journal = rollout.journal
    if journal is None or journal.recorded_steps(run=journal.run):
        return exc
    others = [s.run for s in journal.run_summaries(stage="generate")
              if s.run != journal.run and s.stages.get("generate")]
    if not others:
        return exc
    return ReplayMissError(
        f"{exc}. Run {journal.run!r} has no recorded generations in {journal.path}, which holds run(s) "
        f"{', '.join(repr(r) for r in others)}: the rollouter's run key is "
        "'{trainer.experiment_name}_{trainer.project_name}'; set those (or stepjournal.run) to the recorded run",
        step=exc.step,
        gen_index=exc.gen_index,
    )


def install_fully_async(manager_cls: Optional[Type[Any]] = None) -> Type[Any]:
    """Journal the fully-async rollouter's ``generate_sequences_single`` in this process.

    Each manager reads its own ``config`` on first use; the step is the feed index from the
    ``sample_{epoch}_{index}`` uid (``skip.async_rollout`` form, or ``stepjournal.step_source:
    feed_index``). Concurrent calls from asyncio tasks or threads are safe. Use it as Ray's
    ``runtime_env.worker_process_setup_hook`` so that the rollouter's actor process runs it.

    Args:
        manager_cls: the class to patch (default verl's ``FullyAsyncAgentLoopManager``).

    Returns:
        The patched class.
    """
    if manager_cls is None:
        from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncAgentLoopManager

        manager_cls = FullyAsyncAgentLoopManager
    # verl's class or the caller's, patched by name: its attributes are what this function sets.
    patched: Type[Any] = manager_cls
    if getattr(patched, "_stepjournal_installed", False):
        return patched
    raw = undecorated(patched.generate_sequences_single)
    lock = threading.Lock()

    def rollout_of(manager: Any) -> JournaledRollout:
        found = manager.__dict__.get("_stepjournal")
        if found is not None:
            return found
        with lock:
            found = manager.__dict__.get("_stepjournal")
            if found is None:
                bound = raw.__get__(manager)
                config = getattr(manager, "config", None)
                cfg = read_verl_config(config) if config is not None else None
                found = None
                if cfg is not None:
                    found = rollout_from_config(cfg, bound, step_of=_step_function(cfg, fully_async=True))
                if found is None:
                    found = JournaledRollout(bound, None, step_of=feed_index_step)
                manager.__dict__["_stepjournal"] = found
            return found

    async def generate_sequences_single(self: Any, prompts: DataProto) -> DataProto:
        rollout = rollout_of(self)
        try:
            return await rollout.acall(prompts)
        except ReplayMissError as exc:
            raise _other_run_key(rollout, exc) from exc

    generate_sequences_single.__qualname__ = f"{patched.__qualname__}.generate_sequences_single"
    generate_sequences_single.__wrapped__ = raw  # type: ignore[attr-defined]
    patched.generate_sequences_single = generate_sequences_single
    patched._stepjournal_installed = True
    patched.stepjournal = property(rollout_of)
    log.info("fully_async_installed", manager=patched.__qualname__)
    return patched

