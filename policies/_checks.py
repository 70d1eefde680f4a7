"""The validity checks every replay passes, whatever the policy: fingerprint, input digest, stage input, damage.

A mixin of `Engine` (as `Recording` is of `Journal`): the engine decides the call, these methods
check a `ServeRecorded` decision (or a damaged record) and journal a refusal when one is due.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import attrs

from stepjournal import Journal
from stepjournal.errors import IntegrityError
from stepjournal.tools import check_fingerprint, digest_hex
from stepjournal.vocabulary import DEFAULT_STAGE
from stepjournal.log import get_logger

from ._base import CallContext, Decision, GenerateCall, Policy, RefuseCall, ServeRecorded
from ._errors import FingerprintMismatchError, InputMismatchError, StageInputMismatchError
from ._options import EngineOptions
from ._without_record import WithoutRecord

__all__ = ["ReplayChecks", "stage_input_digest", "PROMPTS_DIFFER"]

# How a same-step refusal for other prompts names its cause (`EngineOptions.check_prompts`).
PROMPTS_DIFFER = "the prompts differ from the ones recorded"

log = get_logger("stepjournal.policies._engine")


def stage_input_digest(input_digest: Optional[str], weights_version: Any = None) -> Optional[str]:
    """The digest a call is checked by: its input's digest, with the weights version folded in when given.

    Args:
        input_digest: the digest of the call's input (e.g. ``journal.prepare(batch).digest``).
        weights_version: what identifies the weights a model-dependent stage ran with (a JSON
            scalar: the global step, a checkpoint name ...); None: not model-dependent.

    Raises:
        InvalidKeyError: `weights_version` is not a JSON scalar (str, int, float, bool).
    """
    if weights_version is None or input_digest is None:
        return input_digest
    check_fingerprint({"weights_version": weights_version})
    text = json.dumps(["stepjournal-stage-input", input_digest, weights_version], sort_keys=True)
    return digest_hex(text.encode())


class ReplayChecks:
    """The checks of `Engine`; the engine provides `journal`, `policy` and `options`."""

    journal: Journal
    policy: Policy
    options: EngineOptions

    def _damaged(self, ctx: CallContext, policy: str, exc: IntegrityError) -> GenerateCall:
        """A replay met a damaged record: journal a refusal and re-raise, or decide to regenerate."""
        where = f"step {ctx.step} index {ctx.gen_index}"
        log.warning("replay_found_damage", step=ctx.step, gen_index=ctx.gen_index, on_corrupt=self.options.on_corrupt,
                    error=str(exc))
        if self.options.on_corrupt == "error":
            self.journal.record_refusal(
                ctx.step, gen_index=ctx.gen_index, mode=ctx.mode, policy=policy,
                reason=f"refused to replay {where}: the recorded call is damaged ({exc}); "
                "run `stepjournal verify`, or pass on_corrupt='regenerate' to generate it again",
                stage=ctx.stage,
            )
            raise exc
        return GenerateCall(reason=f"the record to replay at {where} is damaged ({exc}); regenerated", policy=policy)

    def _check_replay(self, ctx: CallContext, decision: ServeRecorded, policy: str) -> Decision:
        """Check a replay in order: the fingerprint first, then the input (stage input, same-step prompts, digest).

        The configuration is checked first so that a changed setting is what a refusal names, not the
        prompts that changed because of it.
        """
        decision = self._check_fingerprint(ctx, decision, policy)
        source = decision.source
        if ctx.stage != DEFAULT_STAGE:
            return self._check_stage_input(ctx, decision, policy)
        if (
            self.options.check_prompts == "same_step"
            and (source.step, source.gen_index) == (ctx.step, ctx.gen_index)
            and source.event.input_digest is not None
            and ctx.input_digest is not None
            and source.event.input_digest != ctx.input_digest
        ):
            return self._same_step_prompts_differ(ctx, decision, policy)
        if self.options.verify_input and ctx.input_digest != source.event.input_digest:
            why = (
                f"input digest {str(ctx.input_digest)[:16]} differs from the one recorded at step {source.step} "
                f"index {source.gen_index} ({str(source.event.input_digest)[:16]})"
            )
            if self.options.on_input_mismatch == "error":
                reason = f"refused to replay: {why}"
                self.journal.record_refusal(
                    ctx.step, gen_index=ctx.gen_index, mode=ctx.mode, policy=policy, reason=reason
                )
                raise InputMismatchError(reason, step=ctx.step, gen_index=ctx.gen_index)
            return GenerateCall(reason=f"{why}; regenerated", policy=policy)
        return decision

    def _check_fingerprint(self, ctx: CallContext, decision: ServeRecorded, policy: str) -> ServeRecorded:
        """Refuse (or, when allowed, note) a replay whose record was made under another fingerprint.

        A record imported from another tool (``imported_from``) carries only the keys that tool's
        dumps spell; a key it lacks is unknown, not different: it is not compared, and the replay's
        reason lists it.
        """
        source = decision.source
        recorded_fp = self.journal.session_fingerprint(source.event.session)
        current_fp = self.journal.fingerprint
        unknown = sorted(set(current_fp) - set(recorded_fp)) if source.event.imported_from else []
        differences = {
            key: (recorded_fp.get(key), current_fp.get(key))
            for key in sorted(set(recorded_fp) | set(current_fp))
            if key not in unknown and recorded_fp.get(key) != current_fp.get(key)
        }
        if differences:
            listed = ", ".join(f"{k}: recorded {a!r}, now {b!r}" for k, (a, b) in differences.items())
            if not self.options.allow_fingerprint_mismatch:
                reason = (
                    f"refused to replay step {source.step} index {source.gen_index}: the fingerprint differs "
                    f"({listed}); pass allow_fingerprint_mismatch=True to replay anyway"
                )
                self.journal.record_refusal(
                    ctx.step, gen_index=ctx.gen_index, mode=ctx.mode, policy=policy, reason=reason, stage=ctx.stage
                )
                log.warning("replay_refused_fingerprint", step=ctx.step, differences=sorted(differences))
                raise FingerprintMismatchError(
                    reason, step=ctx.step, gen_index=ctx.gen_index, differences=differences
                )
            decision = attrs.evolve(decision, reason=f"{decision.reason}; fingerprint differs ({listed}), allowed")
        if unknown:
            log.info("replay_fingerprint_unknown", step=ctx.step, source_step=source.step, keys=unknown,
                     imported_from=source.event.imported_from)
            decision = attrs.evolve(
                decision,
                reason=f"{decision.reason}; not checked, unknown to the imported record: {', '.join(unknown)}",
            )
        return decision

    def _same_step_prompts_differ(self, ctx: CallContext, decision: ServeRecorded, policy: str) -> Decision:
        """The call's own record was made for other prompts: decide the call as if it were not recorded."""
        source = decision.source
        why = (
            f"{PROMPTS_DIFFER} at step {ctx.step} index {ctx.gen_index} (input digest {str(ctx.input_digest)[:16]}, "
            f"recorded {str(source.event.input_digest)[:16]})"
        )
        view = WithoutRecord(self.journal, ctx.step, ctx.gen_index, mode=ctx.mode, stage=ctx.stage)
        again = self.policy.decide(ctx, view)
        if isinstance(again, ServeRecorded):  # another step's record (repeat, nearest ...): its own checks
            return self._check_replay(ctx, again, again.policy or policy)
        if isinstance(again, GenerateCall):
            return GenerateCall(reason=f"{why}; generated instead", store=again.store, policy=again.policy or policy)
        if isinstance(again, RefuseCall):
            reason = (
                f"refused to replay step {ctx.step} index {ctx.gen_index}: {why}, "
                f"and policy {again.policy or policy!r} "
                "does not generate in their place; replay into a trainer with the recorded dataset and order, "
                "or pass check_prompts='off' to serve the record anyway"
            )
            self.journal.record_refusal(
                ctx.step, gen_index=ctx.gen_index, mode=ctx.mode, policy=again.policy or policy, reason=reason,
                stage=ctx.stage,
            )
            log.warning("replay_refused_prompts", step=ctx.step, gen_index=ctx.gen_index)
            raise InputMismatchError(reason, step=ctx.step, gen_index=ctx.gen_index)
        return again

    def _check_stage_input(self, ctx: CallContext, decision: ServeRecorded, policy: str) -> Decision:
        """A stage's record replays only onto the input (and weights version) it was computed on."""
        source = decision.source
        recorded, current = source.event.input_digest, ctx.input_digest
        if recorded == current:
            return decision
        why = (
            f"the {ctx.stage!r} record of step {source.step} index {source.gen_index} was computed on input "
            f"{recorded}, this call's input is {current}"
        )
        if self.options.on_stage_input_mismatch == "generate":
            log.info("stage_input_changed", step=ctx.step, stage=ctx.stage, recorded=recorded, current=current)
            return GenerateCall(reason=f"{why}; computed again", policy=policy)
        reason = (
            f"refused to replay stage {ctx.stage!r} at step {ctx.step} index {ctx.gen_index}: {why} (a different "
            "batch or weights version); record this stage again (policy 'dump' for it), or pass "
            "on_stage_input_mismatch='generate' to compute it again on a mismatch"
        )
        self.journal.record_refusal(
            ctx.step, gen_index=ctx.gen_index, mode=ctx.mode, policy=policy, reason=reason, stage=ctx.stage
        )
        log.warning("replay_refused_stage_input", step=ctx.step, stage=ctx.stage, recorded=recorded, current=current)
        raise StageInputMismatchError(
            reason, step=ctx.step, gen_index=ctx.gen_index, stage=ctx.stage, recorded_digest=recorded,
            current_digest=current,
        )

