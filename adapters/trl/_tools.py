"""`GRPOTrainer`'s tool calls under a `ToolEngine`: its ``tools=`` and its ``environment_factory``.

The decisions are the `ToolEngine`'s (docs/agents.md); this module only finds each call's place and
hands it over. Hook points, each on the one trainer instance and undone by `ToolHooks.uninstall`:

- ``_generate_and_score_completions``: one rollout batch. Its step is ``trainer.state.global_step``,
  its mode TRL's (``train`` / ``eval``, with the process index when there are several); when it ends,
  the engine forgets the step's samples.
- ``_generate_single_turn``: counts the batch's generations. A call's turn is the number of
  generations before it: an environment's ``reset`` is at turn 0, the tool calls that follow the
  first generation at turn 1, and so on; ``get_reward`` comes after the last.
- ``_generate``: when it starts, TRL has built one tool dict per sample of the batch
  (``_sync_tool_dicts``, ``_async_tool_dicts``: the ``tools=`` functions and the methods of the
  sample's environment); each entry is replaced by a journaled call bound to its sample. A call's
  index within its turn is the order TRL dispatches it in (the order the model wrote the calls).
- ``environment_factories`` and the instances of ``_environment_pool``: each environment's
  ``reset`` and ``get_reward`` are journaled calls of its sample too (an instance attribute shadows
  the class's method; TRL finds the tool methods on the class, so the schema is unchanged).

Stages: a ``tools=`` function is the stateless stage ``tool.<function name>``; an environment is the
stateful stage ``tool.<class name>``, one sequence per sample (``reset``, its tool methods,
``get_reward``), named in requests by the method's name. TRL shows a tool's exception to the model as
an error message; a call the rule refuses (``ToolReplayMissError``) or a failed catch-up
(``ToolStateMismatchError``) is not turned into text: it is raised from the trainer at the next
generation of the batch, or when the batch's tool loop ends.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import attrs

from stepjournal.events import EVERY_TOOL, TOOL_STAGE_PREFIX, ToolResponse
from stepjournal.log import get_logger
from stepjournal.policies import Outcome, ToolEngine, ToolReplayMissError, ToolStateMismatchError

from ._config import SINGLE_TURN, mode_of
from ._errors import RecordedToolError

__all__ = ["ToolHooks", "trainer_tools", "names_tools", "TOOL_FORMAT"]

log = get_logger(__name__)

# The `format` beside the response's fields in every tool payload this adapter stores.
TOOL_FORMAT = "stepjournal.trl.tool/1"
_SCORE = "_generate_and_score_completions"
_GENERATE = "_generate"
_RESET, _REWARD = "reset", "get_reward"
_REFUSALS = (ToolReplayMissError, ToolStateMismatchError)


def _constant(sample: int) -> Callable[[], int]:
    """The `sample_of` of a tool bound to one sample's dict: that sample, whenever asked."""
    return lambda: sample


def trainer_tools(trainer: Any) -> Tuple[str, ...]:
    """The tools a `GRPOTrainer` dispatches, as a `ToolEngine` names them: each ``tools=`` function's
    name, then each environment's class name (an environment is one stateful tool). Empty for a trainer
    without tools (and for TRL trainers that have none, as `RLOOTrainer`)."""
    names = [tool.__name__ for tool in getattr(trainer, "_standalone_tools", None) or ()]
    for pool in (getattr(trainer, "_environment_pool", None) or {}).values():
        names.append(type(pool[0]).__name__)
    return tuple(dict.fromkeys(names))


def names_tools(stages: Any) -> bool:
    """Whether a per-stage spec's stages name a tool stage (``tool.<name>``, or ``tools`` for every one)."""
    return any(stage == EVERY_TOOL or stage.startswith(TOOL_STAGE_PREFIX) for stage in stages)


@attrs.frozen
class _Raised:
    """A tool call that raised: what TRL shows the model of it (``{"error": message}``), and the error itself
    when it was raised in this process (a replay has its message only)."""

    message: str
    error: Optional[Exception] = attrs.field(default=None, eq=False)

    def throw(self) -> Any:
        raise self.error if self.error is not None else RecordedToolError(self.message)


def _to_stored(result: Any, *, reward: bool = False) -> Dict[str, Any]:
    """A TRL tool's answer as stored: the text TRL shows the model, and the value itself where TRL reads it.

    TRL shows the model ``str(result)`` of any answer but a list of content blocks, ``reset``'s ``None``
    means no observation, and ``get_reward``'s float is the reward: only these values are kept as they
    are (any other value is served as its text, which TRL shows the same, so a value the journal's
    codec has no form for, a set or a dataclass, is replayed too). A call that raised is stored as the
    error TRL shows the model.
    """
    if isinstance(result, _Raised):
        response = ToolResponse(str({"error": result.message}))
        return {**response.to_payload(), "format": TOOL_FORMAT, "returned": "raised", "value": result.message}
    text = result if isinstance(result, str) else str(result)
    response = ToolResponse(text, reward=float(result) if reward and result is not None else None)
    kept = reward or result is None or isinstance(result, list)
    returned = "value" if kept and not isinstance(result, str) else "text"
    return {**response.to_payload(), "format": TOOL_FORMAT, "returned": returned,
            "value": result if returned == "value" else None}


def _from_stored(stored: Dict[str, Any]) -> Any:
    if stored["returned"] == "raised":
        return _Raised(stored["value"])
    return stored["text"] if stored["returned"] == "text" else stored["value"]


def _running(fn: Any, arguments: Dict[str, Any]) -> Callable[[], Any]:
    """``fn(**arguments)`` for the engine to run: an exception the tool raises is its answer (`_Raised`)."""
    if inspect.iscoroutinefunction(fn):
        async def run_async() -> Any:
            try:
                return await fn(**arguments)
            except Exception as error:
                return _Raised(str(error), error)

        return run_async

    def run() -> Any:
        try:
            return fn(**arguments)
        except Exception as error:
            return _Raised(str(error), error)

    return run


class ToolHooks:
    """The journaled tool and environment calls of one `GRPOTrainer`, installed and removed together.

    Args:
        trainer: the attached trainer.
        engine: the `ToolEngine` that decides and journals each call.

    Attributes:
        counts: stage -> action -> calls so far (``recorded``/``replayed``/``bypassed``/``generated`` ...,
            the `Outcome` actions).
    """

    def __init__(self, trainer: Any, engine: ToolEngine) -> None:
        self.trainer = trainer
        self.engine = engine
        self.counts: Dict[str, Dict[str, int]] = {}
        self._previous: Dict[str, Any] = {}  # hooked name -> the instance attribute it shadowed (or absent)
        self._factories: Dict[Any, Any] = {}
        self._patched: List[Any] = []
        self._batch: Optional[Tuple[int, str]] = None  # (step, mode) of the rollout batch under way
        self._turn = 0
        self._calls: Dict[Tuple[int, int], int] = {}
        self._refused: Optional[BaseException] = None

    # -- installing ----------------------------------------------------------------------------------
    def install(self) -> None:
        self._wrap(_SCORE, self._batch_wrapper)
        self._wrap(SINGLE_TURN, self._turn_wrapper)
        self._wrap(_GENERATE, self._dicts_wrapper)
        trainer = self.trainer
        factories = getattr(trainer, "environment_factories", None)
        if factories:
            for name, factory in list(factories.items()):
                self._factories[name] = factory
                factories[name] = self._factory_wrapper(factory)
            for pool in trainer._environment_pool.values():
                for instance in pool:
                    self._patch(instance)

    def uninstall(self) -> None:
        trainer = self.trainer
        for name, previous in reversed(list(self._previous.items())):
            if previous is None:
                vars(trainer).pop(name, None)
            else:
                setattr(trainer, name, previous)
        for name, factory in self._factories.items():  # only a trainer with environment factories has any
            trainer.environment_factories[name] = factory
        for instance in self._patched:
            for method in (_RESET, _REWARD):
                vars(instance).pop(method, None)
        self._previous, self._factories, self._patched = {}, {}, []

    def _wrap(self, name: str, make: Callable[[Any], Any]) -> None:
        self._previous[name] = vars(self.trainer).get(name)
        original = getattr(self.trainer, name)  # the bound method, or an earlier hook's wrapper
        setattr(self.trainer, name, functools.wraps(original)(make(original)))

    def _factory_wrapper(self, factory: Any) -> Any:
        @functools.wraps(factory)
        def make(*args: Any, **kwargs: Any) -> Any:
            return self._patch(factory(*args, **kwargs))

        return make

    def _patch(self, instance: Any) -> Any:
        """Shadow an environment's ``reset`` and ``get_reward`` with journaled calls of its sample."""
        environment = type(instance).__name__
        for method in (_RESET, _REWARD):
            bound = getattr(type(instance), method, None)
            if bound is None:
                continue
            fn = getattr(instance, method)
            setattr(instance, method, self._journaled(fn, method, functools.partial(self._sample_of, instance),
                                                      environment, reward=method == _REWARD))
        self._patched.append(instance)
        return instance

    # -- the batch, its turns and its tool dicts -----------------------------------------------------
    def _batch_wrapper(self, original: Any) -> Any:
        def batch(*args: Any, **kwargs: Any) -> Any:
            step = int(self.trainer.state.global_step)
            self._batch, self._turn, self._calls, self._refused = (step, mode_of(self.trainer)), 0, {}, None
            try:
                return original(*args, **kwargs)
            finally:
                self._batch = None
                self.engine.forget_step(step)

        return batch

    def _turn_wrapper(self, original: Any) -> Any:
        def generate(*args: Any, **kwargs: Any) -> Any:
            self._raise_refused()  # never generate from a conversation the journal refused to answer
            self._turn += 1
            return original(*args, **kwargs)

        return generate

    def _dicts_wrapper(self, original: Any) -> Any:
        def generate(*args: Any, **kwargs: Any) -> Any:
            trainer = self.trainer
            if trainer.tools:
                environments = trainer.environments or []
                for sample, dicts in enumerate(zip(trainer._sync_tool_dicts, trainer._async_tool_dicts)):
                    mine = environments[sample] if sample < len(environments) else None
                    for table in dicts:
                        for name, fn in list(table.items()):
                            owner = getattr(fn, "__self__", None)
                            environment = type(owner).__name__ if owner is not None and owner is mine else None
                            table[name] = self._journaled(fn, name, _constant(sample), environment)
            result = original(*args, **kwargs)
            self._raise_refused()
            return result

        return generate

    def _sample_of(self, instance: Any) -> int:
        environments = self.trainer.environments or []
        for sample, environment in enumerate(environments):
            if environment is instance:
                return sample
        raise RuntimeError(f"TRL called {type(instance).__name__} outside its batch's environments")

    def _raise_refused(self) -> None:
        refused, self._refused = self._refused, None
        if refused is not None:
            raise refused

    # -- one call ------------------------------------------------------------------------------------
    def _place(self, sample_of: Callable[[], int]) -> Dict[str, Any]:
        if self._batch is None:  # outside a rollout batch (a user's own call): not a call of any step
            return {}
        step, mode = self._batch
        sample = sample_of()
        call = self._calls.get((sample, self._turn), 0)
        self._calls[(sample, self._turn)] = call + 1
        return {"step": step, "mode": mode, "sample": sample, "turn": self._turn, "call": call}

    def _journaled(self, fn: Any, tool: str, sample_of: Callable[[], int], environment: Optional[str], *,
                   reward: bool = False) -> Any:
        to_stored = functools.partial(_to_stored, reward=reward)

        if inspect.iscoroutinefunction(fn):
            def start_async(*args: Any, **arguments: Any) -> Any:
                place = self._place(sample_of)  # now, in TRL's dispatch order, not when the loop runs it
                if not place:
                    return fn(*args, **arguments)
                _positional(tool, args)
                return self._acall(fn, tool, arguments, place, environment, to_stored)

            return functools.wraps(fn)(start_async)

        def call(*args: Any, **arguments: Any) -> Any:
            place = self._place(sample_of)
            if not place:
                return fn(*args, **arguments)
            _positional(tool, args)
            try:
                outcome = self.engine.call(tool, arguments, _running(fn, arguments), environment=environment,
                                           to_stored=to_stored, from_stored=_from_stored, **place)
            except _REFUSALS as exc:
                self._refused = self._refused or exc
                raise
            return self._count(outcome)

        return functools.wraps(fn)(call)

    async def _acall(self, fn: Any, tool: str, arguments: Dict[str, Any], place: Dict[str, Any],
                     environment: Optional[str], to_stored: Callable[[Any], Any]) -> Any:
        try:
            outcome = await self.engine.acall(tool, arguments, _running(fn, arguments), environment=environment,
                                              to_stored=to_stored, from_stored=_from_stored, **place)
        except _REFUSALS as exc:
            self._refused = self._refused or exc
            raise
        return self._count(outcome)

    def _count(self, outcome: Outcome) -> Any:
        per_stage = self.counts.setdefault(outcome.ctx.stage, {})
        per_stage[outcome.action] = per_stage.get(outcome.action, 0) + 1
        value = outcome.value
        return value.throw() if isinstance(value, _Raised) else value


def _positional(tool: str, args: tuple) -> None:
    if args:
        raise TypeError(f"tool {tool!r} is journaled: TRL calls tools with keyword arguments only, got {args!r}")
