"""The verl hook point: `JournaledRollout` wraps a ``generate_sequences`` the way verl's rollout skip did.

This module hands each call (its step and mode read by ``_calls``) to the `Engine`, and gives the
trainer the input batch that belongs to a replayed output; the ways of installing it on a trainer, a manager
class or the fully-async rollouter live in `_attach`. Decisions are the policies'.

A call has two entry points, chosen by the caller, never guessed: ``rollout(prompts)`` from
synchronous code (always the DataProto) and ``await rollout.acall(prompts)`` from a coroutine. Where
the method replaced is an async verl method under verl's ``auto_await`` (``AgentLoopManager``),
`JournaledRollout.install` puts ``acall`` under that same ``auto_await``, so each caller gets what
verl's own method gives it.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import itertools
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

import numpy as np
import torch
from verl.protocol import DataProto

from stepjournal.log import get_logger
from stepjournal import Journal
from stepjournal.policies import CallHooks, Engine, Outcome
from stepjournal.vocabulary import Action

from ._calls import is_async, prompts_of, run_blocking, validate_mode
from ._config import VerlJournalConfig
from ._errors import MissingInputError, NoOutcomeError, VerlAdapterError, VerlStepError

if TYPE_CHECKING:
    from ._legacy_stages import LegacyStages

__all__ = ["JournaledRollout", "align_batch", "journaled_by"]

log = get_logger(__name__)

_IDS = itertools.count()


# -- the wrapper ------------------------------------------------------------------------------------------


class _Slot:
    """Where one call's `Outcome` lands: made in the caller's context before the call runs.

    verl's ``auto_await`` runs a coroutine with ``asyncio.run`` (or on a helper thread), each in a copy
    of the caller's context, so a context variable set inside the call never reaches the caller. The
    slot is created and put in the caller's context first; the call fills it wherever it runs.
    """

    __slots__ = ("outcome", "done")

    def __init__(self) -> None:
        self.outcome: Optional[Outcome] = None
        self.done = False

    def fill(self, outcome: Optional[Outcome]) -> None:
        self.outcome, self.done = outcome, True


# Which call `last_outcome` answers for, when it cannot answer (`NoOutcomeError`'s message).
_NO_CALL = "no generate call went through this JournaledRollout in this thread or asyncio task"
_UNFINISHED = "the latest generate call in this thread or asyncio task has not finished (or it raised)"


class JournaledRollout:
    """A verl ``generate_sequences`` put under a journal and a policy.

    Call it like the function it wraps (``rollout(prompts)``). Each call gets its step from `step_of`,
    its mode from `mode_of` (validation calls are bypassed by default), a generation index counting the
    calls of its step (DAPO), and is recorded, replayed or bypassed as the engine's policy decides. The
    input batch is stored with the output, so `matching_batch` can give the trainer the prompts and
    ground truth that belong to a replayed output.

    Call it from synchronous code, ``await rollout.acall(prompts)`` from a coroutine. Installed in
    place of an async verl method (``AgentLoopManager.generate_sequences``), it serves both kinds of
    callers as that method does (see `install`).

    Args:
        generate: the function that generates (e.g. ``manager.generate_sequences``).
        engine: the `Engine` (journal + policy); None calls `generate` without journaling.
        step_of: the train step of a call, from its prompts.
        mode_of: the call's mode, from its prompts (default `validate_mode`).
        store_input: store the input batch with each recorded output (needed by `matching_batch`).
        digest_ignore: non-tensor keys left out of the input digest (verl gives fresh random uids each run).
        rollout_n: responses per prompt, used to line the recorded input up with the trainer's batch.
        config: the `VerlJournalConfig` it was built from, when it was.

    Attributes:
        engine, journal: the engine and its journal (None when not journaling).
        calls: how many calls it handled.
        stages: the legacy trainer's stage hooks, set by `attach` (a rollout wrapped otherwise has none).
    """

    stages: LegacyStages

    def __init__(
        self,
        generate: Callable[..., Any],
        engine: Optional[Engine],
        *,
        step_of: Callable[[Any], int],
        mode_of: Callable[[Any], str] = validate_mode,
        store_input: bool = True,
        digest_ignore: Tuple[str, ...] = ("uid", "priority"),
        rollout_n: int = 1,
        config: Optional[VerlJournalConfig] = None,
    ) -> None:
        self.generate = generate
        self.engine = engine
        self.journal: Optional[Journal] = engine.journal if engine is not None else None
        self.step_of = step_of
        self.mode_of = mode_of
        self.store_input = store_input
        self.digest_ignore = tuple(digest_ignore)
        self.rollout_n = rollout_n
        self.config = config
        self.calls = 0
        self._async = is_async(generate)
        self._last: contextvars.ContextVar[Optional[_Slot]] = contextvars.ContextVar(
            f"stepjournal_verl_last_{next(_IDS)}", default=None
        )
        self._count_lock = threading.Lock()
        self._installed: Optional[Tuple[Any, str, Any]] = None

    def __repr__(self) -> str:
        policy = getattr(getattr(self.engine, "policy", None), "name", None)
        path = self.journal.path if self.journal is not None else None
        return f"<JournaledRollout policy={policy!r} journal={path!r} calls={self.calls}>"

    # -- calling: one entry point for synchronous callers, one for coroutines ------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The call, from synchronous code: the DataProto (an async `generate` is run to its end)."""
        slot = self._new_slot()
        if self._async:
            outcome, value = run_blocking(self._call_async(args, kwargs))
        elif self.engine is None:  # not journaling: no outcome
            self._count_call()
            outcome, value = None, self.generate(*args, **kwargs)
        else:
            step, mode, hooks = self._call_of(args, kwargs)
            outcome = self.engine.call(step, lambda: self.generate(*args, **kwargs), mode=mode, hooks=hooks)
            value = outcome.value
        slot.fill(outcome)
        return value

    def acall(self, *args: Any, **kwargs: Any) -> Any:
        """The call, to await (for asyncio callers such as the fully-async rollouter): a coroutine.

        A plain function that returns the coroutine, so that the call's outcome slot is made in the
        caller's context however the coroutine is then run (awaited, ``asyncio.run``, another thread).
        """
        return self._filled(self._new_slot(), args, kwargs)

    async def _filled(self, slot: _Slot, args: tuple, kwargs: dict) -> Any:
        outcome, value = await self._call_async(args, kwargs)
        slot.fill(outcome)
        return value

    def _new_slot(self) -> _Slot:
        slot = _Slot()
        self._last.set(slot)
        return slot

    async def _call_async(self, args: tuple, kwargs: dict) -> Tuple[Optional[Outcome], Any]:
        if self.engine is None:  # not journaling: no outcome
            self._count_call()
            output = self.generate(*args, **kwargs)
            return None, (await output if inspect.isawaitable(output) else output)
        step, mode, hooks = self._call_of(args, kwargs)
        outcome = await self.engine.acall(step, lambda: self.generate(*args, **kwargs), mode=mode, hooks=hooks)
        return outcome, outcome.value

    def _count_call(self) -> None:
        with self._count_lock:
            self.calls += 1

    def _call_of(self, args: tuple, kwargs: dict) -> Tuple[int, str, CallHooks]:
        """A call's step and mode, and how its input batch is stored."""
        self._count_call()
        prompts = prompts_of(args, kwargs)
        # The input is prepared before the generator runs (verl's manager adds keys, e.g. priority, to
        # it); `acall` runs journal I/O in a thread so other rollout tasks keep going meanwhile.
        hooks = CallHooks(prepare_input=lambda: self._prepare(prompts), run_blocking=asyncio.to_thread)
        return self._step(prompts), self.mode_of(prompts), hooks

    def _journaling(self) -> Journal:
        """The journal the calls go to; a rollout without an engine has none to read or write."""
        if self.journal is None:
            raise VerlAdapterError(
                "this JournaledRollout journals nothing (it was built without an engine), so it has no recorded "
                "batch: build it with an engine (or a config that enables stepjournal)"
            )
        return self.journal

    def _prepare(self, prompts: Any) -> Tuple[Any, Optional[str]]:
        prepared = self._journaling().prepare(prompts) if self.store_input else None
        return prepared, self._digest(prompts, prepared)

    def _step(self, prompts: Any) -> int:
        step = self.step_of(prompts)
        if isinstance(step, (np.integer, torch.Tensor)):
            step = int(step)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise VerlStepError(f"the train step of this generate call is {step!r}; it must be an int >= 0")
        return step

    def _digest(self, prompts: Any, prepared: Any) -> Optional[str]:
        non_tensor = getattr(prompts, "non_tensor_batch", None)
        if not isinstance(prompts, DataProto) or non_tensor is None:
            return prepared.digest if prepared is not None else self._journaling().prepare(prompts).digest
        ignored = [key for key in self.digest_ignore if key in non_tensor]
        if not ignored and prepared is not None:
            return prepared.digest
        view = DataProto(
            batch=prompts.batch,
            non_tensor_batch={k: v for k, v in non_tensor.items() if k not in ignored},
            meta_info=prompts.meta_info,
        )
        return self._journaling().prepare(view).digest

    # -- what the trainer asks afterwards ----------------------------------------------------------------
    @property
    def last_outcome(self) -> Optional[Outcome]:
        """The `Outcome` of the latest call made from this thread or asyncio task.

        It reaches the caller however verl dispatched the call: directly, awaited, or through
        ``auto_await`` (``asyncio.run``, or a helper thread when a loop is running). None before any
        call, or when the latest call was not journaled (no engine).
        """
        slot = self._last.get()
        return slot.outcome if slot is not None else None

    def _latest(self) -> Optional[Outcome]:
        """The latest call's outcome for `matching_input`; raises `NoOutcomeError` when it is not known."""
        slot = self._last.get()
        if slot is None:
            raise NoOutcomeError(
                f"{_NO_CALL}, so which batch matches its responses is not known: call matching_batch in the "
                "thread (or task) that called generate_sequences, after it returned, or pass outcome="
            )
        if not slot.done:
            raise NoOutcomeError(f"{_UNFINISHED}: its responses are not known yet, so neither is their batch")
        return slot.outcome

    def matching_input(self, outcome: Optional[Outcome] = None) -> Optional[DataProto]:
        """The recorded input batch of a replayed call: the prompts its output was generated from.

        Args:
            outcome: the call's outcome (default: `last_outcome`).

        Returns:
            The stored input, or None when the call was not replayed (its own input is the match).

        Raises:
            MissingInputError: the record that was served stored no input (e.g. imported SkipManager dumps).
            NoOutcomeError: no `outcome` was given and the latest call's is not known (no call in this
                thread or task, or it has not finished): never a silent "the call ran".
        """
        outcome = outcome if outcome is not None else self._latest()
        if outcome is None or outcome.action != Action.REPLAYED or outcome.source is None:
            return None
        if outcome.source.event.input is None:
            raise MissingInputError(
                f"step {outcome.ctx.step} call {outcome.ctx.gen_index} was served from step {outcome.source.step} "
                f"call {outcome.source.gen_index}, which stored no input batch (imported SkipManager dumps have "
                "none); rewards cannot be matched to its prompts. Record with store_input=True, or pass "
                "missing='keep' to matching_batch to use the current batch anyway"
            )
        return self._journaling().load_input(outcome.source)

    def matching_batch(self, batch: DataProto, outcome: Optional[Outcome] = None, *,
                       missing: str = "error") -> DataProto:
        """The trainer's batch made to match the responses just returned (v2's batch replacement).

        When the call was replayed, every field of `batch` that the recorded input also holds
        (``uid``, ``reward_model``, ``data_source``, ``extra_info``, ``raw_prompt`` ...) is replaced by
        the recorded value, so rewards are computed against the prompts and ground truth that belong to
        the replayed responses. Fields only `batch` has are kept. `batch` may be the trainer's batch
        before ``repeat(n)`` (one row per prompt) or after (one row per response). When the call ran,
        `batch` itself is returned.

        Args:
            batch: the trainer's current batch.
            outcome: the call's outcome (default: `last_outcome`).
            missing: ``"error"`` raises `MissingInputError` when the served record stored no input;
                ``"keep"`` returns `batch` unchanged then.

        Returns:
            A new DataProto (or `batch` itself when nothing needs replacing).

        Raises:
            MissingInputError: the served record stored no input (and `missing` is ``"error"``).
            NoOutcomeError: no `outcome` was given and the latest call's is not known.
        """
        if missing not in ("error", "keep"):
            raise ValueError(f"missing={missing!r}: use 'error' or 'keep'")
        try:
            recorded = self.matching_input(outcome)
        except MissingInputError:
            if missing == "keep":
                log.warning("matching_batch_without_input", reason="served record stored no input")
                return batch
            raise
        if recorded is None:
            return batch
        return align_batch(batch, recorded, rollout_n=self.rollout_n)

    # -- installing and closing -----------------------------------------------------------------------------
    def install(self, obj: Any, attr: str = "generate_sequences") -> "JournaledRollout":
        """Put this wrapper in place of ``obj.<attr>`` (an instance attribute); `uninstall` undoes it.

        When `generate` is async, what is installed is `acall` under verl's ``auto_await`` (the
        decorator on verl's own ``AgentLoopManager.generate_sequences``), so a caller that awaits gets a
        coroutine and a synchronous caller the DataProto, exactly as from the method replaced.
        """
        current = getattr(obj, attr)
        owner = journaled_by(current)
        if owner is not None:
            raise VerlAdapterError(
                f"{type(obj).__name__}.{attr} is already journaled by {owner!r}; attach once per trainer"
            )
        had_own = attr in getattr(obj, "__dict__", {})
        self._installed = (obj, attr, current if had_own else None)
        setattr(obj, attr, self.awaitable_entry() if self._async else self)
        return self

    def awaitable_entry(self) -> Callable[..., Any]:
        """`acall` under verl's ``auto_await``: the calling convention of verl's async rollout methods."""
        from verl.utils.ray_utils import auto_await

        entry = auto_await(self.acall)
        entry.stepjournal = self
        return entry

    def uninstall(self) -> None:
        """Restore what `install` replaced."""
        if self._installed is None:
            return
        obj, attr, previous = self._installed
        if previous is None:
            try:
                delattr(obj, attr)
            except AttributeError:
                pass
        else:
            setattr(obj, attr, previous)
        self._installed = None

    def close(self) -> None:
        """Uninstall and close the journal."""
        self.uninstall()
        if self.journal is not None:
            self.journal.close()


def journaled_by(fn: Any) -> Optional["JournaledRollout"]:
    """The `JournaledRollout` that `fn` is (or whose installed entry it is), else None."""
    if isinstance(fn, JournaledRollout):
        return fn
    found = getattr(fn, "stepjournal", None)
    return found if isinstance(found, JournaledRollout) else None


def align_batch(batch: DataProto, recorded: DataProto, *, rollout_n: int = 1) -> DataProto:
    """`batch` with the fields it shares with `recorded` (a recorded generation input) taken from `recorded`.

    `recorded` has one row per response (``gen_batch.repeat(n, interleave=True)``, plus REMAX's
    baseline rows after them); `batch` has one row per prompt or per response.
    """
    rows, source_rows = len(batch), len(recorded)
    if rows == source_rows:
        index = None
    else:
        stride = rollout_n if rollout_n > 1 else (source_rows // rows if rows and source_rows % rows == 0 else 0)
        if rows == 0 or stride < 1 or rows * stride > source_rows:
            raise VerlAdapterError(
                f"cannot line up the trainer batch ({rows} rows) with the recorded input ({source_rows} rows, "
                f"rollout n={rollout_n}): pass the batch before or after repeat(n)"
            )
        index = np.arange(rows) * stride
    non_tensor = dict(batch.non_tensor_batch or {})
    for key in non_tensor:
        if key in (recorded.non_tensor_batch or {}):
            value = recorded.non_tensor_batch[key]
            non_tensor[key] = value if index is None else value[index]
    tensors = batch.batch
    if tensors is not None and recorded.batch is not None:
        shared = [key for key in tensors.keys() if key in recorded.batch.keys()]
        if shared:
            tensors = tensors.clone(recurse=False)
            for key in shared:
                value = recorded.batch.get(key)
                tensors.set(key, value if index is None else value[torch.as_tensor(index)])
    return DataProto(batch=tensors, non_tensor_batch=non_tensor, meta_info=dict(batch.meta_info or {}))
