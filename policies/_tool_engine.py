"""`ToolEngine`: journals tool and environment calls through the engine, one call event each.

Each call is decided by a `ToolPolicy` made for it (its stage's rule and the call's facts), then
carried out by the `Engine` like any stage's call (fingerprint and input checks, journaling). The
engine keeps, per sample, what the decisions need to know and the journal cannot say yet: the calls'
order, which records were served, and a stateful sample's first miss.

A stateful sample that misses under `cache` has followed the recording so far without touching the
real environment. Before its first live call, the calls served to it are run again on the real tool,
in order (a catch-up, journaled as bypassed calls), and each response must equal the one served: the
live environment then holds the state the model saw, or `ToolStateMismatchError` says it cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import attrs

from stepjournal import Journal
from stepjournal.errors import ToolCallError
from stepjournal.events import (CATCH_UP_POLICY, EVERY_TOOL, SERVING_RULES, TOOL_STAGE_PREFIX, ToolCallKey, ToolRequest,
                                tool_stage)
from stepjournal.log import get_logger
from stepjournal.vocabulary import Action

from ._base import Policy
from ._engine import CallHooks, Engine, Outcome
from ._errors import ReplayMissError, SpecError, ToolStateMismatchError
from ._options import EngineOptions, unknown_keys_text
from ._stages import StagePolicies
from ._tool_policy import ToolCallFacts, ToolPolicy, ToolReplayMissError, tool_rule

__all__ = ["ToolEngine", "ToolStateMismatchError"]

log = get_logger(__name__)




@attrs.define
class _Served:
    """A call served to a stateful sample: how to run it for real, and the digest of what was served."""

    key: ToolCallKey
    request: ToolRequest
    run: Callable[[], Any]
    to_stored: Callable[[Any], Any]
    digest: str


@attrs.define
class _Sample:
    """One sample's calls of one stage in this session."""

    ordinal: int = 0
    left_at: Optional[ToolCallKey] = None
    served: List[_Served] = attrs.Factory(list)
    served_seqs: set = attrs.Factory(set)
    stranded: Optional[str] = None  # why the catch-up failed: the live environment is not the model's
    in_flight: int = 0  # a stateful sample's calls under way


_Key = TypeVar("_Key", bound=Tuple[Any, ...])


def _same(value: Any) -> Any:
    return value


def _drop_step(table: Dict[_Key, Any], step: int) -> None:
    """Delete the entries of `step` (the third item of each key) from `table`."""
    for key in [key for key in table if key[2] == step]:
        del table[key]


async def _in_a_thread(work: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(work)


async def _awaited(result: Awaitable[Any]) -> Any:
    return await result


def _run_to_end(served: _Served) -> Any:
    """Run a served call again from a sync call's catch-up: an environment's async method (served to an async
    call) is awaited in an event loop of its own, as none may run in this thread."""
    result = served.run()
    if not inspect.isawaitable(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(result))
    getattr(result, "close", lambda: None)()
    raise ToolCallError(
        f"the catch-up of this sync call must run {served.request} ({served.key}), an async call, again, and an "
        "event loop runs in this thread: call this environment's tools with ToolEngine.acall (await them)")


class ToolEngine:
    """Journal tool calls: record, replay by request, and apply the miss rule, per tool stage.

    Args:
        journal: the journal (opened for writing) the calls go to.
        policy: the tools' spec: one of ``cache``, ``replay``, ``dump``, ``passthrough``, ``bypass``
            (``replay(on_missing=generate)`` is ``cache``) for every tool, or a per-stage spec naming
            each tool's stage (``"tool.calculator:replay/tool.sandbox:cache"``); `EVERY_TOOL`
            (``tools:replay``) stands for every tool stage it does not name; another stage is bypassed.
        tools: the tools (and stateful environments) this engine journals, when known up front: a per-stage
            spec naming another ``tool.<name>`` is then refused with did-you-mean (a misspelt stage would
            otherwise leave its tool bypassed), and so is a call of a tool not in it.
        options: the `EngineOptions` (fingerprint checks, bypassed modes ...).
        run_blocking: where `acall` runs its journal I/O (deciding, loading, encoding): ``async (work) ->
            work()``. Default: a worker thread (`asyncio.to_thread`), so a large response's encoding does not
            hold the event loop. A generated call's record is awaited (`Journal.arecord`), so the loop's
            other calls go on while it waits for its durable commit, and concurrent calls share one.
        **option_keywords: each option as its own keyword, as `Engine` takes them.

    Attributes:
        engine: the `Engine` that carries the calls out.
        tools: the declared tools, or None.
    """

    def __init__(self, journal: Journal, policy: Union[Policy, str, Mapping[str, Any]] = "cache", *,
                 tools: Optional[Sequence[str]] = None, options: Optional[EngineOptions] = None,
                 run_blocking: Optional[Callable[[Callable[[], Any]], Awaitable[Any]]] = None,
                 **option_keywords: Any) -> None:
        self.engine = Engine(journal, policy, options=EngineOptions.from_keywords(options, option_keywords,
                                                                                   where="ToolEngine"))
        self.tools = None if tools is None else tuple(tools)
        self._run_blocking = run_blocking or _in_a_thread
        if isinstance(self.engine.policy, StagePolicies):
            self._check_stages(self.engine.policy)
        else:
            tool_rule(self.engine.policy, "every tool")  # refuse a policy no tool stage takes, now
        self.journal = journal
        self._lock = threading.Lock()
        self._turn_calls: Dict[Tuple[str, int, int, int], int] = {}
        self._samples: Dict[Tuple[str, str, int, int], _Sample] = {}

    def _check_stages(self, policy: StagePolicies) -> None:
        """Refuse, now rather than at a tool's first call, a spec's tool stage whose policy no tool stage takes,
        and a stage that looks meant for tools but names none (it would leave them bypassed)."""
        # Only the tool stages are this engine's to check: a shared spec names other engines' stages too.
        declared = None if self.tools is None else tuple(tool_stage(name) for name in self.tools)
        unknown = []
        for stage in policy.stages:
            if stage == EVERY_TOOL or (stage.startswith(TOOL_STAGE_PREFIX) and (declared is None or stage in declared)):
                tool_rule(policy.for_stage(stage), stage)
            elif (stage.startswith(TOOL_STAGE_PREFIX) or stage.casefold() in ("tool", EVERY_TOOL)
                  or (declared is not None and stage.casefold().startswith("tool"))):
                unknown.append(stage)
        if unknown:
            known = (EVERY_TOOL,) if declared is None else (*declared, EVERY_TOOL)
            raise SpecError("per-stage spec names unknown tool stage "
                            + unknown_keys_text(unknown, known, "the tool stages here are"))

    def rule(self, stage: str) -> str:
        """The rule of a tool stage (one of `TOOL_RULES`)."""
        policy = self.engine.policy
        if isinstance(policy, StagePolicies):
            named = policy.for_stage(stage)
            if named is None:
                named = policy.for_stage(EVERY_TOOL)
            return "bypass" if named is None else tool_rule(named, stage)
        return tool_rule(policy, stage)

    def forget_step(self, step: int) -> None:
        """Drop what this engine keeps about `step`'s samples (call it once a step's rollouts are done)."""
        with self._lock:
            _drop_step(self._turn_calls, step)
            _drop_step(self._samples, step)

    # -- one call ----------------------------------------------------------------------------------
    def call(self, tool: str, arguments: Any, run_tool: Callable[[], Any], *, step: int, sample: int,
             turn: int = 0, call: Optional[int] = None, mode: str = "train", environment: Optional[str] = None,
             to_stored: Callable[[Any], Any] = _same, from_stored: Callable[[Any], Any] = _same) -> Outcome:
        """Journal one call of `tool` with `arguments`; `run_tool()` runs it for real when it must run.

        Args:
            tool: the tool's name (the stage is ``tool.<name>``, or ``tool.<environment>``).
            arguments: the call's arguments (a mapping, or JSON text of an object).
            run_tool: runs the tool and returns its response.
            step, sample, turn: where the call is: the train step, the sample within it, its turn.
            call: the call's index within the turn (default: the next one of this session).
            mode: the call's mode.
            environment: the stateful environment the tool belongs to (its calls share one stage and
                one state per sample); None for a stateless tool.
            to_stored: the response -> what the journal stores (`ToolResponse.to_payload` form or any value).
            from_stored: what the journal stored -> the response a replay gives back.

        Raises:
            ToolReplayMissError: the rule is ``replay`` and no recorded response answers the request.
            ToolStateMismatchError: a stateful sample's catch-up got another response than was served.
            ToolCallError: the arguments are not canonical JSON, or the key is out of range.
        """
        stage, request, key, facts, hooks = self._begin(tool, arguments, step, sample, turn, call, mode, environment,
                                                       to_stored, from_stored)
        with self._in_flight(stage, step, mode, facts):
            rule = self.rule(stage)
            return self._call(stage, step, mode, request, key, facts, hooks, rule, run_tool, to_stored)

    def _call(self, stage: str, step: int, mode: str, request: ToolRequest, key: ToolCallKey, facts: ToolCallFacts,
              hooks: CallHooks, rule: str, run_tool: Callable[[], Any], to_stored: Callable[[Any], Any]) -> Outcome:
        def generate() -> Any:
            for served in self._catch_up(stage, step, mode, facts, rule):
                with self._stranding(stage, step, mode, facts, served):
                    started = time.perf_counter()
                    result = _run_to_end(served)
                    self._check_caught_up(stage, step, mode, served, result, time.perf_counter() - started)
            return run_tool()

        try:
            outcome = self.engine.call(step, generate, mode=mode, gen_index=key.gen_index, hooks=hooks, stage=stage,
                                       decide_with=ToolPolicy(rule, facts))
        except ReplayMissError as exc:
            self._missed(stage, step, mode, facts)
            raise self._miss_error(exc, stage, step, key, request) from None
        self._done(stage, step, mode, facts, outcome, run_tool, to_stored)
        return outcome

    async def acall(self, tool: str, arguments: Any, run_tool: Callable[[], Awaitable[Any]], *, step: int,
                    sample: int, turn: int = 0, call: Optional[int] = None, mode: str = "train",
                    environment: Optional[str] = None, to_stored: Callable[[Any], Any] = _same,
                    from_stored: Callable[[Any], Any] = _same) -> Outcome:
        """`call` for an async tool: awaits `run_tool()` when the call must run; the journal I/O runs through
        `run_blocking` (a worker thread by default), and the record is awaited (`Journal.arecord`)."""
        stage, request, key, facts, hooks = self._begin(tool, arguments, step, sample, turn, call, mode, environment,
                                                       to_stored, from_stored, self._run_blocking)
        with self._in_flight(stage, step, mode, facts):
            rule = self.rule(stage)
            return await self._acall(stage, step, mode, request, key, facts, hooks, rule, run_tool, to_stored)

    async def _acall(self, stage: str, step: int, mode: str, request: ToolRequest, key: ToolCallKey,
                     facts: ToolCallFacts, hooks: CallHooks, rule: str, run_tool: Callable[[], Awaitable[Any]],
                     to_stored: Callable[[Any], Any]) -> Outcome:
        async def generate() -> Any:
            for served in self._catch_up(stage, step, mode, facts, rule):
                with self._stranding(stage, step, mode, facts, served):
                    started = time.perf_counter()
                    result = served.run()
                    result = await result if inspect.isawaitable(result) else result
                    self._check_caught_up(stage, step, mode, served, result, time.perf_counter() - started)
            return await run_tool()

        try:
            outcome = await self.engine.acall(step, generate, mode=mode, gen_index=key.gen_index, hooks=hooks,
                                              stage=stage, decide_with=ToolPolicy(rule, facts))
        except ReplayMissError as exc:
            self._missed(stage, step, mode, facts)
            raise self._miss_error(exc, stage, step, key, request) from None
        self._done(stage, step, mode, facts, outcome, run_tool, to_stored)
        return outcome

    # -- the steps of a call -------------------------------------------------------------------------
    def _begin(self, tool: str, arguments: Any, step: int, sample: int, turn: int, call: Optional[int], mode: str,
               environment: Optional[str], to_stored: Callable[[Any], Any], from_stored: Callable[[Any], Any],
               run_blocking: Optional[Callable[[Callable[[], Any]], Awaitable[Any]]] = None):
        stage = tool_stage(environment if environment is not None else tool)
        if self.tools is not None and (environment if environment is not None else tool) not in self.tools:
            raise ToolCallError(f"tool {tool!r} (stage {stage!r}) is not one of this engine's tools "
                                f"{list(self.tools)}: name it in ToolEngine(tools=...)")
        request = ToolRequest.of(tool, arguments)
        with self._lock:
            turn_key = (mode, sample, step, turn)
            counted = self._turn_calls.get(turn_key, 0)
            key = ToolCallKey(sample, turn, counted if call is None else call)
            # A counted call comes after every call of the turn so far, explicit ones too: never on one's key.
            self._turn_calls[turn_key] = max(counted, key.call + 1)
            state = self._samples.setdefault((stage, mode, step, sample), _Sample())
            if environment is not None and state.in_flight and self.rule(stage) in SERVING_RULES:
                # Which of two concurrent calls is the sample's next one is not defined, so neither a recorded
                # history can be followed nor a catch-up run in the order the model was served.
                raise ToolCallError(
                    f"stateful tool stage {stage!r}, step {step}, sample {sample}: {request} at {key} started while "
                    "another call of the sample is under way; a stateful sample's calls are sequential: await each "
                    "call before the next one (or journal this environment with dump)")
            if environment is not None:
                state.in_flight += 1
            facts = ToolCallFacts(key, request, stateful=environment is not None, ordinal=state.ordinal,
                                  left_at=state.left_at, served=frozenset(state.served_seqs))
            state.ordinal += 1

        def prepare() -> Tuple[Any, Optional[str]]:
            prepared = self.journal.prepare(request.to_payload())
            return prepared, prepared.digest

        hooks = CallHooks(prepare_input=prepare, to_stored=to_stored,
                          from_stored=lambda outcome: from_stored(outcome.value),
                          **({} if run_blocking is None else {"run_blocking": run_blocking}))
        return stage, request, key, facts, hooks

    def _catch_up(self, stage: str, step: int, mode: str, facts: ToolCallFacts, rule: str) -> List[_Served]:
        """A stateful sample's first miss under a serving rule: mark it, and return the calls to run again.

        Raises:
            ToolStateMismatchError: an earlier catch-up of the sample failed (it is stranded).
        """
        if not facts.stateful or rule not in SERVING_RULES:
            return []
        with self._lock:
            state = self._samples[(stage, mode, step, facts.key.sample)]
            stranded = state.stranded
            if stranded is None:
                if state.left_at is not None:
                    return []
                state.left_at = facts.key
                served, state.served = state.served, []
        if stranded is not None:
            raise ToolStateMismatchError(
                f"stateful tool stage {stage!r}, step {step}, sample {facts.key.sample}: {facts.request} at "
                f"{facts.key} is refused: {stranded}, so its live environment is not in the state the model saw "
                "and no later call of the sample runs on it; record this sample again (dump) in a new environment",
                step=step, stage=stage, key=facts.key, request=facts.request,
            )
        log.info("tool_sample_left_recording", step=step, stage=stage, key=str(facts.key), catch_up=len(served))
        return served

    @contextlib.contextmanager
    def _in_flight(self, stage: str, step: int, mode: str, facts: ToolCallFacts) -> Iterator[None]:
        """Around a call that `_begin` counted as under way (a stateful one): count it done."""
        try:
            yield
        finally:
            if facts.stateful:
                with self._lock:
                    self._samples[(stage, mode, step, facts.key.sample)].in_flight -= 1

    @contextlib.contextmanager
    def _stranding(self, stage: str, step: int, mode: str, facts: ToolCallFacts, served: _Served) -> Iterator[None]:
        """Around one catch-up call: if it fails (raises, answers otherwise, is cancelled), the sample is stranded."""
        try:
            yield
        except BaseException as exc:
            with self._lock:
                self._samples[(stage, mode, step, facts.key.sample)].stranded = (
                    f"its catch-up failed at {served.request} ({served.key}: {type(exc).__name__})")
            raise

    def _check_caught_up(self, stage: str, step: int, mode: str, served: _Served, result: Any,
                         duration_s: float) -> None:
        digest = self.journal.prepare(served.to_stored(result), store=False).digest
        same = digest == served.digest
        self.journal.record_bypass(
            step, gen_index=served.key.gen_index, mode=mode, policy=CATCH_UP_POLICY, stage=stage, duration_s=duration_s,
            reason=(f"catch-up: {served.request} run again on the live environment before the sample's first miss; "
                    + ("the same response as served" if same else "another response than served")),
        )
        if not same:
            raise ToolStateMismatchError(
                f"stateful tool stage {stage!r}, step {step}: {served.request} at {served.key} answered otherwise "
                "when run again on the live environment than the recording served, so the live state would not "
                "be the one the model saw; record this sample again (dump), or make the tool deterministic",
                step=step, stage=stage, key=served.key, request=served.request,
            )

    def _missed(self, stage: str, step: int, mode: str, facts: ToolCallFacts) -> None:
        if facts.stateful:
            with self._lock:
                state = self._samples[(stage, mode, step, facts.key.sample)]
                if state.left_at is None:
                    state.left_at = facts.key

    def _done(self, stage: str, step: int, mode: str, facts: ToolCallFacts, outcome: Outcome,
              run_tool: Callable[[], Any], to_stored: Callable[[Any], Any]) -> None:
        if outcome.action != Action.REPLAYED or outcome.source is None:
            return
        source = outcome.source
        with self._lock:
            state = self._samples[(stage, mode, step, facts.key.sample)]
            state.served_seqs.add(source.seq)
            if facts.stateful and state.left_at is None and source.event.output is not None:
                state.served.append(_Served(facts.key, facts.request, run_tool, to_stored, source.event.output.digest))

    @staticmethod
    def _miss_error(exc: ReplayMissError, stage: str, step: int, key: ToolCallKey,
                    request: ToolRequest) -> ToolReplayMissError:
        return ToolReplayMissError(str(exc), step=step, stage=stage, key=key, request=request)
