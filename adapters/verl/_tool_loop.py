"""verl's ``ToolAgentLoop`` with every tool call journaled, inside the agent-loop workers (Ray actors).

`JournaledToolAgentLoop` is verl's own ``ToolAgentLoop`` (its generation, tool parsing, dispatch and
token bookkeeping all run as verl wrote them), selected by config under verl's ``tool_agent`` name
(``actor_rollout_ref.rollout.agent.agent_loop_config_path``). It only:

- hands the real dispatch (``_call_tool``) tools put under the process's `ToolEngine`: a
  ``FunctionTool`` is one journaled call in the stage ``tool.<name>``; a ``BaseTool``'s create, execute
  and release are calls of the environment ``<name>`` (one sequence per sample, stage ``tool.<name>``);
- says where each call is: the step is the prompt's ``global_steps``, the sample its dataset
  ``index`` times ``rollout.n`` plus its ``session_id``, the turn the assistant turn that made the call,
  and the call index ``3 * i`` (+1 execute, +2 release) for the turn's ``i``-th call.

Each worker process opens the journal its config's ``stepjournal`` section names (the trainer's own),
once, and records into it beside the other processes. Decisions are the `ToolEngine`'s.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import threading
import uuid
from typing import Any, Callable, Dict, Optional, Tuple

import attrs

from stepjournal import Journal
from stepjournal.events import ToolResponse
from stepjournal.log import get_logger
from stepjournal.policies import ToolEngine, ToolReplayMissError, ToolStateMismatchError

from ._config import VerlJournalConfig, read_verl_config
from ._errors import RecordedToolError, VerlAdapterError

__all__ = ["make_journaled_tool_agent_loop", "tool_engine_for", "ToolCallPlace", "current_tool_call_place"]

log = get_logger(__name__)


@attrs.frozen
class ToolCallPlace:
    """Where a tool call of `JournaledToolAgentLoop` sits: step, sample, turn, the call's index in the turn, mode."""

    step: int
    sample: int
    turn: int = 0
    call: int = 0
    mode: str = "train"


# The sample's place (set around ToolAgentLoop.run) and the call's (around _call_tool): each asyncio task
# (one sample, one of its turn's calls) has its own copy.
_PLACE: contextvars.ContextVar[Optional[ToolCallPlace]] = contextvars.ContextVar("stepjournal_verl_tool_place",
                                                                                  default=None)


def current_tool_call_place() -> Optional[ToolCallPlace]:
    """The `ToolCallPlace` of the tool call running in this asyncio task, or None outside one."""
    return _PLACE.get()


# -- one engine per process and journal ------------------------------------------------------------------

_LOCK = threading.Lock()
_JOURNALS: Dict[Tuple[str, str], Journal] = {}
_ENGINES: Dict[Tuple[str, str, str, Tuple[str, ...]], ToolEngine] = {}
_READ: Dict[int, Tuple[Any, Optional[VerlJournalConfig]]] = {}


def tool_engine_for(config: Any, tools: Any) -> Optional[ToolEngine]:
    """The process's `ToolEngine` for a verl config's journal and policy (None: no form is enabled).

    Each process (each agent-loop worker) opens the journal once and keeps it open; every loop of that
    process shares the engine, so a sample's calls are followed in one place.

    Args:
        config: the whole verl config (or a read `VerlJournalConfig`).
        tools: the names of the tools it journals (verl's loaded tools).
    """
    cfg: Optional[VerlJournalConfig]
    if isinstance(config, VerlJournalConfig):
        cfg = config
    else:
        with _LOCK:  # every loop of a worker has the worker's one config object: read it once
            held = _READ.get(id(config))
        if held is None or held[0] is not config:
            held = _READ[id(config)] = (config, read_verl_config(config))
        cfg = held[1]
    if cfg is None:
        return None
    names = tuple(sorted(tools))
    key = (cfg.path, cfg.run, str(cfg.policy), names)
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            settings = cfg.engine
            journal = _JOURNALS.get((cfg.path, cfg.run))
            if journal is None:
                from stepjournal.policies import open_engine

                journal = _JOURNALS[(cfg.path, cfg.run)] = open_engine(settings).journal
            engine = _ENGINES[key] = ToolEngine(journal, settings.policy, tools=names, options=settings.options)
            log.info("verl_tools_journaled", tools=list(names), policy=str(cfg.policy), journal=cfg.path)
        return engine


# -- what is stored: verl's responses in the journal's ToolResponse form ------------------------------------


def _stored(response: Any, reward: Any = None, metrics: Any = None) -> Dict[str, Any]:
    images = getattr(response, "image", None) or getattr(response, "video", None)
    if images:
        raise VerlAdapterError("a verl tool answered with images or video: stepjournal journals text responses of "
                               "verl tools; journal this tool with bypass (tool.<name>:bypass)")
    text = getattr(response, "text", None) or ""
    return ToolResponse(text, None if reward is None else float(reward), dict(metrics or {})).to_payload()


def _verl_response(stored: Any) -> Any:
    from verl.tools.schemas import ToolResponse as VerlToolResponse

    return VerlToolResponse(text=stored["text"])


def _triple_stored(result: Any) -> Dict[str, Any]:
    from verl.tools.function_tool import normalize_function_tool_return

    return _stored(*normalize_function_tool_return(result))


def _triple_served(stored: Any) -> Tuple[Any, float, dict]:
    reward = stored["reward"]
    return _verl_response(stored), 0.0 if reward is None else reward, dict(stored["metrics"])


def _place(tool: str) -> ToolCallPlace:
    place = _PLACE.get()
    if place is None:
        raise VerlAdapterError(f"tool {tool!r} was called outside JournaledToolAgentLoop's dispatch: its step, sample "
                               "and turn are unknown")
    return place


@attrs.frozen
class _Raised:
    """A tool call that raised: its message (what verl shows the model after ``Error executing tool ...:``), and
    the error itself when it was raised in this process (a replay has its message only)."""

    message: str
    error: Optional[Exception] = attrs.field(default=None, eq=False)


def _catching(run: Callable[[], Any]) -> Callable[[], Any]:
    """``run`` for the engine: an exception the tool raises is its answer (`_Raised`), journaled like any other."""

    async def caught() -> Any:
        try:
            return await run()
        except Exception as error:
            return _Raised(str(error), error)

    return caught


def _storing(to_stored: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def stored(result: Any) -> Any:
        if isinstance(result, _Raised):
            return {**ToolResponse(result.message).to_payload(), "raised": True}
        return to_stored(result)

    return stored


def _serving(from_stored: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def served(stored: Any) -> Any:
        return _Raised(stored["text"]) if stored.get("raised") else from_stored(stored)

    return served


async def _journaled_call(engine: ToolEngine, tool: str, arguments: Any, run: Callable[[], Any], where: ToolCallPlace,
                          to_stored: Callable[[Any], Any], from_stored: Callable[[Any], Any], **more: Any) -> Any:
    """One journaled call at `where`; a call that raised (now or when recorded) raises again, for verl to show."""
    outcome = await engine.acall(tool, arguments, _catching(run), step=where.step, sample=where.sample,
                                 turn=where.turn, mode=where.mode, to_stored=_storing(to_stored),
                                 from_stored=_serving(from_stored), **more)
    value = outcome.value
    if isinstance(value, _Raised):
        raise value.error if value.error is not None else RecordedToolError(value.message)
    return value


def _journaled_function(tool: Any, engine: ToolEngine) -> Any:
    """A verl ``FunctionTool`` whose ``call`` is one journaled call (its real ``call`` runs when it must run)."""

    async def call(**parameters: Any) -> Any:
        where = _place(tool.name)
        return await _journaled_call(engine, tool.name, parameters, lambda: tool.call(parameters), where,
                                     _triple_stored, _triple_served, call=where.call)

    return dataclasses.replace(tool, fn=call, is_async=True)


def _journaled_base_tool(tool: Any, engine: ToolEngine) -> Any:
    """A verl ``BaseTool`` whose create, execute and release are calls of the environment ``tool.name``.

    verl hands create's instance id to execute and release; a replayed create made no instance, so the
    loop is given a handle of this wrapper's own, and the live instance id (when one was made, on a run
    or a catch-up) is kept beside it.
    """
    from verl.tools.base_tool import BaseTool

    class JournaledBaseTool(BaseTool):
        def __init__(self) -> None:  # verl's __init__ prints the schema; the wrapped tool did already
            self.config, self.tool_schema, self.name = tool.config, tool.tool_schema, tool.name
            self.live: Dict[str, str] = {}

        def get_openai_tool_schema(self) -> Any:
            return tool.get_openai_tool_schema()

        async def _call(self, method: str, offset: int, arguments: Any, run: Callable[[], Any],
                        to_stored: Callable[[Any], Any], from_stored: Callable[[Any], Any]) -> Any:
            where = _place(self.name)
            return await _journaled_call(engine, f"{self.name}.{method}", arguments, run, where, to_stored,
                                         from_stored, call=where.call + offset, environment=self.name)

        async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> Tuple[str, Any]:
            handle = instance_id or uuid.uuid4().hex

            async def run() -> Any:
                live, response = await tool.create(instance_id, **kwargs)
                self.live[handle] = live
                return response

            return handle, await self._call("create", 0, kwargs, run, _stored, _verl_response)

        async def execute(self, instance_id: str, parameters: Dict[str, Any], **kwargs: Any) -> Any:
            # verl passes its AgentData beside the model's arguments: the request is the arguments.
            return await self._call("execute", 1, parameters,
                                    lambda: tool.execute(self.live[instance_id], parameters, **kwargs),
                                    _triple_stored, _triple_served)

        async def release(self, instance_id: str, **kwargs: Any) -> None:
            async def run() -> None:
                if instance_id in self.live:
                    await tool.release(self.live.pop(instance_id), **kwargs)

            try:
                await self._call("release", 2, kwargs, run, lambda _: _stored(None), lambda _: None)
            except (ToolReplayMissError, ToolStateMismatchError):
                # verl releases in a `finally`: a refusal raised there would end the sample, not the call. The
                # refusal is journaled; a replayed or stranded sample holds no live instance to release.
                log.info("verl_tool_release_refused", tool=self.name)

        async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
            return await tool.calc_reward(self.live.get(instance_id, instance_id), **kwargs)

    return JournaledBaseTool()


# -- the agent loop ---------------------------------------------------------------------------------------------

_LOOP_CLASS: Any = None


class _Steps:
    """A process's samples in flight per step: a step's engine state is dropped when its last one ends."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: Dict[Tuple[int, int], int] = {}

    def start(self, engine: ToolEngine, step: int) -> None:
        with self.lock:
            self.running[(id(engine), step)] = self.running.get((id(engine), step), 0) + 1

    def end(self, engine: ToolEngine, step: int) -> None:
        with self.lock:
            left = self.running[(id(engine), step)] - 1
            if left:
                self.running[(id(engine), step)] = left
                return
            del self.running[(id(engine), step)]
        engine.forget_step(step)


_STEPS = _Steps()


def _sample_place(kwargs: Dict[str, Any], n: int) -> ToolCallPlace:
    """The step and sample of one V1 agent-loop run, from the prompt's fields verl hands ``run``."""
    missing = [name for name in ("global_steps", "index") if name not in kwargs]
    if missing:
        raise VerlAdapterError(
            f"JournaledToolAgentLoop.run got no {', '.join(missing)}: it journals the agent loop of verl's V1 "
            "trainer (AgentLoopWorkerTQ hands each prompt's global_steps and dataset index to the loop)")
    index, session = int(kwargs["index"]), int(kwargs.get("session_id", 0))
    if not 0 <= session < n:
        raise VerlAdapterError(f"session_id {session} of dataset index {index} is not below rollout.n={n}: the "
                               "sample number (index * n + session_id) would name another sample")
    return ToolCallPlace(step=int(kwargs["global_steps"]), sample=index * n + session)


def make_journaled_tool_agent_loop() -> type:
    """Build (once) `JournaledToolAgentLoop`, a subclass of verl's ``ToolAgentLoop``.

    Select it for verl's ``tool_agent`` name with an agent-loop config file
    (``actor_rollout_ref.rollout.agent.agent_loop_config_path``) holding
    ``[{name: tool_agent, _target_: stepjournal.adapters.verl.JournaledToolAgentLoop}]``; the tools and
    the journal come from the same config (``multi_turn.tool_config_path`` /
    ``function_tool_path``, the ``stepjournal`` section).
    """
    global _LOOP_CLASS
    with _LOCK:
        if _LOOP_CLASS is not None:
            return _LOOP_CLASS
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.tools.function_tool import FunctionTool

    class JournaledToolAgentLoop(ToolAgentLoop):
        """verl's ToolAgentLoop whose tool calls are journaled (see `make_journaled_tool_agent_loop`)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.tool_engine = tool_engine_for(self.config, self.tools) if self.tools else None
            if self.tool_engine is not None:
                engine = self.tool_engine
                self.tools = {name: _journaled_function(tool, engine) if isinstance(tool, FunctionTool)
                              else _journaled_base_tool(tool, engine) for name, tool in self.tools.items()}

        async def run(self, sampling_params: Dict[str, Any], **kwargs: Any) -> Any:
            if self.tool_engine is None:
                return await super().run(sampling_params, **kwargs)
            place = _sample_place(kwargs, self.rollout_config.n)
            token = _PLACE.set(place)
            _STEPS.start(self.tool_engine, place.step)
            try:
                return await super().run(sampling_params, **kwargs)
            finally:
                _PLACE.reset(token)
                _STEPS.end(self.tool_engine, place.step)
                locks = vars(self).get("_stepjournal_tool_locks", {})
                for key in [key for key in locks if key[:3] == (place.step, place.sample, place.mode)]:
                    del locks[key]

        async def _call_tool(self, tool_call: Any, tools_kwargs: Dict[str, Any], agent_data: Any) -> Any:
            sample = _PLACE.get()
            if sample is None:
                return await super()._call_tool(tool_call, tools_kwargs, agent_data)
            index = next(i for i, call in enumerate(agent_data.tool_calls) if call is tool_call)
            # This call runs in a task of its own (verl gathers a turn's calls): its place is its own.
            _PLACE.set(attrs.evolve(sample, turn=agent_data.assistant_turns - 1, call=3 * index))
            tool = getattr(agent_data, "_active_tools", self.tools).get(tool_call.name)
            if tool is None or isinstance(tool, FunctionTool):
                return await super()._call_tool(tool_call, tools_kwargs, agent_data)
            # A BaseTool's calls of one sample are one sequence (create, execute, release of each call): the
            # turn's calls of it that verl gathers (max_parallel_calls) run one after the other, in the order
            # the model wrote them (asyncio's lock is first come, first served; gather starts them in order).
            locks = vars(self).setdefault("_stepjournal_tool_locks", {})
            lock = locks.setdefault((sample.step, sample.sample, sample.mode, tool_call.name), asyncio.Lock())
            async with lock:
                return await super()._call_tool(tool_call, tools_kwargs, agent_data)

    JournaledToolAgentLoop.__module__ = "stepjournal.adapters.verl"
    JournaledToolAgentLoop.__qualname__ = "JournaledToolAgentLoop"
    with _LOCK:
        _LOOP_CLASS = _LOOP_CLASS or JournaledToolAgentLoop
        return _LOOP_CLASS
