"""The engine: asks the policy about each generate call, checks the answer, carries it out, journals it.

Policies decide; the engine does the I/O (loading payloads, recording events) and the validity checks
that apply to every replay (fingerprint, optional input digest). The call sequence (decide, time and
run the generator, journal) is written once, in `Engine._sequence`; `Engine.call` runs it inline and
`Engine.acall` runs its journal I/O through a hook (`CallHooks.run_blocking`). Adapters plug in with
`CallHooks` (what is stored for a value and what a replay gives back) instead of repeating the sequence.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from typing import Any, Awaitable, Callable, Dict, Generator, Mapping, Optional, Sequence, Tuple, Union

import attrs

from stepjournal.vocabulary import DEFAULT_MODE, DEFAULT_STAGE, Action, Stage, StageRole, check_stage
from stepjournal.log import get_logger
from stepjournal import Journal
from stepjournal.errors import IntegrityError
from stepjournal.index import RecordedGeneration

from ._base import (
    BypassCall,
    CallContext,
    Decision,
    GenerateCall,
    JournalView,
    Policy,
    RefuseCall,
    ServeRecorded,
    is_policy,
)
from ._checks import ReplayChecks, stage_input_digest
from ._errors import ReplayMissError, StageRoleError
from ._options import EngineOptions
from ._roles import check_stage_roles, role_of
from ._stages import parse_stages

__all__ = ["Engine", "Outcome", "PendingCall", "CallHooks"]

log = get_logger(__name__)


@attrs.frozen
class Outcome:
    """What happened to one generate call.

    Every outcome is of a journaled call: a call an adapter makes without an engine has none.

    Attributes:
        value: what the call returns (generated, or decoded from the journal).
        action: an `Action`: ``"generated"``, ``"replayed"`` or ``"bypassed"``.
        ctx: the call's context (step, generation index ...).
        source: the recorded generation that was served (replays) or written (generated; its
            ``event.output`` is None when the output was not stored, by the policy or because it could not be).
        seq: the sequence number of the event that journaled the call.
    """

    value: Any
    action: Action
    ctx: CallContext
    source: Optional[RecordedGeneration]
    seq: int


@attrs.frozen
class PendingCall:
    """A call the engine has decided on: either `replayed` (value ready) or waiting for the generator."""

    ctx: CallContext
    decision: Decision
    policy: str
    outcome: Optional[Outcome] = None


# How much of a codec's error the why keeps. An error may quote the value (megabytes of it); the why goes into
# the event twice (`not_stored` and the reason), and an event over `MAX_EVENT_BYTES` is refused, which would
# lose the output the why is about.
_WHY_CHARS = 2000


def _clipped(text: str) -> str:
    """`text`, cut to `_WHY_CHARS` characters, saying how long it was."""
    return text if len(text) <= _WHY_CHARS else f"{text[:_WHY_CHARS]}… ({len(text)} characters)"


def _same(value: Any) -> Any:
    return value


def _served_value(outcome: Outcome) -> Any:
    return outcome.value


async def _run_inline(work: Callable[[], Any]) -> Any:
    return work()


@attrs.frozen
class CallHooks:
    """How an adapter plugs into the engine's call sequence; every hook is optional.

    Attributes:
        prepare_input: ``() -> (input, input_digest)``: what to store as the call's input (a value or
            a `PreparedPayload`, or None) and its digest (or None). Runs as journal I/O before the
            decision, and not at all for a bypassed mode. When given, `call`'s `input` and
            `input_digest` are not.
        to_stored: the generator's output -> what the journal stores (e.g. the output with the
            random-number state the call left behind). Runs right after the generator returns, in the
            caller's thread. The caller still gets the generator's output.
        from_stored: a replayed `Outcome` -> what the caller gets (the inverse of `to_stored`;
            ``outcome.value`` is what was stored, ``outcome.ctx`` and ``outcome.source`` say which
            call and which record). Runs in the caller's thread.
        run_blocking: `acall` only: ``async (work) -> work()``, where the journal I/O (deciding,
            loading, encoding, a bypassed call's record) runs, e.g. `asyncio.to_thread` so other tasks go
            on meanwhile. Default: inline in the event loop. A generated call's record is awaited
            (`Journal.arecord`): waiting for its durable commit holds neither the loop nor a thread.
            `call` always runs it inline.
    """

    prepare_input: Optional[Callable[[], Tuple[Any, Optional[str]]]] = None
    to_stored: Callable[[Any], Any] = _same
    from_stored: Callable[[Outcome], Any] = _served_value
    run_blocking: Callable[[Callable[[], Any]], Awaitable[Any]] = _run_inline


_NO_HOOKS = CallHooks()
# What `_sequence` yields when the generator must run now (anything else it yields is journal I/O).
_GENERATE = object()


@attrs.frozen
class _Finish:
    """What `_sequence` yields to journal a call whose generator ran: `call` runs it (`Engine.finish`), `acall`
    awaits its record."""

    engine: "Engine"
    call: "PendingCall"
    output: Any
    input: Any
    duration_s: float

    def __call__(self) -> Outcome:
        return self.engine.finish(self.call, self.output, input=self.input, duration_s=self.duration_s)


class Engine(ReplayChecks):
    """Evaluate a policy for each generate call against a journal, and journal what happened.

    Args:
        journal: the journal (opened for writing) the calls go to.
        policy: a policy object, a spec string, or a per-stage spec (a mapping of stage -> spec, or
            ``"generate:cache/reward:replay@1-5"``), given to `stepjournal.policies.parse_stages`.
        options: the `EngineOptions` (fingerprint and input checks, bypassed modes, damaged records).
        stages: the stages this engine's caller journals (an adapter's declared stages); a per-stage
            spec naming another stage is refused. None: any stage.
        roles: the adapter's declarations of its stages (`stepjournal.vocabulary.Stage`): a per-stage
            spec giving a record-only stage a policy that may replay is refused here, and a decision to
            serve such a stage's call from the journal is refused when made (`StageRoleError`).
        **option_keywords: each option as its own keyword (``verify_input=True`` ...), the same as
            passing them in `options`; not together with it.

    Attributes:
        journal, policy, options: as given. The options' names also read as attributes
            (``engine.bypass_modes`` is ``engine.options.bypass_modes``).

    Raises:
        TypeError: `policy` is not a policy; a keyword is not an option; `options` and option
            keywords were both given.
        OptionError: an option has a value it does not take.
        SpecError: `policy` is a spec that does not parse, or a per-stage spec naming an unknown stage.
        StageRoleError: a per-stage spec gives a stage `roles` declares record-only a policy that may replay.
    """

    def __init__(
        self,
        journal: Journal,
        policy: Union[Policy, str, Mapping[str, Any]],
        *,
        options: Optional[EngineOptions] = None,
        stages: Optional[Sequence[str]] = None,
        roles: Sequence[Stage] = (),
        **option_keywords: Any,
    ) -> None:
        self.options = EngineOptions.from_keywords(options, option_keywords, where="Engine")
        if isinstance(policy, (str, Mapping)) or stages is not None:
            policy = parse_stages(policy, stages=stages)
        if not is_policy(policy):
            raise TypeError(
                f"policy {policy!r} is not a policy: pass a spec string such as 'cache', or an object with a "
                "str `name` and a `decide(ctx, view)` method"
            )
        check_stage_roles(policy, roles)
        self.journal = journal
        self.policy: Policy = policy
        self.roles: Tuple[Stage, ...] = tuple(roles)
        self._lock = threading.Lock()
        # Calls this session has started per (run, mode, stage, step): the number of call events this
        # session has journaled for the key, plus calls in flight. A new session starts from zero.
        self._calls: Dict[Tuple[str, str, str, int], int] = {}

    def __getattr__(self, name: str) -> Any:
        # Each option reads as an attribute of the engine too: `engine.miss` is `engine.options.miss`.
        if name in EngineOptions.names():
            return getattr(self.options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- generation index ----------------------------------------------------------------------------
    def next_gen_index(self, step: int, mode: str = DEFAULT_MODE, stage: str = DEFAULT_STAGE) -> int:
        """Claim the next call index of `step` (in `stage`) in this session (thread-safe)."""
        key = (self.journal.run, mode, stage, step)
        with self._lock:
            index = self._calls.get(key, 0)
            self._calls[key] = index + 1
            return index

    # -- one call --------------------------------------------------------------------------------------
    def begin(
        self,
        step: int,
        *,
        mode: str = DEFAULT_MODE,
        gen_index: Optional[int] = None,
        input_digest: Optional[str] = None,
        stage: str = DEFAULT_STAGE,
        weights_version: Any = None,
        decide_with: Optional[Policy] = None,
    ) -> PendingCall:
        """Decide a call; replays are served (loaded and journaled) here.

        Args:
            stage: the call's stage (``"generate"`` by default; ``"reward"``, ``"ref_log_prob"`` ...).
            weights_version: for a model-dependent stage, what identifies the weights (a JSON scalar);
                folded into the input digest (`stage_input_digest`).
            decide_with: a policy that decides this one call instead of the engine's (the tool calls'
                `ToolPolicy`, made per call with its facts); the checks and journaling are the same.

        Raises:
            ReplayRefusedError: the policy refused, or a replay failed a validity check; journaled.
            StageInputMismatchError: a stage other than ``"generate"`` would replay a record made on
                another input (unless ``on_stage_input_mismatch="generate"``); journaled.
            TypeError: a call of a stage other than ``"generate"`` came without its input digest.
        """
        check_stage(stage)  # before anything runs: a bad name would otherwise fail once the call is done
        bypassed = mode in self.options.bypass_modes
        if stage != DEFAULT_STAGE and input_digest is None and not bypassed:
            raise TypeError(
                f"a call of stage {stage!r} (step {step}) needs its input digest, so that a replay is checked "
                "against the input it was recorded on: pass input= or input_digest= (or hooks.prepare_input)"
            )
        if gen_index is None:
            gen_index = self.next_gen_index(step, mode, stage)
        input_digest = stage_input_digest(input_digest, weights_version)
        ctx = CallContext(
            run=self.journal.run, step=step, gen_index=gen_index, mode=mode, input_digest=input_digest, stage=stage
        )
        if bypassed:
            decision: Decision = BypassCall(reason=f"mode {mode!r} is bypassed", policy="bypass")
        else:
            deciding = self.policy if decide_with is None else decide_with
            try:
                decision = deciding.decide(ctx, JournalView(self.journal, mode=mode, stage=stage))
            except IntegrityError as exc:  # the view read a damaged record
                decision = self._damaged(ctx, deciding.name, exc)
        policy = decision.policy or (self.policy if decide_with is None else decide_with).name
        if isinstance(decision, (ServeRecorded, RefuseCall)) and role_of(stage, self.roles) is StageRole.RECORD_ONLY:
            raise StageRoleError(stage=stage, role=StageRole.RECORD_ONLY, policy=policy)
        if isinstance(decision, ServeRecorded):
            try:
                decision = self._check_replay(ctx, decision, policy)
            except IntegrityError as exc:
                decision = self._damaged(ctx, policy, exc)
        if isinstance(decision, RefuseCall):
            self.journal.record_refusal(
                step, gen_index=gen_index, mode=mode, policy=policy, reason=decision.reason, stage=stage
            )
            log.warning("call_refused", step=step, gen_index=gen_index, policy=policy, reason=decision.reason)
            raise ReplayMissError(decision.reason, step=step, gen_index=gen_index)
        if isinstance(decision, ServeRecorded):
            started = time.perf_counter()
            try:
                value = self.journal.load_output(decision.source)
            except IntegrityError as exc:  # PayloadDecodeError too
                return PendingCall(ctx, self._damaged(ctx, policy, exc), policy)
            seq = self.journal.record_replay(
                step,
                decision.source,
                gen_index=gen_index,
                mode=mode,
                input_digest=input_digest,
                policy=policy,
                reason=decision.reason,
                duration_s=time.perf_counter() - started,
                stage=stage,
            )
            log.info(
                "replayed", step=step, gen_index=gen_index, stage=stage, source_step=decision.source.step,
                source_gen_index=decision.source.gen_index, policy=policy,
            )
            outcome = Outcome(value=value, action=Action.REPLAYED, ctx=ctx, source=decision.source, seq=seq)
            return PendingCall(ctx, decision, policy, outcome)
        return PendingCall(ctx, decision, policy)

    def finish(self, call: PendingCall, output: Any, *, input: Any = None, duration_s: float = 0.0) -> Outcome:
        """Journal a call whose generator ran: record (and store) its output, or mark it bypassed.

        An output (or input) that cannot be stored is not an error here: the generator's work is
        not thrown away. The call is journaled as generated, not stored, with why in its event's
        `not_stored` field and, in words, its reason (the audit shows both, and `lookup` and a replay
        treat the step as not recorded), a warning is logged, and the outcome carries the output
        (``outcome.source.event.output`` is None).
        """
        ctx, decision = call.ctx, call.decision
        if call.outcome is not None:
            raise ValueError(f"call at step {ctx.step} index {ctx.gen_index} was replayed; nothing to finish")
        if isinstance(decision, BypassCall):
            seq = self.journal.record_bypass(
                ctx.step, gen_index=ctx.gen_index, mode=ctx.mode, policy=call.policy,
                reason=decision.reason, duration_s=duration_s, stage=ctx.stage,
            )
            return Outcome(value=output, action=Action.BYPASSED, ctx=ctx, source=None, seq=seq)
        return self._generated(call, output, self.journal.record(**self._record_of(call, output, input, duration_s)))

    async def _afinish(self, call: PendingCall, output: Any, input: Any, duration_s: float,
                       run_blocking: Callable[[Callable[[], Any]], Awaitable[Any]]) -> Outcome:
        """`finish` for `acall`: the encoding runs through `run_blocking`, and a generated call's record is awaited
        (`Journal.arecord`), so waiting for its durable commit holds neither the event loop nor a thread."""
        if not isinstance(call.decision, GenerateCall):
            return await run_blocking(functools.partial(self.finish, call, output, input=input, duration_s=duration_s))
        record = await run_blocking(functools.partial(self._record_of, call, output, input, duration_s))
        return self._generated(call, output, await self.journal.arecord(**record))

    def _record_of(self, call: PendingCall, output: Any, input: Any, duration_s: float) -> Dict[str, Any]:
        """A generated call's record: `Journal.record`'s keywords, its payloads prepared (encoded, hashed)."""
        ctx, decision = call.ctx, call.decision
        assert isinstance(decision, GenerateCall)
        stored_output, stored_input, left_out = self._prepared(ctx, output, input, decision.store)
        # Why is data (the event's `not_stored`, which a view reads); the reason repeats it for people.
        not_stored = left_out or None
        if not decision.store:
            not_stored = f"its policy stored nothing ({decision.reason})" + (f"; {left_out}" if left_out else "")
        reason = decision.reason if not left_out else f"{decision.reason}; generated, not stored: {left_out}"
        return dict(step=ctx.step, output=stored_output, gen_index=ctx.gen_index, mode=ctx.mode, input=stored_input,
                    input_digest=ctx.input_digest, store_input=decision.store,
                    store_output=stored_output is not None, duration_s=duration_s, policy=call.policy, reason=reason,
                    stage=ctx.stage, not_stored=not_stored)

    def _generated(self, call: PendingCall, output: Any, recorded: RecordedGeneration) -> Outcome:
        ctx = call.ctx
        log.info("generated", step=ctx.step, gen_index=ctx.gen_index, stage=ctx.stage,
                 stored=recorded.event.output is not None, policy=call.policy)
        return Outcome(value=output, action=Action.GENERATED, ctx=ctx, source=recorded, seq=recorded.seq)

    def _prepared(self, ctx: CallContext, output: Any, input: Any, store: bool) -> Tuple[Any, Any, str]:
        """Encode a generated call's output and input for storage; what cannot be encoded is left out.

        The generator has already run (minutes of GPU time, perhaps): a value the codec refuses (or a
        registered codec that fails) must not throw the output away. The call is journaled as
        generated but not stored, with the reason, and the caller still gets its output.

        Returns:
            The prepared output (None: not stored), the prepared input (None: none stored), and why
            something was left out ("" when nothing was).
        """
        missed = []
        prepared_output = prepared_input = None
        if store:
            try:
                prepared_output = self.journal.prepare(output, copy=False)  # recorded right after
            except Exception as exc:  # UnsupportedValueError, or a registered codec's own failure
                missed.append(("output", exc))
        if input is not None and (store or ctx.input_digest is None):
            try:
                prepared_input = self.journal.prepare(input, store=store)
            except Exception as exc:
                missed.append(("input", exc))
        # A compressing journal packs a payload on its first use (`ref`): here, so that `acall` packs it in
        # `run_blocking` with its encoding, not in the event loop that then awaits the record.
        for prepared in (prepared_output, prepared_input if store else None):
            if prepared is not None:
                prepared.ref  # noqa: B018 (read to pack it now)
        said = [(what, _clipped(f"{type(exc).__name__}: {exc}")) for what, exc in missed]
        why = "; ".join(f"the {what} cannot be stored ({text})" for what, text in said)
        for what, text in said:
            log.warning(
                f"{what}_not_stored", step=ctx.step, gen_index=ctx.gen_index, mode=ctx.mode, error=text,
                hint=f"the caller got the {what}; the journal shows the call as generated, not stored",
            )
        return prepared_output, prepared_input, why

    def call(
        self,
        step: int,
        generate: Callable[[], Any],
        *,
        mode: str = DEFAULT_MODE,
        input: Any = None,
        input_digest: Optional[str] = None,
        gen_index: Optional[int] = None,
        hooks: Optional[CallHooks] = None,
        stage: str = DEFAULT_STAGE,
        weights_version: Any = None,
        decide_with: Optional[Policy] = None,
    ) -> Outcome:
        """Decide one call, run `generate()` if needed, journal it, and return the outcome.

        Args:
            step: the train step.
            generate: runs the generator and returns its output.
            mode: the call's mode (``"train"``, ``"validate"`` ...).
            input: what to store as the call's input (a value or a `PreparedPayload`), or None.
            input_digest: the input's digest (checked by `verify_input`), or None.
            gen_index: the call's index within its step (default: the next one of this session).
            hooks: how an adapter's values are stored and given back (`CallHooks`).
            stage: the call's stage (default ``"generate"``): each stage has its own records, call
                indices and (with a per-stage spec) policy. A stage other than ``"generate"`` needs the
                call's input (or its digest), and never replays onto another input.
            weights_version: for a model-dependent stage (log-probs, values ...), what identifies the
                weights it ran with (a JSON scalar such as the global step); part of the input digest.
            decide_with: a policy that decides this call instead of the engine's (see `begin`).
        """
        sequence = self._sequence(
            step, mode, gen_index, input, input_digest, hooks or _NO_HOOKS, stage, weights_version, decide_with
        )
        effect = next(sequence)
        while True:
            result = generate() if effect is _GENERATE else effect()
            try:
                effect = sequence.send(result)
            except StopIteration as done:
                return done.value

    async def acall(
        self,
        step: int,
        generate: Callable[[], Awaitable[Any]],
        *,
        mode: str = DEFAULT_MODE,
        input: Any = None,
        input_digest: Optional[str] = None,
        gen_index: Optional[int] = None,
        hooks: Optional[CallHooks] = None,
        stage: str = DEFAULT_STAGE,
        weights_version: Any = None,
        decide_with: Optional[Policy] = None,
    ) -> Outcome:
        """`call` for an async generator function: awaits `generate()` when the call must run.

        The journal I/O runs through ``hooks.run_blocking`` (default: inline).
        """
        hooks = hooks or _NO_HOOKS
        sequence = self._sequence(step, mode, gen_index, input, input_digest, hooks, stage, weights_version,
                                  decide_with)
        effect = next(sequence)
        while True:
            result: Any
            if effect is _GENERATE:
                result = generate()
                if inspect.isawaitable(result):
                    result = await result
            elif isinstance(effect, _Finish):
                result = await self._afinish(effect.call, effect.output, effect.input, effect.duration_s,
                                             hooks.run_blocking)
            else:
                result = await hooks.run_blocking(effect)
            try:
                effect = sequence.send(result)
            except StopIteration as done:
                return done.value

    def _sequence(
        self,
        step: int,
        mode: str,
        gen_index: Optional[int],
        input: Any,
        input_digest: Optional[str],
        hooks: CallHooks,
        stage: str = DEFAULT_STAGE,
        weights_version: Any = None,
        decide_with: Optional[Policy] = None,
    ) -> Generator[Any, Any, Outcome]:
        """The call sequence, written once for `call` and `acall`: decide, time and run the generator, journal.

        It does no I/O itself: it yields `_GENERATE` when the generator must run, and otherwise a
        function doing journal I/O; the driver (`call` inline, `acall` through ``run_blocking`` and
        ``await``) runs what was yielded and sends the result back.
        """
        if hooks.prepare_input is not None and (input is not None or input_digest is not None):
            raise TypeError("pass the call's input either as input=/input_digest= or through hooks.prepare_input")

        def decide() -> Tuple[PendingCall, Any]:
            given, digest = input, input_digest
            if hooks.prepare_input is not None and mode not in self.options.bypass_modes:
                given, digest = hooks.prepare_input()  # a bypassed call stores no input
            if digest is None and given is not None and stage != DEFAULT_STAGE:
                # A stage's record is checked against its input: the digest is needed, not optional.
                given = self.journal.prepare(given)
                digest = given.digest
            pending = self.begin(
                step, mode=mode, gen_index=gen_index, input_digest=digest, stage=stage,
                weights_version=weights_version, decide_with=decide_with,
            )
            return pending, given

        pending, input = yield decide
        if pending.outcome is not None:
            if hooks.from_stored is _served_value:
                return pending.outcome
            return attrs.evolve(pending.outcome, value=hooks.from_stored(pending.outcome))
        started = time.perf_counter()
        output = yield _GENERATE
        duration = time.perf_counter() - started
        stored = hooks.to_stored(output)
        outcome = yield _Finish(self, pending, stored, input, duration)
        return outcome if stored is output else attrs.evolve(outcome, value=output)
