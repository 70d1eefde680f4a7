"""The conformance suite every policy passes (offered as `stepjournal.policies.testing`), a third party's too.

A plain class, as the payload stores' suite is (`stepjournal.testing`): it imports without pytest; pytest runs a
``Test...`` subclass, and `stepjournal.testing.run_conformance` runs the same ``test_*`` methods without it.
Every decision is asked of the real `JournalView` over `MemoryJournal`s: no LMDB, as a pure decision needs none.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Iterator, List, Sequence, Tuple

from stepjournal import DEFAULT_RUN
from stepjournal.errors import StepJournalError

from ._base import BypassCall, CallContext, GenerateCall, JournalView, RefuseCall, ServeRecorded, is_policy
from ._memory_journal import MemoryJournal, memory_view

__all__ = ["PolicyConformance"]

DECISIONS = (GenerateCall, ServeRecorded, RefuseCall, BypassCall)
# What a pure decision never does: the audit events of I/O (PEP 578).
_IO_EVENTS = ("open", "socket.", "subprocess.", "os.system", "os.exec", "os.spawn", "os.fork", "os.remove",
              "os.rename", "os.mkdir", "os.rmdir", "os.truncate", "shutil.", "urllib.", "http.")
_deciding = threading.local()
_hooked = False


def _refuse_io(event: str, args: Tuple[Any, ...]) -> None:
    if getattr(_deciding, "active", False) and event.startswith(_IO_EVENTS):
        raise AssertionError(f"the policy did I/O while deciding ({event}{args!r}): a policy is a pure decision")


@contextlib.contextmanager
def _no_io() -> Iterator[None]:
    """Inside it, on this thread, I/O is an `AssertionError` (through an audit hook, added once per process)."""
    global _hooked
    if not _hooked:
        sys.addaudithook(_refuse_io)
        _hooked = True
    _deciding.active = True
    try:
        yield
    finally:
        _deciding.active = False


class PolicyConformance:
    """Behaviour every policy promises: a pure, deterministic decision of a declared type. Subclass it and
    define `make_policy`; `bad_configs` (ways to build the policy wrongly) and `journals` (what it decides
    against) have defaults."""

    def make_policy(self) -> Any:
        """A fresh policy (a `Policy`: a ``name`` and a ``decide(ctx, view)``)."""
        raise NotImplementedError("define make_policy() in the subclass: it returns the policy under test")

    def bad_configs(self) -> Sequence[Callable[[], Any]]:
        """Calls that build the policy from a bad config; each must raise a typed error (a `StepJournalError`)."""
        return ()

    def journals(self) -> List[MemoryJournal]:
        """What the policy decides against: empty, dense (steps 1-4, two calls each), sparse (1, 5, 9), with a
        call generated but not stored, and with a released record."""
        empty = MemoryJournal()
        dense = MemoryJournal()
        for step in range(1, 5):
            for index in range(2):
                dense.record(step, index)
        dense.record(2, mode="validate")
        sparse = MemoryJournal()
        for step in (1, 5, 9):
            sparse.record(step)
        sparse.record(7, stored=False, reason="cache: generate and store; generated, not stored: a lambda")
        released = MemoryJournal()
        released.release(released.record(3))
        released.record(4)
        return [empty, dense, sparse, released]

    def contexts(self) -> List[CallContext]:
        """The calls asked about: steps 0-10, indices 0-2, in train and validate."""
        return [CallContext(run=DEFAULT_RUN, step=step, gen_index=index, mode=mode)
                for mode in ("train", "validate") for step in range(11) for index in range(3)]

    def cases(self) -> Iterator[Tuple[CallContext, JournalView]]:
        """Each context against each journal, through a view of the context's mode and stage."""
        for journal in self.journals():
            for ctx in self.contexts():
                yield ctx, memory_view(journal, mode=ctx.mode, stage=ctx.stage, run=ctx.run)


    # -- the tests --------------------------------------------------------------------------------
    def test_the_policy_has_a_name_and_a_decide(self) -> None:
        policy = self.make_policy()
        assert is_policy(policy), f"{policy!r} has no string `name` and callable `decide`"
        assert policy.name, "a policy's name is how the audit names it: it is not empty"

    def test_every_decision_is_one_of_the_declared_types_with_a_reason(self) -> None:
        policy = self.make_policy()
        for ctx, view in self.cases():
            decision = policy.decide(ctx, view)
            assert isinstance(decision, DECISIONS), f"{ctx}: {decision!r} is none of {[d.__name__ for d in DECISIONS]}"
            assert isinstance(decision.reason, str) and decision.reason, f"{ctx}: {decision!r} gives no reason"

    def test_the_same_context_and_view_give_the_same_decision(self) -> None:
        policy, again = self.make_policy(), self.make_policy()
        for ctx, view in self.cases():
            first = policy.decide(ctx, view)
            assert policy.decide(ctx, view) == first, f"{ctx}: a second decision differs from the first"
            assert again.decide(ctx, view) == first, f"{ctx}: a second policy of the same config decides otherwise"

    def test_deciding_writes_nothing_and_does_no_io(self) -> None:
        policy = self.make_policy()
        for journal in self.journals():
            before = list(journal.events())
            for ctx in self.contexts():
                with _no_io():  # an open file or socket, a subprocess: an AssertionError
                    policy.decide(ctx, memory_view(journal, mode=ctx.mode, stage=ctx.stage))
            assert list(journal.events()) == before, "deciding changed the journal it reads"

    def test_a_served_record_is_one_the_view_serves_for_the_calls_mode_and_stage(self) -> None:
        policy = self.make_policy()
        for ctx, view in self.cases():
            decision = policy.decide(ctx, view)
            if isinstance(decision, ServeRecorded):
                source = decision.source
                assert view.lookup(source.step, source.gen_index) == source, f"{ctx}: serves {source}, not in its view"
                assert (source.event.mode, source.event.stage) == (ctx.mode, ctx.stage)

    def test_a_bad_config_is_refused_with_a_typed_error(self) -> None:
        for build in self.bad_configs():
            try:
                made = build()
            except StepJournalError:
                continue
            raise AssertionError(f"{build!r} built {made!r}: a bad config is refused with a StepJournalError")

