"""Journal verl's V1 (TransferQueue) trainer at the two points verl's own ``RolloutTqSkip`` uses.

V1 splits a rollout in two: ``PPOTrainer._add_batch_to_generate`` (phase "submit") registers the
step's prompts in TransferQueue and hands them to the agent loop, and ``ReplayBuffer.sample``
(phase "sample") later takes finished trajectories out as a ``KVBatchMeta``. `V1Journal` wraps both
on one trainer (and the warm-up / refill path ``_add_prompts_to_generate``):

- submit: when the policy will serve the step's first sample call from the journal, the prompts are
  still drawn from the dataloader (so it stays where a recorded run had it) but held back: nothing
  is generated;
- sample: each call of a step is one journaled call (generation index 0, 1, … when
  ``parameter_sync_step > 1``). A replayed call puts the recorded trajectories into TransferQueue
  under the held prompts' uids (prompt groups mapped in order, cycling when fewer were recorded;
  session and output indices kept) and returns their ``KVBatchMeta``; otherwise the real sample runs
  and its keys, tags and fields are recorded as a `TQBatch`;
- validation (``partition_id="val"``) runs and is journaled as bypassed.

The step is the trainer's ``global_steps``. Decisions are the policies'; this module only finds
steps, moves batches in and out of TransferQueue and hands the calls to the `Engine`.
"""

from __future__ import annotations

import collections
import uuid
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Tuple, Type

from stepjournal.log import get_logger
from stepjournal.policies import CallContext, ConfigError, Engine, JournalView, Outcome, ServeRecorded, open_engine
from stepjournal.vocabulary import Action

from ..._tokenizer import record_tokenizer
from .._config import VerlJournalConfig, read_verl_config
from .._errors import VerlAdapterError
from .._calls import undecorated as _undecorated
from ._codec import TQBatch
from ._stages import STAGES, V1Stages, check_verl_stages

if TYPE_CHECKING:
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ

__all__ = [
    "V1Journal",
    "attach_v1",
    "is_v1_trainer",
    "v1_trainer_mode",
    "remap_tq_batch",
    "V1_TRAINER_MODES",
    "make_journaled_agent_loop_manager_tq",
]

log = get_logger(__name__)

V1_TRAINER_MODES = ("sync", "colocate_async", "separate_async")
_STEP_TAGS = ("global_steps", "min_global_steps", "max_global_steps")


def is_v1_trainer(trainer: Any) -> bool:
    """True for verl's V1 ``PPOTrainer`` (``verl.trainer.ppo.v1``) and its subclasses."""
    try:
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    except ImportError:  # pragma: no cover - verl without V1 (no transferqueue)
        return False
    return isinstance(trainer, PPOTrainer)


def v1_trainer_mode(cfg: Any) -> str:
    """``trainer.v1.trainer_mode`` of a V1 config, checked against the modes stepjournal journals.

    Raises:
        ConfigError: the mode is not ``sync``, ``colocate_async`` or ``separate_async``.
    """
    from .._nodes import select

    mode = select(cfg, "trainer.v1.trainer_mode", "sync")
    if mode not in V1_TRAINER_MODES:
        raise ConfigError(
            f"trainer.v1.trainer_mode={mode!r} is not a V1 mode stepjournal journals: use one of "
            f"{', '.join(V1_TRAINER_MODES)} (a custom trainer must keep PPOTrainer's _add_batch_to_generate "
            "and ReplayBuffer.sample, then pass its mode through one of these)"
        )
    return mode


def _key_parts(key: str, step: int) -> Tuple[str, str]:
    """``{uid}_{session}_{index}`` -> (uid, ``{session}_{index}``)."""
    parts = str(key).rsplit("_", 2)
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
        raise VerlAdapterError(
            f"recorded trajectory key {key!r} (step {step}) is not {{uid}}_{{session}}_{{index}}: it cannot be mapped "
            "onto this step's prompts; record again with this verl version"
        )
    return parts[0], f"{parts[1]}_{parts[2]}"


def remap_tq_batch(recorded: TQBatch, uids: List[str], *, step: int, source_step: int) -> TQBatch:
    """The recorded trajectories put under new prompt uids: what a replayed sample hands the trainer.

    Prompt groups (trajectories sharing a uid) are numbered by first appearance; new uid ``j`` gets
    group ``j mod len(groups)`` (cycling when fewer were recorded, the first ``len(uids)`` when more).
    Rows keep the recorded order: verl's agent loop writes trajectories as they finish, so a sampled
    batch interleaves its groups, and the actor must get them in that order again. Each pass over the
    groups (one when the counts match, more when cycling) emits the recorded rows in order. Each key
    keeps its session and output index; the ``uid`` field is rewritten; step tags
    (``global_steps``, ``min_global_steps``, ``max_global_steps``) move by ``step - source_step``
    so staleness stays as recorded.

    Raises:
        VerlAdapterError: there are no uids, the record holds no trajectory, or a key is malformed.
    """
    from verl.utils.tensordict_utils import index_select_tensor_dict
    from tensordict import NonTensorStack

    groups: Dict[str, int] = {}
    group_of: List[int] = []
    for key in recorded.keys:
        uid, _ = _key_parts(key, source_step)
        group_of.append(groups.setdefault(uid, len(groups)))
    if not groups or not uids:
        raise VerlAdapterError(
            f"cannot map the batch recorded at step {source_step} ({len(groups)} prompt groups) onto "
            f"{len(uids)} prompt uids at step {step}: both must be at least one"
        )
    delta = step - source_step
    rows: List[int] = []
    keys: List[str] = []
    tags: List[Dict[str, Any]] = []
    row_uids: List[str] = []
    passes = -(-len(uids) // len(groups))  # ceil: the groups cycle when fewer were recorded
    for j, row in ((p * len(groups) + g, row) for p in range(passes) for row, g in enumerate(group_of)):
        if j >= len(uids):
            continue
        rows.append(row)
        keys.append(f"{uids[j]}_{_key_parts(recorded.keys[row], source_step)[1]}")
        tag = dict(recorded.tags[row])
        for name in _STEP_TAGS:
            if isinstance(tag.get(name), int) and not isinstance(tag.get(name), bool):
                tag[name] = tag[name] + delta
        tags.append(tag)
        row_uids.append(uids[j])
    every_row = rows == list(range(len(recorded)))
    fields = recorded.fields.clone() if every_row else index_select_tensor_dict(recorded.fields, rows)
    if "uid" in fields.keys():
        fields.set("uid", NonTensorStack.from_list(row_uids))
    return TQBatch(fields=fields, keys=keys, tags=tags, partition_id=recorded.partition_id)


class V1Journal:
    """stepjournal on one verl V1 trainer: its submit and sample calls journaled (see the module doc).

    Args:
        trainer: the V1 ``PPOTrainer`` (any mode).
        engine: the journal and policy.
        config: the `VerlJournalConfig` it was built from, when it was.

    Attributes:
        outcomes: the `Outcome` of every journaled sample call, in order.
        stage_outcomes: the `Outcome` of every journaled downstream stage call (``reward``,
            ``old_log_prob``, ``ref_log_prob``, ``values``, ``metrics``), in order (`V1Stages`).
        held: how many prompt batches were drawn but not generated because their step was replayed.
    """

    def __init__(self, trainer: Any, engine: Engine, *, config: Optional[VerlJournalConfig] = None) -> None:
        self.trainer = trainer
        self.engine = engine
        self.journal = engine.journal
        self.config = config
        self.outcomes: List[Outcome] = []
        # Metrics are recorded in every session: by the spec's own entry when it names the stage, else by `dump`.
        named = getattr(engine.policy, "stages", ())
        metrics_engine = engine if "metrics" in named else Engine(engine.journal, "dump", options=engine.options,
                                                                  roles=STAGES)
        self.stages = V1Stages(trainer, engine, metrics_engine)
        self.held = 0
        self.closed = False
        self._held: Dict[int, Deque[Any]] = {}
        self._samples: Dict[int, int] = collections.Counter()
        self._installed: List[Tuple[Any, str, bool, Any]] = []
        buffer = trainer.replay_buffer
        self._submit_batch = _undecorated(type(trainer)._add_batch_to_generate).__get__(trainer)
        self._add_prompts = trainer._add_prompts_to_generate
        self._sample_original = _undecorated(type(buffer).sample).__get__(buffer)

    def __repr__(self) -> str:
        return (f"<V1Journal policy={self.engine.policy.name!r} journal={self.journal.path!r} "
                f"calls={len(self.outcomes)}>")

    @property
    def last_outcome(self) -> Optional[Outcome]:
        """The `Outcome` of the last journaled sample call (None before any)."""
        return self.outcomes[-1] if self.outcomes else None

    @property
    def stage_outcomes(self) -> List[Outcome]:
        return self.stages.outcomes

    # -- deciding ahead: will this step's next sample be served from the journal? ---------------------
    def _will_replay(self, step: int) -> bool:
        ctx = CallContext(run=self.journal.run, step=step, gen_index=self._samples[step], mode="train")
        # Policies are pure, so asking ahead changes nothing; the engine asks again at sample time.
        return isinstance(self.engine.policy.decide(ctx, JournalView(self.journal, mode="train")), ServeRecorded)

    def _hold(self, step: int, batch: Any) -> int:
        self._held.setdefault(step, collections.deque()).append(batch)
        self.held += 1
        log.info("v1_prompts_held", step=step, prompts=len(batch))
        return len(batch)

    # -- the hooks -----------------------------------------------------------------------------------------
    def add_batch_to_generate(self) -> None:
        """Phase "submit": the step's prompts, held back when the step is replayed."""
        step = self.trainer.global_steps
        if self._will_replay(step):
            self._hold(step, self.trainer._next_train_batch())
            return None
        return self._submit_batch()

    def add_prompts_to_generate(self, num_prompts: int) -> int:
        """Warm-up and refill prompts (async modes), held back while the step is replayed."""
        step = self.trainer.global_steps
        if self._will_replay(step):
            return self._hold(step, self.trainer._next_train_batch(num_prompts))
        return self._add_prompts(num_prompts)

    def _take_uids(self, step: int, count: int) -> List[str]:
        uids: List[str] = []
        queue = self._held.get(step)
        while queue and len(uids) < count:
            batch = queue[0]
            taken = list(batch["uid"])
            need = count - len(uids)
            uids.extend(taken[:need])
            if len(taken) <= need:
                queue.popleft()
            else:
                queue[0] = batch[need:]
        if len(uids) < count:
            # Prompts held for an earlier step, or none held (a custom trainer): fresh uids, as verl makes.
            log.warning("v1_fresh_uids", step=step, missing=count - len(uids))
            uids.extend(str(uuid.uuid4()) for _ in range(count - len(uids)))
        return uids

    def _release(self, step: int) -> None:
        """Submit held prompts after all: the policy decided at sample time to generate the step."""
        queue = self._held.pop(step, None)
        while queue:
            self.trainer._submit_batch_to_rollout(queue.popleft())

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> Tuple[Any, dict]:
        """Phase "sample": one journaled call (replayed into TransferQueue, or sampled and recorded)."""
        import transfer_queue as tq
        from transfer_queue import KVBatchMeta

        step = self.trainer.global_steps
        for old in [s for s in self._held if s < step]:
            self._held.pop(old)  # prompts of a replayed step that sampled fewer calls than held
        if partition_id == "val":
            outcome = self.engine.call(step, lambda: self._sample_original(global_steps, partition_id, batch_size),
                                       mode="validate")
            self.outcomes.append(outcome)
            return outcome.value
        sampled: Dict[str, Any] = {}

        def sample_now() -> TQBatch:
            self._release(step)
            sampled["result"] = result = self._sample_original(global_steps, partition_id, batch_size)
            meta = result[0] if isinstance(result, tuple) else result
            fields = tq.kv_batch_get(keys=list(meta.keys), partition_id=meta.partition_id)
            return TQBatch(fields=fields, keys=list(meta.keys), tags=list(meta.tags), partition_id=meta.partition_id)

        outcome = self.engine.call(step, sample_now, mode="train")
        self._samples[step] += 1
        self.outcomes.append(outcome)
        if outcome.action != Action.REPLAYED:
            return sampled["result"]
        recorded, source = outcome.value, outcome.source
        assert source is not None  # a replay names the record it served
        if not isinstance(recorded, TQBatch):
            raise VerlAdapterError(
                f"step {step} was served from step {source.step}, which holds a "
                f"{type(recorded).__name__}, not a V1 batch: a journal recorded by the legacy trainer cannot "
                "feed the V1 trainer; record with trainer.use_v1=true (or use another dump_dir)"
            )
        served = remap_tq_batch(recorded, self._take_uids(step, batch_size), step=step, source_step=source.step)
        target = partition_id if recorded.partition_id is None else recorded.partition_id
        tq.kv_batch_put(keys=list(served.keys), fields=served.fields, tags=list(served.tags), partition_id=target)
        log.info("v1_sample_replayed", step=step, gen_index=outcome.ctx.gen_index, source_step=source.step,
                 trajectories=len(served))
        return KVBatchMeta(partition_id=target, keys=list(served.keys), tags=[dict(t) for t in served.tags]), {}

    # -- installing ------------------------------------------------------------------------------------------
    def install(self) -> "V1Journal":
        """Put the hooks on the trainer and its replay buffer (instance attributes); `uninstall` undoes them."""
        trainer, buffer = self.trainer, self.trainer.replay_buffer
        current = getattr(trainer, "stepjournal", None)
        if isinstance(current, V1Journal) and not current.closed:
            raise VerlAdapterError(
                f"{type(trainer).__name__} is already journaled by {trainer.stepjournal!r}; attach once"
            )
        for obj, attr, value in (
            (trainer, "_add_batch_to_generate", self.add_batch_to_generate),
            (trainer, "_add_prompts_to_generate", self.add_prompts_to_generate),
            (buffer, "sample", self.sample),
            *self.stages.hooks(),
            (trainer, "stepjournal", self),
        ):
            self._installed.append((obj, attr, attr in obj.__dict__, obj.__dict__.get(attr)))
            setattr(obj, attr, value)
        if getattr(buffer, "refill_fn", None) is not None:
            self._installed.append((buffer, "refill_fn", True, buffer.refill_fn))
            buffer.refill_fn = self.add_prompts_to_generate
        return self

    def uninstall(self) -> None:
        """Restore what `install` replaced."""
        while self._installed:
            obj, attr, had, previous = self._installed.pop()
            if had:
                setattr(obj, attr, previous)
            else:
                obj.__dict__.pop(attr, None)

    def close(self) -> None:
        """Uninstall and close the journal (`outcomes` stay readable)."""
        self.uninstall()
        self.journal.close()
        self.closed = True


def attach_v1(trainer: Any, *, config: Any = None, **overrides: Any) -> V1Journal:
    """Journal a V1 trainer (`attach` does this for a V1 ``PPOTrainer``); call it before ``fit``.

    Raises:
        ConfigError: no form is enabled, two are, the mode is not a V1 mode stepjournal journals, or
            the config asks to journal validation under the policy (V1 validation is always bypassed).
    """
    config = config if config is not None else getattr(trainer, "config", None)
    config = config if config is not None else {}
    v1_trainer_mode(config)
    cfg = config if isinstance(config, VerlJournalConfig) else read_verl_config(config, **overrides)
    if cfg is None:
        raise ConfigError(
            "the verl config enables neither a stepjournal section nor a rollout-skip form: add "
            "stepjournal.policy (e.g. +stepjournal.policy=cache) or pass attach(trainer, policy='cache')"
        )
    if "validate" not in cfg.engine.bypass_modes:
        raise ConfigError(
            f"stepjournal.bypass_modes={list(cfg.engine.bypass_modes)!r}: verl's V1 trainer validates through "
            "its own TransferQueue partition, which stepjournal does not replay; keep 'validate' in bypass_modes"
        )
    if cfg.step_source == "feed_index":
        raise ConfigError(
            f"{cfg.form} takes steps from the fully-async feed index; the V1 trainer's step is global_steps: "
            "use skip.rollout_tq or a stepjournal section without step_source"
        )
    check_verl_stages(cfg.policy)
    engine = open_engine(cfg.engine)
    record_tokenizer(engine.journal, getattr(trainer, "tokenizer", None))  # `show --text` decodes with it
    journaled = V1Journal(trainer, engine, config=cfg).install()
    log.info("verl_v1_attached", mode=trainer.trainer_mode, policy=cfg.policy, journal=engine.journal.path)
    return journaled


def journal_v1_fit(fit: Callable[..., Any]) -> Callable[..., Any]:
    """``PPOTrainer.fit`` that attaches the journal first when its agent loop manager asks for it.

    After fit, ``trainer.stepjournal`` is the (closed) `V1Journal`, its ``outcomes`` readable.
    """

    def fit_with_journal(self: Any, agent_loop_manager: Any, *args: Any, **kwargs: Any) -> Any:
        current = getattr(self, "stepjournal", None)
        if getattr(agent_loop_manager, "_stepjournal_v1", False) and not (
            isinstance(current, V1Journal) and not current.closed
        ):
            if read_verl_config(self.config) is None:
                log.warning("journaled_manager_disabled",
                            reason="the config enables no stepjournal section or rollout-skip form")
                return fit(self, agent_loop_manager, *args, **kwargs)
            journaled = attach_v1(self)
            try:
                return fit(self, agent_loop_manager, *args, **kwargs)
            finally:
                journaled.close()
                self.stepjournal = journaled  # closed; its outcomes stay readable after fit
        return fit(self, agent_loop_manager, *args, **kwargs)

    fit_with_journal.__wrapped__ = fit  # type: ignore[attr-defined]
    fit_with_journal._stepjournal = True  # type: ignore[attr-defined]
    return fit_with_journal


_TQ_MANAGER: Any = None


def make_journaled_agent_loop_manager_tq() -> Type[AgentLoopManagerTQ]:
    """Build (once) the V1 form of `JournaledAgentLoopManager`: verl's ``AgentLoopManagerTQ``, marked.

    `JournaledAgentLoopManager.create` returns one of these when the config runs the V1 trainer
    (``trainer.use_v1``). Building it wraps ``PPOTrainer.fit`` (once per process) so that a fit given
    this manager attaches a `V1Journal` first and closes it when fit ends.
    """
    global _TQ_MANAGER
    if _TQ_MANAGER is not None:
        return _TQ_MANAGER
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    if not getattr(PPOTrainer.fit, "_stepjournal", False):
        # Patching verl's class is the point: every fit in this process journals (wrapped once).
        PPOTrainer.fit = journal_v1_fit(PPOTrainer.fit)  # type: ignore[method-assign]

    class JournaledAgentLoopManagerTQ(AgentLoopManagerTQ):
        """verl's ``AgentLoopManagerTQ``; the trainer's fit journals its submit and sample calls."""

        _stepjournal_v1 = True

    JournaledAgentLoopManagerTQ.__module__ = "stepjournal.adapters.verl"
    _TQ_MANAGER = JournaledAgentLoopManagerTQ
    return _TQ_MANAGER
