"""Recording calls: the writing half of `Journal` (a base class the facade inherits).

Each method validates the call, prepares its payloads (`_payloads`) and hands one event with its
payloads to `Journal._append`, which commits them through the payload store and the event log.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from .base._errors import JournalError
from .events._events import CallBypassed, CallRefused, Event, GenerationRecorded, ReplayServed
from .events._keys import DEFAULT_STAGE
from .events._keys import check_key as _check_key
from .events._keys import check_step as _check_step
from .base._log import get_logger
from .payloads._payloads import PreparedPayload, prepare_payload
from .index._projections import RecordedGeneration

__all__ = ["Recording"]

log = get_logger("stepjournal._journal")


class Recording:
    """The record_* methods of `Journal`; the facade provides the attributes used here."""

    path: str
    run: str
    compression: Optional[str]
    session: Optional[str]
    _registry: Any

    def _live(self) -> Any:  # pragma: no cover - provided by Journal
        raise NotImplementedError

    def _append(self, events: List[Event], payloads: List[Tuple[bytes, Any]]) -> List[int]:  # pragma: no cover
        raise NotImplementedError

    def prepare(self, value: Any, *, store: bool = True, copy: bool = True) -> PreparedPayload:
        """Encode and hash a value for storage, without writing anything.

        Compression (when the journal compresses) waits until the payload is stored or its `ref` is
        asked for, so a value only needed for its `digest` is never compressed.

        Args:
            value: any encodable value (a `PreparedPayload` is returned as it is).
            store: False keeps only the digest (the encoding is dropped): for an input that is
                compared, never stored.
            copy: False keeps the encoding as pieces that are the tensors' own memory where they are laid
                out in C order (no copy of them): for a value recorded right away, which must not change
                until then (`record` and the policies' engine prepare so). A payload large enough to be
                a file is written while it is hashed; dropped without being recorded, its file is removed.

        Raises:
            UnsupportedValueError: the value (or a part of it, named by its path) cannot be stored.
        """
        if isinstance(value, PreparedPayload):
            return value
        # Not copied: a large payload's file is written while it is hashed (its store's `stage`).
        stage = self._payloads.stage if not copy and self._payloads.stages_writes else None
        return prepare_payload(value, registry=self._registry, compression=self.compression, store=store, copy=copy,
                               stage=stage)

    def record(
        self,
        step: int,
        output: Any,
        *,
        gen_index: int = 0,
        mode: str = "train",
        input: Any = None,
        store_input: bool = True,
        input_digest: Optional[str] = None,
        store_output: bool = True,
        duration_s: float = 0.0,
        policy: str = "manual",
        reason: str = "recorded",
        imported_from: Optional[str] = None,
        stage: str = DEFAULT_STAGE,
    ) -> RecordedGeneration:
        """Record one generate call that ran: its output (and input) payloads and the event, atomically.

        Args:
            step: the train step.
            output: what the call returned (any encodable value, or a `PreparedPayload`).
            gen_index: which call within the step (0 for the first).
            mode: ``"train"``, ``"validate"`` ...
            input: what the call was given (a value or a `PreparedPayload`); stored when `store_input`.
            input_digest: digest identifying the input; computed from `input` when not given.
            store_output: False journals the call without storing its output (passthrough).
            duration_s: how long the call took.
            policy, reason: which policy decided to generate and why (for the audit).
            imported_from: where an imported record came from (e.g. ``"verl:/dumps/genstep_000003"``).
            stage: which stage of the step the call belongs to (``"generate"``, ``"reward"`` ...).

        Returns:
            The recorded generation (its sequence number and event).
        """
        fields = self._call_fields(step, gen_index, mode, stage)  # validate before the costly encoding
        payloads: List[Tuple[bytes, Any]] = []
        out_ref = in_ref = None
        if store_output:
            out = self.prepare(output, copy=False)  # stored below, before the caller gets control back
            out_ref = out.ref
            payloads.append((out.key, out.blob))
        if input is not None and (store_input or input_digest is None):
            # An input kept only for its digest is neither stored nor compressed.
            inp = self.prepare(input, store=store_input)
            input_digest = input_digest or inp.digest
            if store_input:
                in_ref = inp.ref
                payloads.append((inp.key, inp.blob))
        event = GenerationRecorded(
            **fields,
            input_digest=input_digest,
            output=out_ref,
            input=in_ref,
            duration_s=float(duration_s),
            policy=policy,
            reason=reason,
            ts=time.time(),
            imported_from=imported_from,
        )
        (seq,) = self._append([event], payloads)
        log.debug("generation_recorded", step=step, gen_index=gen_index, mode=mode, seq=seq, stored=store_output)
        return RecordedGeneration(seq, event)

    def record_replay(
        self,
        step: int,
        source: RecordedGeneration,
        *,
        gen_index: int = 0,
        mode: str = "train",
        input_digest: Optional[str] = None,
        policy: str = "manual",
        reason: str = "replayed",
        duration_s: float = 0.0,
        stage: str = DEFAULT_STAGE,
    ) -> int:
        """Journal that a call at (stage, step, gen_index) was served from `source`; return the event's seq.

        Raises:
            JournalError: `source` stored no output, or belongs to another stage.
        """
        if source.event.output is None:
            raise JournalError(f"recorded generation #{source.seq} has no stored output to replay")
        if source.event.stage != stage:
            raise JournalError(
                f"recorded call #{source.seq} is of stage {source.event.stage!r}; a call of stage {stage!r} "
                "is served only from its own stage's records"
            )
        event = ReplayServed(
            **self._call_fields(step, gen_index, mode, stage),
            input_digest=input_digest,
            source_seq=source.seq,
            source_run=source.event.run,
            source_step=source.event.step,
            source_gen_index=source.event.gen_index,
            output=source.event.output,
            policy=policy,
            reason=reason,
            ts=time.time(),
            duration_s=float(duration_s),
        )
        (seq,) = self._append([event], [])
        log.debug("replay_served", step=step, gen_index=gen_index, source_step=source.step, seq=seq)
        return seq

    def record_bypass(
        self,
        step: int,
        *,
        gen_index: int = 0,
        mode: str = "validate",
        policy: str = "manual",
        reason: str = "bypassed",
        duration_s: float = 0.0,
        stage: str = DEFAULT_STAGE,
    ) -> int:
        """Journal that a call ran without recording or replay (e.g. validation); return the event's seq."""
        event = CallBypassed(
            **self._call_fields(step, gen_index, mode, stage),
            policy=policy,
            reason=reason,
            ts=time.time(),
            duration_s=float(duration_s),
        )
        return self._append([event], [])[0]

    def record_refusal(
        self,
        step: int,
        *,
        gen_index: int = 0,
        mode: str = "train",
        policy: str = "manual",
        reason: str,
        stage: str = DEFAULT_STAGE,
    ) -> int:
        """Journal that a call was refused with an error (so the audit shows why); return the event's seq."""
        event = CallRefused(
            **self._call_fields(step, gen_index, mode, stage),
            policy=policy,
            reason=reason,
            ts=time.time(),
        )
        return self._append([event], [])[0]

    def _call_fields(self, step: int, gen_index: int, mode: str, stage: str = DEFAULT_STAGE) -> Dict[str, Any]:
        """The validated fields every call event starts with."""
        _check_key(self.run, mode, stage)
        _check_step(step, gen_index)
        return {
            "session": self._session_id(), "run": self.run, "step": step, "gen_index": gen_index, "mode": mode,
            "stage": stage,
        }

    def _session_id(self) -> str:
        self._live()
        if self.session is None:
            raise JournalError(
                f"journal {self.path!r} is open read-only or without a session; open it with "
                "readonly=False and session=True to record"
            )
        return self.session

