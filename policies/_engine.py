"""The engine: asks the policy about each generate call, checks the answer, carries it out, journals it.

Policies decide; the engine does the I/O (loading payloads, recording events) and the validity checks
that apply to every replay (fingerprint, optional input digest). Adapters call `Engine.begin` for a
call, then either take the replayed value or run the generator and hand its output to `finish`.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple

import attrs

from stepjournal._log import get_logger
from stepjournal import IntegrityError, Journal, RecordedGeneration

from ._base import (
    BypassCall,
    CallContext,
    Decision,
    GenerateCall,
    JournalView,
    RefuseCall,
    ServeRecorded,
    is_policy,
)
from ._errors import FingerprintMismatchError, InputMismatchError, ReplayMissError
from ._spec import parse

__all__ = ["Engine", "Outcome", "PendingCall"]

log = get_logger(__name__)


@attrs.frozen
class Outcome:
    """What happened to one generate call.

    Attributes:
        value: what the call returns (generated, or decoded from the journal).
        action: ``"generated"``, ``"replayed"`` or ``"bypassed"``.
        ctx: the call's context (step, generation index ...).
        source: the recorded generation that was served (replays) or written (generated and stored).
        seq: the sequence number of the event that journaled the call.
    """

    value: Any
    action: str
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

    @property
    def must_generate(self) -> bool:
        return self.outcome is None


class Engine:
    """Evaluate a policy for each generate call against a journal, and journal what happened.

    Args:
        journal: the journal (opened for writing) the calls go to.
        policy: a policy object, or a spec string given to `stepjournal.policies.parse`.
        allow_fingerprint_mismatch: replay records made under another fingerprint (journaled in the
            reason). By default such a replay is refused with `FingerprintMismatchError`.
        verify_input: a replay requires the call's input digest to equal the recorded one.
        on_input_mismatch: with `verify_input`, ``"generate"`` regenerates (and stores) on a mismatch,
            ``"error"`` raises `InputMismatchError`. Either way the reason is journaled.
        bypass_modes: modes whose calls skip the policy and are journaled as bypassed (validation).
        on_corrupt: what to do when the record a replay needs is damaged (its event or payload fails
            its checksum or digest): ``"error"`` journals a refusal and raises the `IntegrityError`
            (which names the step); ``"regenerate"`` generates and stores the call instead, with the
            damage in the journaled reason. Storing the regenerated output also repairs a damaged
            payload of identical content.
    """

    def __init__(
        self,
        journal: Journal,
        policy: Any,
        *,
        allow_fingerprint_mismatch: bool = False,
        verify_input: bool = False,
        on_input_mismatch: str = "generate",
        bypass_modes: Tuple[str, ...] = ("validate",),
        on_corrupt: str = "error",
    ) -> None:
        if on_input_mismatch not in ("generate", "error"):
            raise ValueError(f"on_input_mismatch={on_input_mismatch!r}: use 'generate' or 'error'")
        if on_corrupt not in ("error", "regenerate"):
            raise ValueError(f"on_corrupt={on_corrupt!r}: use 'error' or 'regenerate'")
        self.on_corrupt = on_corrupt
        if isinstance(policy, str):
            policy = parse(policy)
        if not is_policy(policy):
            raise TypeError(
                f"policy {policy!r} is not a policy: pass a spec string such as 'cache', or an object with a "
                "str `name` and a `decide(ctx, view)` method"
            )
        self.journal = journal
        self.policy = policy
        self.allow_fingerprint_mismatch = allow_fingerprint_mismatch
        self.verify_input = verify_input
        self.on_input_mismatch = on_input_mismatch
        self.bypass_modes = tuple(bypass_modes)
        self._lock = threading.Lock()
        # Calls this session has started per (run, mode, step): the number of call events this
        # session has journaled for the key, plus calls in flight. A new session starts from zero.
        self._calls: Dict[Tuple[str, str, int], int] = {}

    # -- generation index ----------------------------------------------------------------------------
    def next_gen_index(self, step: int, mode: str = "train") -> int:
        """Claim the next generation index of `step` in this session (thread-safe)."""
        key = (self.journal.run, mode, step)
        with self._lock:
            index = self._calls.get(key, 0)
            self._calls[key] = index + 1
            return index

    # -- one call --------------------------------------------------------------------------------------
    def begin(
        self, step: int, *, mode: str = "train", gen_index: Optional[int] = None, input_digest: Optional[str] = None
    ) -> PendingCall:
        """Decide a call; replays are served (loaded and journaled) here.

        Raises:
            ReplayRefusedError: the policy refused, or a replay failed a validity check; journaled.
        """
        if gen_index is None:
            gen_index = self.next_gen_index(step, mode)
        ctx = CallContext(
            run=self.journal.run, step=step, gen_index=gen_index, mode=mode, input_digest=input_digest
        )
        if mode in self.bypass_modes:
            decision: Decision = BypassCall(reason=f"mode {mode!r} is bypassed", policy="bypass")
        else:
            try:
                decision = self.policy.decide(ctx, JournalView(self.journal, mode=mode))
            except IntegrityError as exc:  # the view read a damaged record
                decision = self._damaged(ctx, self.policy.name, exc)
        policy = decision.policy or self.policy.name
        if isinstance(decision, ServeRecorded):
            try:
                decision = self._check_replay(ctx, decision, policy)
            except IntegrityError as exc:
                decision = self._damaged(ctx, policy, exc)
        if isinstance(decision, RefuseCall):
            self.journal.record_refusal(step, gen_index=gen_index, mode=mode, policy=policy, reason=decision.reason)
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
            )
            log.info(
                "replayed", step=step, gen_index=gen_index, source_step=decision.source.step,
                source_gen_index=decision.source.gen_index, policy=policy,
            )
            outcome = Outcome(value=value, action="replayed", ctx=ctx, source=decision.source, seq=seq)
            return PendingCall(ctx, decision, policy, outcome)
        return PendingCall(ctx, decision, policy)

    def finish(self, call: PendingCall, output: Any, *, input: Any = None, duration_s: float = 0.0) -> Outcome:
        """Journal a call whose generator ran: record (and store) its output, or mark it bypassed."""
        ctx, decision = call.ctx, call.decision
        if call.outcome is not None:
            raise ValueError(f"call at step {ctx.step} index {ctx.gen_index} was replayed; nothing to finish")
        if isinstance(decision, BypassCall):
            seq = self.journal.record_bypass(
                ctx.step, gen_index=ctx.gen_index, mode=ctx.mode, policy=call.policy,
                reason=decision.reason, duration_s=duration_s,
            )
            return Outcome(value=output, action="bypassed", ctx=ctx, source=None, seq=seq)
        assert isinstance(decision, GenerateCall)
        recorded = self.journal.record(
            ctx.step,
            output,
            gen_index=ctx.gen_index,
            mode=ctx.mode,
            input=input,
            input_digest=ctx.input_digest,
            store_input=decision.store,
            store_output=decision.store,
            duration_s=duration_s,
            policy=call.policy,
            reason=decision.reason,
        )
        log.info("generated", step=ctx.step, gen_index=ctx.gen_index, stored=decision.store, policy=call.policy)
        return Outcome(value=output, action="generated", ctx=ctx, source=recorded, seq=recorded.seq)

    def call(
        self,
        step: int,
        generate: Callable[[], Any],
        *,
        mode: str = "train",
        input: Any = None,
        input_digest: Optional[str] = None,
        gen_index: Optional[int] = None,
    ) -> Outcome:
        """Decide one call, run `generate()` if needed, journal it, and return the outcome."""
        pending = self.begin(step, mode=mode, gen_index=gen_index, input_digest=input_digest)
        if pending.outcome is not None:
            return pending.outcome
        started = time.perf_counter()
        output = generate()
        return self.finish(pending, output, input=input, duration_s=time.perf_counter() - started)

    async def acall(
        self,
        step: int,
        generate: Callable[[], Awaitable[Any]],
        *,
        mode: str = "train",
        input: Any = None,
        input_digest: Optional[str] = None,
        gen_index: Optional[int] = None,
    ) -> Outcome:
        """`call` for an async generator function: awaits `generate()` when the call must run."""
        pending = self.begin(step, mode=mode, gen_index=gen_index, input_digest=input_digest)
        if pending.outcome is not None:
            return pending.outcome
        started = time.perf_counter()
        output = await generate()
        return self.finish(pending, output, input=input, duration_s=time.perf_counter() - started)

    # -- validity checks ---------------------------------------------------------------------------------
    def _damaged(self, ctx: CallContext, policy: str, exc: IntegrityError) -> GenerateCall:
        """A replay met a damaged record: journal a refusal and re-raise, or decide to regenerate."""
        where = f"step {ctx.step} index {ctx.gen_index}"
        log.warning("replay_found_damage", step=ctx.step, gen_index=ctx.gen_index, on_corrupt=self.on_corrupt,
                    error=str(exc))
        if self.on_corrupt == "error":
            self.journal.record_refusal(
                ctx.step, gen_index=ctx.gen_index, mode=ctx.mode, policy=policy,
                reason=f"refused to replay {where}: the recorded call is damaged ({exc}); "
                "run `stepjournal verify`, or pass on_corrupt='regenerate' to generate it again",
            )
            raise exc
        return GenerateCall(reason=f"the record to replay at {where} is damaged ({exc}); regenerated", policy=policy)

    def _check_replay(self, ctx: CallContext, decision: ServeRecorded, policy: str) -> Decision:
        source = decision.source
        recorded_fp = self.journal.session_fingerprint(source.event.session)
        current_fp = self.journal.fingerprint
        differences = {
            key: (recorded_fp.get(key), current_fp.get(key))
            for key in sorted(set(recorded_fp) | set(current_fp))
            if recorded_fp.get(key) != current_fp.get(key)
        }
        if differences:
            listed = ", ".join(f"{k}: recorded {a!r}, now {b!r}" for k, (a, b) in differences.items())
            if not self.allow_fingerprint_mismatch:
                reason = (
                    f"refused to replay step {source.step} index {source.gen_index}: the fingerprint differs "
                    f"({listed}); pass allow_fingerprint_mismatch=True to replay anyway"
                )
                self.journal.record_refusal(
                    ctx.step, gen_index=ctx.gen_index, mode=ctx.mode, policy=policy, reason=reason
                )
                log.warning("replay_refused_fingerprint", step=ctx.step, differences=sorted(differences))
                raise FingerprintMismatchError(
                    reason, step=ctx.step, gen_index=ctx.gen_index, differences=differences
                )
            decision = attrs.evolve(decision, reason=f"{decision.reason}; fingerprint differs ({listed}), allowed")
        if self.verify_input and ctx.input_digest != source.event.input_digest:
            why = (
                f"input digest {str(ctx.input_digest)[:16]} differs from the one recorded at step {source.step} "
                f"index {source.gen_index} ({str(source.event.input_digest)[:16]})"
            )
            if self.on_input_mismatch == "error":
                reason = f"refused to replay: {why}"
                self.journal.record_refusal(
                    ctx.step, gen_index=ctx.gen_index, mode=ctx.mode, policy=policy, reason=reason
                )
                raise InputMismatchError(reason, step=ctx.step, gen_index=ctx.gen_index)
            return GenerateCall(reason=f"{why}; regenerated", policy=policy)
        return decision

