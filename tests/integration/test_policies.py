"""Built-in policies, step ranges, specs and the engine, on real LMDB journals."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from stepjournal import Journal, journaled
from stepjournal.events import CallBypassed, CallRefused, GenerationRecorded, ReplayServed
from stepjournal.policies import (
    BUILTIN_POLICIES,
    Cache,
    ConfigError,
    Engine,
    FingerprintMismatchError,
    InputMismatchError,
    JournalView,
    Passthrough,
    Replay,
    ReplayMissError,
    Schedule,
    SpecError,
    SpecWarning,
    StepRange,
    StepRanges,
    load_config,
    open_engine,
    parse,
    policy_by_name,
)
from reliability_support import worker_context


class Generator:
    """A seeded fake generator that counts its calls; `fail=True` makes it raise instead."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[int, int]] = []
        self.fail = fail

    def __call__(self, step: int, call: int = 0) -> dict:
        if self.fail:
            raise RuntimeError(f"generator called at step {step}")
        self.calls.append((step, call))
        return {"step": step, "call": call, "ids": torch.full((2, 3), step * 10 + call)}


def run(journal: Journal, policy, steps, gen: Generator, calls_per_step=lambda s: 1, **engine_opts) -> list:
    """Drive `steps` through an engine; return (action, source step, source index, value step) per call."""
    engine = Engine(journal, parse(policy) if isinstance(policy, str) else policy, **engine_opts)
    out = []
    for step in steps:
        for call in range(calls_per_step(step)):
            o = engine.call(step, lambda: gen(step, call))
            src = (o.source.step, o.source.gen_index) if o.action == "replayed" else (None, None)
            out.append((o.action, *src, o.value["step"], o.value["call"]))
    return out


def served(rows) -> list:
    return [r[1] for r in rows]


# -- behaviour table of each built-in policy ------------------------------------------------------------
def test_dump_generates_and_stores_every_call(jpath):
    with Journal(jpath) as j:
        gen = Generator()
        run(j, "dump", [1, 2], gen)
        run(j, "dump", [1, 2], gen)  # hit: still generates, and the newer record wins
        assert gen.calls == [(1, 0), (2, 0), (1, 0), (2, 0)]
        assert j.recorded_steps() == [1, 2]
        assert j.lookup(1).seq > 2


def test_replay_serves_the_same_step_and_index(jpath):
    with Journal(jpath) as j:
        run(j, "dump", [1, 2, 3], Generator())
        rows = run(j, "replay", [3, 1], Generator(fail=True))
        assert rows == [("replayed", 3, 0, 3, 0), ("replayed", 1, 0, 1, 0)]


def test_replay_miss_raises_a_typed_error_and_journals_the_refusal(jpath):
    with Journal(jpath) as j:
        run(j, "dump", [1], Generator())
        with pytest.raises(ReplayMissError, match="nothing recorded at step 2 index 0") as info:
            run(j, "replay", [2], Generator(fail=True))
        assert (info.value.step, info.value.gen_index) == (2, 0)
        (_, refusal), = j.events(types=[CallRefused])
        assert refusal.step == 2 and refusal.policy == "replay" and "nothing recorded" in refusal.reason


def test_replay_on_missing_generate_generates_and_stores(jpath):
    with Journal(jpath) as j:
        gen = Generator()
        rows = run(j, "replay(on_missing=generate)", [4], gen)
        assert rows == [("generated", None, None, 4, 0)] and j.recorded_steps() == [4]


def test_cache_serves_hits_and_really_stores_misses(jpath):
    """The anchor's CACHE generated on a miss but never stored; this one stores."""
    with Journal(jpath) as j:
        gen = Generator()
        first = run(j, "cache", [1, 2], gen)
        second = run(j, "cache", [1, 2, 3], gen)
        assert [r[0] for r in first] == ["generated", "generated"]
        assert [r[0] for r in second] == ["replayed", "replayed", "generated"]
        assert gen.calls == [(1, 0), (2, 0), (3, 0)]
        assert j.recorded_steps() == [1, 2, 3]


def test_repeat_on_an_empty_journal_generates_and_stores_instead_of_crashing(jpath):
    with Journal(jpath) as j:
        gen = Generator()
        rows = run(j, "repeat", [1, 2, 3], gen)
        # Step 1 finds nothing and records; steps 2 and 3 cycle over what is recorded by then: [1].
        assert rows == [("generated", None, None, 1, 0), ("replayed", 1, 0, 1, 0), ("replayed", 1, 0, 1, 0)]


def test_repeat_last_on_an_empty_journal_generates_and_stores(jpath):
    with Journal(jpath) as j:
        rows = run(j, "repeat_last", [1, 2], Generator())
        assert rows == [("generated", None, None, 1, 0), ("replayed", 1, 0, 1, 0)]


def test_verl_v2_parity_dump_1_to_4_then_repeat_cycles_1_2_3_4(jpath):
    with Journal(jpath) as j:
        rows = run(j, "dump@1-4;repeat", range(1, 17), Generator())
        assert [r[0] for r in rows[:4]] == ["generated"] * 4
        assert served(rows[4:]) == [1, 2, 3, 4] * 3


def test_verl_v2_parity_repeat_last_serves_step_4(jpath):
    with Journal(jpath) as j:
        rows = run(j, "dump@1-4;repeat_last", range(1, 17), Generator())
        assert served(rows[4:]) == [4] * 12


def test_nearest_on_an_empty_journal_generates_and_stores(jpath):
    with Journal(jpath) as j:
        rows = run(j, "nearest", [3], Generator())
        assert rows == [("generated", None, None, 3, 0)] and j.recorded_steps() == [3]


def test_passthrough_generates_stores_nothing_and_still_journals(jpath):
    with Journal(jpath) as j:
        gen = Generator()
        run(j, "passthrough", [1, 2], gen)
        assert gen.calls == [(1, 0), (2, 0)] and j.recorded_steps() == []
        recorded = [e for _, e in j.events(types=[GenerationRecorded])]
        assert [(e.step, e.output, e.policy) for e in recorded] == [(1, None, "passthrough"), (2, None, "passthrough")]


def test_bypass_generates_and_journals_a_bypass(jpath):
    with Journal(jpath) as j:
        rows = run(j, "bypass", [1], Generator())
        assert rows == [("bypassed", None, None, 1, 0)]
        assert [e.step for _, e in j.events(types=[CallBypassed])] == [1]


def test_validation_calls_are_bypassed_by_default(jpath):
    with Journal(jpath) as j:
        engine = Engine(j, Cache())
        out = engine.call(3, lambda: {"v": 1}, mode="validate")
        assert out.action == "bypassed" and j.recorded_steps(mode="validate") == []
        (_, ev), = j.events(types=[CallBypassed])
        assert ev.mode == "validate" and ev.policy == "bypass"


def test_every_builtin_policy_has_a_class_and_a_spec_name():
    assert set(BUILTIN_POLICIES) == {"dump", "replay", "cache", "repeat", "repeat_last", "nearest", "passthrough", "bypass"}
    for name, cls in BUILTIN_POLICIES.items():
        assert cls().name == name and parse(name) == cls()


# -- generation index (DAPO) ----------------------------------------------------------------------------
def dapo_calls(step: int) -> int:
    return 1 + step % 3  # 1, 2 or 3 generate calls per train step


def test_dapo_steps_are_recorded_then_replayed_call_for_call(jpath):
    with Journal(jpath) as j:
        recorded = run(j, "dump", range(1, 9), Generator(), calls_per_step=dapo_calls)
        replayed = run(j, "replay", range(1, 9), Generator(fail=True), calls_per_step=dapo_calls)
        assert [r[3:] for r in replayed] == [r[3:] for r in recorded]
        assert all(r[0] == "replayed" and r[1:3] == r[3:] for r in replayed)


def test_concurrent_async_calls_in_one_step_get_distinct_indices(jpath):
    with Journal(jpath) as j:

        async def rollout(prompt: int) -> dict:
            await asyncio.sleep(0.01 * (3 - prompt))
            return {"prompt": prompt}

        wrapped = journaled(rollout, j, "dump", input_of=None)

        async def main():
            return await asyncio.gather(*(wrapped(p, step=1) for p in range(3)))

        assert [r["prompt"] for r in asyncio.run(main())] == [0, 1, 2]
        assert j.recorded_indices(1) == [0, 1, 2]


# -- resume is event-sourced -----------------------------------------------------------------------------
def _train_steps(path: str, policy: str, first: int, last: int, kill_after: int | None) -> None:
    with Journal(path, run="resume") as j:
        engine = Engine(j, parse(policy))
        for step in range(first, last + 1):
            for call in range(dapo_calls(step)):
                engine.call(step, lambda: Generator()(step, call))
            if step == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)


def decisions(path: str) -> list:
    with Journal(path, readonly=True) as j:
        rows = []
        for _, e in j.events():
            if isinstance(e, GenerationRecorded):
                rows.append(("generated", e.step, e.gen_index, e.output.digest if e.output else None))
            elif isinstance(e, ReplayServed):
                rows.append(("replayed", e.step, e.gen_index, e.source_step, e.source_gen_index, e.output.digest))
        return rows


def test_resume_after_a_kill_equals_an_uninterrupted_run(tmp_path):
    policy = "dump@1-4;repeat"
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    ctx = worker_context()
    p = ctx.Process(target=_train_steps, args=(whole, policy, 1, 20, None))
    p.start(), p.join(120)
    assert p.exitcode == 0
    p = ctx.Process(target=_train_steps, args=(split, policy, 1, 10, 10))
    p.start(), p.join(120)
    assert p.exitcode == -signal.SIGKILL
    p = ctx.Process(target=_train_steps, args=(split, policy, 11, 20, None))
    p.start(), p.join(120)
    assert p.exitcode == 0
    assert decisions(split) == decisions(whole)
    assert len(decisions(whole)) == sum(dapo_calls(s) for s in range(1, 21))


# -- fingerprint and input checks ------------------------------------------------------------------------
def test_replay_across_a_different_fingerprint_is_refused_and_journaled(jpath):
    with Journal(jpath, fingerprint={"model": "a", "n": 4}) as j:
        run(j, "dump", [1], Generator())
    with Journal(jpath, fingerprint={"model": "b", "n": 4, "extra": 1}) as j:
        with pytest.raises(FingerprintMismatchError, match="model: recorded 'a', now 'b'") as info:
            run(j, "replay", [1], Generator(fail=True))
        assert set(info.value.differences) == {"model", "extra"}
        (_, refusal), = j.events(types=[CallRefused])
        assert "allow_fingerprint_mismatch" in refusal.reason


def test_fingerprint_mismatch_can_be_allowed_and_is_journaled(jpath):
    with Journal(jpath, fingerprint={"model": "a"}) as j:
        run(j, "dump", [1], Generator())
    with Journal(jpath, fingerprint={"model": "b"}) as j:
        rows = run(j, "replay", [1], Generator(fail=True), allow_fingerprint_mismatch=True)
        assert rows[0][0] == "replayed"
        (_, ev), = j.events(types=[ReplayServed])
        assert "fingerprint differs (model: recorded 'a', now 'b'), allowed" in ev.reason


def test_verify_input_regenerates_on_a_different_input_and_says_why(jpath):
    with Journal(jpath) as j:
        calls = []

        def rollout(prompt: int) -> dict:
            calls.append(prompt)
            return {"prompt": prompt}

        journaled(rollout, j, "dump")(1, step=1)
        same = journaled(rollout, j, "replay", verify_input=True)
        assert same(1, step=1) == {"prompt": 1} and calls == [1]
        assert same.last_outcome.action == "replayed"
        other = journaled(rollout, j, "replay", verify_input=True)
        assert other(2, step=1) == {"prompt": 2} and calls == [1, 2]
        assert other.last_outcome.action == "generated"
        assert "differs from the one recorded" in other.last_outcome.source.event.reason


def test_verify_input_can_fail_instead(jpath):
    with Journal(jpath) as j:
        journaled(lambda prompt: {"p": prompt}, j, "dump")(1, step=1)
        strict = journaled(lambda prompt: {"p": prompt}, j, "replay", verify_input=True, on_input_mismatch="error")
        with pytest.raises(InputMismatchError, match="input digest"):
            strict(2, step=1)


# -- the raw-loop adapter -----------------------------------------------------------------------------------
def test_journaled_returns_exactly_what_fn_returns_when_replayed(jpath):
    value = {"ids": torch.arange(6).reshape(2, 3), "texts": ("a", "b"), "score": 0.5, "nested": [{"k": None}]}
    with Journal(jpath) as j:
        first = journaled(lambda: value, j, "cache")
        assert first(step=1) is value
    with Journal(jpath) as j:
        again = journaled(lambda: pytest.fail("generated on replay"), j, "cache")
        out = again(step=1)
    assert out.keys() == value.keys() and type(out["texts"]) is tuple
    assert torch.equal(out["ids"], value["ids"]) and out["nested"] == value["nested"]


def test_journaled_passes_step_on_only_when_fn_takes_it(jpath):
    with Journal(jpath) as j:
        assert journaled(lambda step: {"s": step}, j, "dump")(step=4) == {"s": 4}
        assert journaled(lambda: {"s": 0}, j, "dump")(step=5) == {"s": 0}
        by_arg = journaled(lambda batch: {"b": batch["i"]}, j, "dump", step_of=lambda batch: batch["i"])
        assert by_arg({"i": 6}) == {"b": 6}
        assert j.recorded_steps() == [4, 5, 6]


def test_journaled_without_a_step_says_how_to_give_one(jpath):
    with Journal(jpath) as j:
        with pytest.raises(TypeError, match="step=<train step>"):
            journaled(lambda: 1, j, "dump")()


def test_journaled_names_an_unstorable_input_and_the_way_out(jpath):
    with Journal(jpath) as j:
        wrapped = journaled(lambda model: {"x": 1}, j, "dump")
        with pytest.raises(TypeError, match=r"(?s)args\[0\].*input_of="):
            wrapped(object(), step=1)
        assert journaled(lambda model: {"x": 1}, j, "dump", input_of=None)(object(), step=1) == {"x": 1}


# -- step ranges and specs ------------------------------------------------------------------------------------
def test_step_ranges_parse_ranges_strides_and_open_ends():
    r = StepRanges.parse("1-10,20,30-40:2,50-")
    inside = [1, 5, 10, 20, 30, 32, 40, 50, 51, 10**9]
    outside = [0, 11, 19, 21, 31, 41, 49]
    assert all(s in r for s in inside) and not any(s in r for s in outside)
    assert str(r) == "1-10,20,30-40:2,50-"
    assert list(StepRanges.parse("3, 1-2")) == [1, 2, 3]


@pytest.mark.parametrize(
    "text, message, column",
    [
        ("1-x", "unexpected 'x'", 2),
        ("1,,2", "expected a step number, found ','", 2),
        ("5-2", "ends before it starts", 0),
        ("1-4:0", "stride must be at least 1", 4),
        ("7:2", "needs a range", 1),
        ("", "found end of text", 0),
    ],
)
def test_step_ranges_reject_bad_text_pointing_at_the_bad_character(text, message, column):
    with pytest.raises(SpecError, match=message) as info:
        StepRanges.parse(text)
    caret_line = str(info.value).splitlines()[-1]
    assert caret_line.index("^") - 2 == column


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 50), st.integers(1, 7)), min_size=1, max_size=6))
def test_step_ranges_membership_matches_the_text(items):
    text = ",".join(f"{a}-{a + n}:{k}" for a, n, k in items)
    r = StepRanges.parse(text)
    expected = {s for a, n, k in items for s in range(a, a + n + 1, k)}
    assert {s for s in range(0, 600) if s in r} == expected
    assert StepRanges.parse(str(r)) == r


def test_spec_clause_without_ranges_matches_every_step():
    assert parse("cache") == Cache()
    sched = parse("dump@1-5;repeat")
    assert isinstance(sched, Schedule)
    assert sched.select(3)[1] == "dump@1-5" and sched.select(6)[1] == "repeat" and sched.select(0)[1] == "repeat"


def test_spec_first_matching_clause_wins_and_uncovered_steps_pass_through(jpath):
    sched = parse("cache@1-10,20;replay(on_missing=generate)@5-30")
    assert sched.select(7)[1] == "cache@1-10,20"
    assert sched.select(25)[1] == "replay(on_missing=generate)@5-30"
    assert sched.select(31)[0] == Passthrough()
    with Journal(jpath) as j:
        run(j, sched, [2, 25, 31], Generator())
        policies = [e.policy for _, e in j.events(types=[GenerationRecorded])]
        assert policies == ["cache@1-10,20", "replay(on_missing=generate)@5-30", "passthrough (default)"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "non-empty"),
        ("nosuch", "unknown policy 'nosuch'"),
        ("dump@1-x", "clause 1 'dump@1-x'"),
        ("dump;;cache", "clause 2"),
        ("replay(on_missing=maybe)", "on_missing"),
        ("replay(bogus)", "not key=value"),
        ("cache(x=1)", "does not accept"),
    ],
)
def test_bad_specs_are_rejected_with_the_clause(spec, message):
    with pytest.raises(SpecError, match=message):
        parse(spec)


def test_step_ranges_constructor_takes_range_text_like_parse():
    """`StepRanges("1-10,20")` used to build an object whose `in` raised TypeError."""
    r = StepRanges("1-10,20")
    assert 5 in r and 20 in r and 11 not in r and r == StepRanges.parse("1-10,20")
    assert StepRanges("*") == StepRanges.every()
    with pytest.raises(SpecError, match="unexpected 'x'"):
        StepRanges("1-x")


def test_step_ranges_constructor_keeps_its_other_forms():
    ranges = (StepRange(1, 10), StepRange(20, 20))
    assert StepRanges(ranges) == StepRanges(list(ranges)) == StepRanges(StepRanges(ranges)) == StepRanges("1-10,20")
    assert StepRanges.of([3, 1]) == StepRanges("1,3")
    with pytest.raises(SpecError, match=r"StepRanges.of\(steps\)"):
        StepRanges([1, 2])


def test_unknown_policy_name_suggests_the_closest_built_in():
    with pytest.raises(SpecError, match=r"unknown policy 'cahce' \(did you mean 'cache'\?\)"):
        parse("cahce")
    with pytest.raises(SpecError, match=r"clause 2 'repet_last': unknown policy 'repet_last' \(did you mean 'repeat_last'"):
        parse("dump@1-5;repet_last")
    with pytest.raises(SpecError, match=r"unknown policy 'zzz': built-in"):  # nothing close: no guess
        parse("zzz")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("dump@1-5;repeat;cache", "clause 3 'cache' can never be reached: clause 2 'repeat' matches every step"),
        ("dump@1-5;cache@2-4", "clause 2 'cache@2-4' can never be reached: clause 1 'dump@1-5' takes steps 1-5"),
        ("dump@1-3;cache@4-6;replay@2-5", "clause 3 'replay@2-5' can never be reached: clauses 1, 2 take all"),
        ("dump@1-10:2;cache@1-9:4", "clause 2 'cache@1-9:4' can never be reached"),
        ("cache@0-;dump@1000-", "clause 2 'dump@1000-' can never be reached: clause 1 'cache@0-' matches every"),
    ],
)
def test_unreachable_clause_warns_when_the_spec_is_parsed(spec, message):
    with pytest.warns(SpecWarning, match=message):
        parse(spec)


@pytest.mark.parametrize(
    "spec", ["dump@1-5;repeat", "cache@1-10,20;replay@5-30", "dump@1-10:2;cache@2-10:4", "cache@1-5;dump@6-;repeat"]
)
def test_reachable_clauses_do_not_warn(spec):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecWarning)
        parse(spec)


@given(
    st.lists(st.tuples(st.integers(0, 60), st.one_of(st.none(), st.integers(0, 40)), st.integers(1, 4)), min_size=1, max_size=3),
    st.tuples(st.integers(0, 60), st.one_of(st.none(), st.integers(0, 40)), st.integers(1, 4)),
)
def test_unreachable_warning_matches_the_steps_earlier_clauses_take(earlier, last):
    def text(a, n, k):
        return f"{a}-" + ("" if n is None else str(a + n)) + f":{k}"

    spec = ";".join([f"dump@{text(*item)}" for item in earlier] + [f"cache@{text(*last)}"])
    # Past every bound, membership repeats with the lcm of the strides: this window decides it.
    window = range(0, 101 + 2 * math.lcm(*(k for _, _, k in earlier + [last])))
    ranges = [StepRanges.parse(text(*item)) for item in earlier]
    covered = all(any(s in r for r in ranges) for s in window if s in StepRanges.parse(text(*last)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parse(spec)
    last_clause = [w for w in caught if f"clause {len(earlier) + 1} " in str(w.message)]
    assert bool(last_clause) == covered


@given(st.text(alphabet="cahedumpry_plast()=,;@-:*0123456789 onmisgtfx.", max_size=40))
def test_any_spec_text_parses_or_raises_spec_error(text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        try:
            policy = parse(text)
        except SpecError:
            return
    assert isinstance(policy.name, str) and callable(policy.decide)


def test_builtin_arguments_are_checked_when_the_spec_is_parsed():
    with pytest.raises(SpecError, match=r"policy 'replay' \(built-in policy\): argument on_missing must be one of 'error', 'generate', got 'maybe'"):
        parse("replay(on_missing=maybe)")
    with pytest.raises(SpecError, match="argument on_missing must be one of 'error', 'generate', got 3"):
        policy_by_name("replay", on_missing=3)
    assert parse("replay(on_missing=generate)") == Replay(on_missing="generate")


# -- serving clauses in a schedule see only what earlier clauses record -----------------------------
def record_old_session(jpath, steps) -> None:
    """An earlier session that recorded `steps` (its values carry call index 99 to tell them apart)."""
    with Journal(jpath) as j:
        engine = Engine(j, "dump")
        for step in steps:
            engine.call(step, lambda: {"step": step, "call": 99, "ids": torch.zeros(1)})


def test_repeat_after_dump_cycles_only_through_the_steps_this_schedule_dumped(jpath):
    """`dump@1-5;repeat` on a journal holding steps 1-10 from before served old steps 6-10."""
    record_old_session(jpath, range(1, 11))
    with Journal(jpath) as j:
        engine = Engine(j, "dump@1-5;repeat")
        outcomes = [engine.call(step, lambda: {"step": step, "call": 0}) for step in range(1, 13)]
        assert [o.source.step for o in outcomes[5:]] == [1, 2, 3, 4, 5, 1, 2]
        assert all(o.value["call"] == 0 for o in outcomes)  # nothing from the earlier session
        reasons = [e.reason for _, e in j.events(types=[ReplayServed])]
        assert reasons[0] == "repeat: step 6 -> recorded step 1 of 5 in steps 1-5"


def test_repeat_last_and_nearest_after_recording_clauses_serve_only_their_steps(jpath):
    record_old_session(jpath, range(1, 11))
    with Journal(jpath) as j:
        rows = run(j, "cache@1-5;repeat_last", range(1, 9), Generator())
        assert served(rows[5:]) == [5, 5, 5]
        rows = run(j, "cache@1-3;nearest", [1, 2, 3, 7], Generator())
        assert served(rows) == [1, 2, 3, 3]  # exact step 7 of the earlier session is out of scope


def test_standalone_repeat_and_repeat_after_non_recording_clauses_see_every_recorded_step(jpath):
    record_old_session(jpath, range(1, 11))
    with Journal(jpath) as j:
        assert served(run(j, "repeat", [16], Generator())) == [6]
        assert served(run(j, "passthrough@1-3;repeat", [1, 16], Generator())[1:]) == [6]
        assert served(run(j, "bypass@1-3;repeat@4-8;nearest", [20], Generator())) == [10]


def test_serving_clause_scopes_skip_passthrough_bypass_and_other_serving_clauses():
    sched = parse("dump@1-5;passthrough@6;repeat@7-9;cache@20-30:2;nearest")
    assert sched.scopes == (None, None, StepRanges("1-5"), None, StepRanges("1-5,20-30:2"))


@pytest.fixture(scope="module")
def sparse_journal(tmp_path_factory):
    """A journal with recorded steps 1, 2, 3, 5, 8, 13, 21, 34, 55, 89 and 100-110, opened read-only."""
    path = str(tmp_path_factory.mktemp("sparse") / "j")
    steps = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, *range(100, 111)]
    record_old_session(path, steps)
    with Journal(path, readonly=True) as j:
        yield j, steps


RANGE_ITEM = st.tuples(st.integers(0, 120), st.one_of(st.none(), st.integers(0, 30)), st.integers(1, 3))


@given(st.lists(RANGE_ITEM, min_size=1, max_size=4), st.lists(st.integers(-1, 125), min_size=1, max_size=5))
def test_restricted_view_answers_as_if_only_its_steps_were_recorded(sparse_journal, items, probes):
    j, steps = sparse_journal
    scope = StepRanges(",".join(f"{a}-{'' if n is None else a + n}:{k}" for a, n, k in items))
    view = JournalView(j).restricted(scope)
    visible = [s for s in steps if s in scope]
    assert view.recorded_steps() == visible and view.step_count() == len(visible)
    assert [view.nth_step(n) for n in range(-len(visible), len(visible))] == visible[-len(visible):] + visible
    for n in (len(visible), -len(visible) - 1):
        with pytest.raises(IndexError):
            view.nth_step(n)
    for probe in probes:
        below = [s for s in visible if s < probe]
        above = [s for s in visible if s > probe]
        assert view.nearest_below(probe) == (below[-1] if below else None)
        assert view.nearest_above(probe) == (above[0] if above else None)
        if probe >= 0:
            assert (view.lookup(probe) is not None) == (probe in visible)
            assert view.recorded_indices(probe) == ([0] if probe in visible else [])


# -- config ----------------------------------------------------------------------------------------------------
def test_config_from_dict_yaml_and_omegaconf_builds_the_same_engine(tmp_path):
    from omegaconf import OmegaConf

    data = {"path": str(tmp_path / "j"), "policy": "dump@1-5;repeat", "run": "exp", "fingerprint": {"n": 4}}
    yaml_file = tmp_path / "sj.yaml"
    yaml_file.write_text("\n".join(f"{k}: {v!r}" if k != "fingerprint" else "fingerprint: {n: 4}" for k, v in data.items()))
    configs = [load_config(data), load_config(OmegaConf.create(data)), load_config(str(yaml_file))]
    assert configs[0] == configs[1] == configs[2]
    engine = open_engine(configs[0])
    try:
        assert engine.policy == parse("dump@1-5;repeat") and engine.journal.run == "exp"
        assert engine.journal.fingerprint == {"n": 4}
    finally:
        engine.journal.close()


@pytest.mark.parametrize(
    "data, message",
    [
        ({"path": "j", "polcy": "cache"}, "unknown key.*'polcy' \\(did you mean 'policy'\\?\\)"),
        ({"path": "j", "verify_input": "yes"}, "verify_input.*'yes'"),
        ({"path": "j", "policy": "cachee"}, "policy='cachee'"),
        ({"policy": "cache"}, "config.path"),
        ({"path": "j", "on_input_mismatch": "ignore"}, "on_input_mismatch.*'ignore'"),
        (["path"], "must be a mapping"),
        ({"path": "j", "payload_store": "my-bucket"}, "payload_store='my-bucket' is not an object storage URL.*s3://"),
    ],
)
def test_config_errors_name_the_bad_key_and_value(data, message):
    with pytest.raises(ConfigError, match=message):
        load_config(data)


def test_a_configs_payload_store_writes_each_payload_as_an_object_there_before_its_event(tmp_path):
    remote = tmp_path / "remote"
    engine = open_engine(load_config({"path": str(tmp_path / "j"), "policy": "cache",
                                      "payload_store": remote.as_uri()}))
    try:
        assert engine.journal.payload_store.url == remote.as_uri()
        recorded = engine.journal.record(1, {"ids": torch.arange(8)})
    finally:
        engine.journal.close()
    assert (remote / "payloads" / recorded.event.output.digest).is_file()


def test_engine_takes_a_spec_string_and_rejects_what_is_not_a_policy(jpath):
    with Journal(jpath) as j:
        assert Engine(j, "dump@1-4;repeat").policy == parse("dump@1-4;repeat")
        with pytest.raises(TypeError, match="is not a policy"):
            Engine(j, object())
        with pytest.raises(SpecError, match="unknown policy"):
            Engine(j, "cachee")


# -- imported records: a fingerprint key they never had is unknown, not different ---------------------------
def _record_then_replay(tmp_path, recorded_fp, current_fp, *, imported_from):
    path = tmp_path / "j"
    with Journal(path, run="r", fingerprint=recorded_fp) as journal:
        journal.record(1, {"x": 1}, imported_from=imported_from)
    with Journal(path, run="r", fingerprint=current_fp) as journal:
        outcome = Engine(journal, parse("replay")).call(1, lambda: {"x": 2})
        return outcome, [r.reason for r in journal.audit() if r.action == "replayed"]


def test_a_key_an_imported_record_lacks_is_not_compared_and_the_reason_lists_it(tmp_path):
    outcome, reasons = _record_then_replay(tmp_path, {"n": 2}, {"n": 2, "model": "m", "temperature": 1.0},
                                           imported_from="verl-skip_manager:exp/1")
    assert outcome.action == "replayed" and outcome.value == {"x": 1}
    assert reasons[0].endswith("not checked, unknown to the imported record: model, temperature")


def test_a_key_an_imported_record_has_is_still_compared(tmp_path):
    with pytest.raises(FingerprintMismatchError) as caught:
        _record_then_replay(tmp_path, {"n": 2}, {"n": 4, "model": "m"}, imported_from="verl-skip_manager:exp/1")
    assert caught.value.differences == {"n": (2, 4)}


def test_a_key_a_recorded_call_lacks_still_differs(tmp_path):
    """Only imported records have keys they could not know: a journal's own record is compared key for key."""
    with pytest.raises(FingerprintMismatchError) as caught:
        _record_then_replay(tmp_path, {"n": 2}, {"n": 2, "model": "m"}, imported_from=None)
    assert caught.value.differences == {"model": (None, "m")}
