"""Policies as pure decisions, tested without LMDB: each built-in passes the shipped policy suite
(`stepjournal.policies.testing`), the suite fails a policy that breaks a promise, in that promise's test, and the
built-ins' decisions are asked of the real `JournalView` over a `MemoryJournal`."""

from __future__ import annotations

import os
import random
import zlib

import attrs
import msgpack
import pytest

from stepjournal.policies import (
    BUILTIN_POLICIES,
    CallContext,
    GenerateCall,
    Nearest,
    RefuseCall,
    Repeat,
    Replay,
    ServeRecorded,
    TOOL_RULES,
    ToolPolicy,
    parse,
)
from stepjournal.events import GenerationRecorded
from stepjournal.events._convert import decode_event, encode_event  # private: the stored bytes of an old event
from stepjournal.errors import SpecError
from stepjournal.policies.testing import MemoryJournal, PolicyConformance, memory_view
from stepjournal.testing import run_conformance

SUITE_SIZE = len([name for name in dir(PolicyConformance) if name.startswith("test_")])


def ctx(step: int, gen_index: int = 0, mode: str = "train") -> CallContext:
    return CallContext(run="default", step=step, gen_index=gen_index, mode=mode)


def suite_of(make, bad=()) -> PolicyConformance:
    """The shipped suite for the policy `make()` builds, with `bad` its bad configs."""

    class Suite(PolicyConformance):
        def make_policy(self):
            return make()

        def bad_configs(self):
            return list(bad)

    return Suite()


@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
def test_each_builtin_policy_passes_the_shipped_policy_suite(name):
    bad = [lambda: parse(f"{name}(no_such_argument=1)"), lambda: parse(f"{name}@5-1")]
    assert run_conformance(suite_of(BUILTIN_POLICIES[name], bad)) == SUITE_SIZE


@attrs.frozen
class _Reads:
    """Decides after reading a file: not pure."""

    name: str = "reads"

    def decide(self, ctx, view):
        with open(os.devnull, "rb"):
            return GenerateCall(reason="read a file")


@attrs.frozen
class _Dice:
    """Decides by a random draw: not deterministic."""

    name: str = "dice"

    def decide(self, ctx, view):
        return GenerateCall(reason=f"drew {random.random()}")


@attrs.frozen
class _Words:
    """Answers with a sentence instead of a decision."""

    name: str = "words"

    def decide(self, ctx, view):
        return "generate"


@attrs.frozen
class _OtherMode:
    """Serves a validate record to a train call."""

    name: str = "other_mode"

    def decide(self, ctx, view):
        journal = MemoryJournal()
        return ServeRecorded(journal.record(1, mode="validate"), reason="another mode's record")


@attrs.frozen
class _Untyped:
    """A policy whose option is checked by attrs' own validator (a bare ValueError)."""

    how: str = attrs.field(default="x", validator=attrs.validators.in_(("x", "y")))
    name: str = "untyped"

    def decide(self, ctx, view):
        return GenerateCall(reason="untyped: generate")


@pytest.mark.parametrize("make, bad, failing", [
    (_Reads, (), "test_deciding_writes_nothing_and_does_no_io"),
    (_Dice, (), "test_the_same_context_and_view_give_the_same_decision"),
    (_Words, (), "test_every_decision_is_one_of_the_declared_types_with_a_reason"),
    (_OtherMode, (), "test_a_served_record_is_one_the_view_serves_for_the_calls_mode_and_stage"),
    # attrs' own validator: a ValueError, not a StepJournalError
    (_Untyped, (lambda: _Untyped(how="bogus"),), "test_a_bad_config_is_refused_with_a_typed_error"),
], ids=["io", "random", "not-a-decision", "other-mode", "untyped-error"])
def test_the_suite_fails_a_policy_that_breaks_one_promise_in_that_promises_test(make, bad, failing):
    with pytest.raises(AssertionError) as caught:
        run_conformance(suite_of(make, bad))
    report = f"\n{caught.value}"
    failed = [name for name in dir(PolicyConformance) if name.startswith("test_") and f"\n{name}: " in report]
    assert failed == [failing], str(caught.value)


# -- the built-ins' decisions, pure -----------------------------------------------------------------------------
def test_nearest_serves_exact_then_earlier_then_later():
    journal = MemoryJournal()
    for step in (5, 10):
        journal.record(step)
    view = memory_view(journal)
    assert [Nearest().decide(ctx(step), view).source.step for step in (5, 7, 12, 2)] == [5, 5, 10, 5]


def test_serving_a_step_recorded_with_fewer_calls_cycles_its_calls():
    journal = MemoryJournal()
    journal.record(1, 0)
    journal.record(1, 1)
    served = [Repeat().decide(ctx(5, index), memory_view(journal)).source for index in range(3)]
    assert [(s.step, s.gen_index) for s in served] == [(1, 0), (1, 1), (1, 0)]


def test_replay_of_a_call_beyond_the_recorded_count_is_refused_naming_it():
    journal = MemoryJournal()
    journal.record(1)
    decision = Replay().decide(ctx(1, 1), memory_view(journal))
    assert isinstance(decision, RefuseCall) and "nothing recorded at step 1 index 1" in decision.reason


def test_replay_of_a_released_record_says_which_release_took_it():
    journal = MemoryJournal()
    journal.release(journal.record(3), rule="keep_last=1")
    decision = Replay().decide(ctx(3), memory_view(journal))
    assert isinstance(decision, RefuseCall)
    assert "its record (event #1) was pruned by event #2" in decision.reason and "rule: keep_last=1" in decision.reason


def test_replay_of_a_call_generated_but_not_stored_says_why_from_the_events_field():
    """The why is the event's `not_stored` field; the reason is words for people and is not parsed."""
    journal = MemoryJournal()
    journal.record(7, stored=False, reason="cache: generate and store", not_stored="output: a lambda")
    decision = Replay().decide(ctx(7), memory_view(journal))
    assert isinstance(decision, RefuseCall)
    assert "generated (event #1) but not stored: output: a lambda" in decision.reason


def test_a_reason_that_looks_like_the_old_marker_is_not_read_as_the_why():
    journal = MemoryJournal()
    journal.record(7, stored=False, reason="mine; generated, not stored: fake", not_stored="output: a lambda")
    decision = Replay().decide(ctx(7), memory_view(journal))
    assert "but not stored: output: a lambda" in decision.reason and "not stored: fake;" not in decision.reason


def test_an_event_written_before_not_stored_existed_is_read_by_its_whole_reason():
    """An event stored without the `not_stored` key (journals before it) decodes with it None; the view then
    quotes its reason, which in those journals ends with the why (docs/journal.md)."""
    written = GenerationRecorded(
        session="s", run="default", step=7, gen_index=0, mode="train", input_digest=None, output=None, input=None,
        duration_s=0.0, policy="cache", reason="cache: miss; generated, not stored: output: a lambda", ts=0.0)
    body = msgpack.unpackb(encode_event(written))
    del body["not_stored"], body["crc32"]  # as the engine wrote it before the field (v2), sealed again
    body["v"] = 2
    body["crc32"] = zlib.crc32(msgpack.packb(body, use_bin_type=True))
    old = decode_event(msgpack.packb(body, use_bin_type=True))
    assert old.not_stored is None
    decision = Replay().decide(ctx(7), memory_view(MemoryJournal([old])))
    assert isinstance(decision, RefuseCall)
    assert ("generated (event #1) but not stored; its reason: cache: miss; generated, not stored: output: a lambda"
            in decision.reason)


def test_a_view_of_one_mode_does_not_serve_anothers_records():
    journal = MemoryJournal()
    journal.record(2, mode="validate")
    assert isinstance(Replay(on_missing="generate").decide(ctx(2), memory_view(journal)), GenerateCall)
    assert Replay().decide(ctx(2, mode="validate"), memory_view(journal, mode="validate")).source.step == 2


def test_an_unknown_on_missing_is_a_spec_error_naming_the_value_and_the_allowed_ones():
    with pytest.raises(SpecError) as info:
        Replay(on_missing="bogus")
    assert (info.value.option, info.value.value, info.value.allowed) == ("on_missing", "bogus", ("error", "generate"))
    assert str(info.value) == "Replay(on_missing='bogus') is not valid: use 'error' or 'generate'"


def test_an_unknown_tool_rule_is_a_spec_error_naming_the_value_and_the_allowed_ones():
    with pytest.raises(SpecError) as info:
        ToolPolicy(rule="bogus", facts=None)
    assert (info.value.option, info.value.value, info.value.allowed) == ("rule", "bogus", TOOL_RULES)
    assert "ToolPolicy(rule='bogus') is not valid: use 'cache', 'replay'," in str(info.value)
