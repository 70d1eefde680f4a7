"""Journaled tool calls in one process: the request's canonical form, the key, matching by request, the
miss rules, the raw adapter's explicit and context forms, and the read side's rows and counts."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepjournal import Journal
from stepjournal.tools import first_tool_difference, tool_call_rows, tool_step_summaries
from stepjournal.errors import ToolCallError
from stepjournal.events import (MAX_CALL, MAX_SAMPLE, MAX_TURN, ToolCallKey, ToolRequest, ToolResponse,
                                canonical_arguments, tool_of_stage, tool_stage)
from stepjournal.index import RecordedGeneration
from stepjournal.vocabulary import ToolOutcome
from stepjournal.adapters import current_tool_turn, journaled_tool, tool_turn
from stepjournal.policies import (
    RecordedToolCall,
    SpecError,
    ToolCallFacts,
    ToolEngine,
    ToolReplayMissError,
    ToolStateMismatchError,
    match_tool_call,
    sample_history,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


def _nested(depth: int) -> list:
    top = inner = []
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return top


def _cyclic() -> dict:
    loop: dict = {}
    loop["self"] = loop
    return loop


class Counted:
    """A deterministic stateless tool that counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, a: int, b: int) -> str:
        self.runs += 1
        return str(a + b)


# -- the request and the key ------------------------------------------------------------------------------
@given(st.dictionaries(st.text(), json_values, max_size=5))
def test_canonical_arguments_do_not_depend_on_key_order_and_read_back(arguments):
    text = canonical_arguments(arguments)
    reordered = dict(reversed(list(arguments.items())))
    assert canonical_arguments(reordered) == text
    assert canonical_arguments(text) == text  # JSON text of an object reads to the same form
    assert ToolRequest.of("t", arguments).parsed_arguments() == ToolRequest.of("t", text).parsed_arguments()


def test_canonical_arguments_have_sorted_keys_and_no_whitespace():
    assert canonical_arguments({"b": [1, 2], "a": {"y": 1, "x": "é"}}) == '{"a":{"x":"é","y":1},"b":[1,2]}'


@pytest.mark.parametrize("arguments, message", [
    ({"x": math.nan}, "arguments.x is nan"),
    ({"x": [1.0, math.inf]}, r"arguments.x\[1\] is inf"),
    ('{"x": NaN}', "NaN"),
    ('{"x": ', "not JSON"),
    ([1, 2], "must be a JSON object"),
    ({1: "a"}, "key 1"),
    ({"x": object()}, "cannot be written as JSON"),
    ('{"x":' + "[" * 100_000 + "]" * 100_000 + "}", "nest too deeply"),  # a model's runaway output
    ({"x": _nested(100_000)}, "nest too deeply"),
    ({"x": _cyclic()}, "nest too deeply"),
])
def test_arguments_json_cannot_carry_are_refused_naming_the_value(arguments, message):
    with pytest.raises(ToolCallError, match=message):
        canonical_arguments(arguments)


@given(st.integers(0, MAX_SAMPLE), st.integers(0, MAX_TURN), st.integers(0, MAX_CALL))
def test_a_key_round_trips_through_the_call_index_and_sorts_by_sample_turn_call(sample, turn, call):
    key = ToolCallKey(sample, turn, call)
    assert ToolCallKey.from_gen_index(key.gen_index) == key
    lo, hi = ToolCallKey.sample_span(sample)
    assert lo <= key.gen_index < hi
    assert key.gen_index < 2 ** 32


@pytest.mark.parametrize("fields", [(MAX_SAMPLE + 1, 0, 0), (0, MAX_TURN + 1, 0), (0, 0, -1), (True, 0, 0)])
def test_a_key_out_of_range_is_refused(fields):
    with pytest.raises(ToolCallError, match="not valid"):
        ToolCallKey(*fields)


def test_a_tool_stage_names_its_tool():
    assert tool_stage("calculator") == "tool.calculator"
    assert tool_of_stage("tool.calculator") == "calculator" and tool_of_stage("reward") is None
    with pytest.raises(ToolCallError):
        tool_stage("")


# -- matching, pure ------------------------------------------------------------------------------------------
def recorded(journal, key, request, output="r"):
    """A record of `request` at `key` in the calculator's stage of step 1."""
    prepared = journal.prepare(request.to_payload())
    found = journal.record(1, output, gen_index=key.gen_index, input=prepared, stage="tool.calculator")
    return RecordedToolCall(key, found)


@pytest.fixture
def journal(tmp_path):
    with Journal(str(tmp_path / "j")) as j:
        yield j


def test_another_requests_record_is_never_served_even_at_the_same_position(journal):
    key = ToolCallKey(0, 1, 0)
    one = recorded(journal, key, ToolRequest.of("add", {"a": 1, "b": 2}))
    other = ToolRequest.of("add", {"a": 1, "b": 3})
    found, why = match_tool_call(ToolCallFacts(key, other), journal.prepare(other.to_payload()).digest, [one])
    assert found is None and "no call of this sample made this request" in why


def test_the_same_request_is_matched_before_the_position_and_the_same_key_first(journal):
    request = ToolRequest.of("add", {"a": 1, "b": 2})
    digest = journal.prepare(request.to_payload()).digest
    other = recorded(journal, ToolCallKey(0, 1, 0), ToolRequest.of("add", {"a": 5, "b": 2}))
    early = recorded(journal, ToolCallKey(0, 1, 1), request)
    late = recorded(journal, ToolCallKey(0, 3, 0), request)
    calls = [other, early, late]
    assert match_tool_call(ToolCallFacts(ToolCallKey(0, 2, 0), request), digest, calls)[0] == early  # shifted turn
    assert match_tool_call(ToolCallFacts(ToolCallKey(0, 3, 0), request), digest, calls)[0] == late  # same key
    served_early = ToolCallFacts(ToolCallKey(0, 4, 0), request, served=frozenset({early.source.seq}))
    assert match_tool_call(served_early, digest, calls)[0] == late  # the first not yet served


def test_a_stateful_sample_follows_its_recorded_order_and_misses_for_good_once_it_left(journal):
    create = ToolRequest.of("env.reset", {})
    act = ToolRequest.of("env.step", {"action": 1})
    calls = [recorded(journal, ToolCallKey(0, 0, 0), create), recorded(journal, ToolCallKey(0, 1, 0), act)]
    digest = journal.prepare(act.to_payload()).digest
    assert match_tool_call(ToolCallFacts(ToolCallKey(0, 2, 0), act, stateful=True, ordinal=1), digest, calls)[0] \
        == calls[1]
    wrong_place = ToolCallFacts(ToolCallKey(0, 1, 0), act, stateful=True, ordinal=0)
    assert match_tool_call(wrong_place, digest, calls)[0] is None  # the recording's call #0 was the reset
    left = ToolCallFacts(ToolCallKey(0, 1, 0), act, stateful=True, ordinal=1, left_at=ToolCallKey(0, 0, 0))
    found, why = match_tool_call(left, digest, calls)
    assert found is None and "left the recording at s0.t0.c0" in why


def test_a_stateful_history_leaves_out_an_older_recordings_calls_after_a_newer_one():
    def call(key, seq):
        return RecordedToolCall(key, RecordedGeneration(seq, None))  # type: ignore[arg-type]

    older = [call(ToolCallKey(0, t, 0), seq) for t, seq in ((0, 1), (1, 2), (3, 4))]
    newer = [call(ToolCallKey(0, 2, 0), 10), call(ToolCallKey(0, 4, 0), 11)]
    calls = sorted(older + newer, key=lambda c: c.key)
    assert [c.source.seq for c in sample_history(calls)] == [1, 2, 10, 11]


# -- the engine and the raw adapter -----------------------------------------------------------------------------
def test_replay_serves_recorded_responses_by_request_without_running_the_tool(tmp_path):
    tool = Counted()
    with Journal(str(tmp_path / "j")) as journal:
        add = journaled_tool(tool, journal, "add", "cache")
        with tool_turn(step=1, sample=0, turn=0):
            assert (add(a=1, b=2), add(a=2, b=2)) == ("3", "4")
    with Journal(str(tmp_path / "j")) as journal:
        add = journaled_tool(tool, journal, "add", "replay")
        with tool_turn(step=1, sample=0, turn=5):  # another turn, another order: matched by request
            assert (add(b=2, a=2), add(a=1, b=2)) == ("4", "3")
        assert add.last_outcome.action == "replayed"
    assert tool.runs == 2


def test_a_miss_is_called_and_recorded_under_cache_and_refused_naming_the_request_under_replay(tmp_path):
    tool = Counted()
    with Journal(str(tmp_path / "j")) as journal:
        journaled_tool(tool, journal, "add").at(step=1, sample=0)(a=1, b=2)
    with Journal(str(tmp_path / "j")) as journal:
        add = journaled_tool(tool, journal, "add", "replay")
        with pytest.raises(ToolReplayMissError, match=r'add\(\{"a":1,"b":3\}\)') as caught:
            add.at(step=1, sample=0)(a=1, b=3)
        assert caught.value.request == ToolRequest.of("add", {"a": 1, "b": 3})
        assert (caught.value.stage, caught.value.key) == ("tool.add", ToolCallKey(0, 0, 0))
        with pytest.raises(ToolReplayMissError):
            add.at(step=1, sample=1)(a=1, b=2)  # the same request in another sample is not served
        assert tool.runs == 1
        cached = journaled_tool(tool, journal, "add", "cache")
        assert cached.at(step=1, sample=0)(a=1, b=3) == "4"
        assert tool.runs == 2 and cached.last_outcome.action == "generated"
        rows = tool_call_rows(journal)
    assert [row.outcome for row in rows] == ["miss", "refused", "refused", "miss"]
    (summary,) = tool_step_summaries(rows)
    assert (summary.calls, summary.replayed, summary.misses, summary.refused) == (4, 0, 4, 2)


def test_a_tool_without_its_place_or_with_positional_arguments_is_refused(journal):
    add = journaled_tool(Counted(), journal, "add")
    with pytest.raises(TypeError, match="tool_turn"):
        add(a=1, b=2)
    with pytest.raises(TypeError, match="keyword arguments only"):
        add.at(step=1, sample=0)(1, 2)
    assert current_tool_turn() is None


def test_a_policy_that_serves_other_steps_cannot_decide_tool_calls(journal):
    with pytest.raises(SpecError, match="'repeat' cannot decide tool calls"):
        ToolEngine(journal, "repeat")
    engine = ToolEngine(journal, "tool.add:replay/tool.env:cache")
    assert (engine.rule("tool.add"), engine.rule("tool.env"), engine.rule("tool.other")) == ("replay", "cache",
                                                                                            "bypass")
    every = ToolEngine(journal, "generate:cache/tools:replay/tool.env:cache", tools=["add", "env"])
    assert (every.rule("tool.add"), every.rule("tool.env")) == ("replay", "cache")


def test_declared_tools_refuse_a_misspelt_stage_in_the_spec_and_an_undeclared_tool(journal):
    with pytest.raises(SpecError, match="did you mean 'tool.calculator'"):
        ToolEngine(journal, "tool.calculater:replay", tools=["calculator"])
    engine = ToolEngine(journal, "tool.calculator:replay", tools=["calculator"])
    with pytest.raises(ToolCallError, match="not one of this engine's tools"):
        journaled_tool(Counted(), engine, "add").at(step=1, sample=0)(a=1, b=2)


def test_a_stateful_catch_up_that_answers_otherwise_is_refused(tmp_path):
    state = {"runs": 0}

    def reset() -> str:
        state["runs"] += 1
        return f"seed {state['runs']}"  # not the same twice: the live state cannot be rebuilt

    def act(move: int) -> str:
        return f"moved {move}"

    with Journal(str(tmp_path / "j")) as journal:
        engine = ToolEngine(journal, "cache")
        journaled_tool(reset, engine, "env.reset", environment="env").at(step=1, sample=0)()
        journaled_tool(act, engine, "env.step", environment="env").at(step=1, sample=0, turn=1)(move=1)
    with Journal(str(tmp_path / "j")) as journal:
        engine = ToolEngine(journal, "cache")
        do_reset = journaled_tool(reset, engine, "env.reset", environment="env")
        do_act = journaled_tool(act, engine, "env.step", environment="env")
        assert do_reset.at(step=1, sample=0)() == "seed 1"  # served
        with pytest.raises(ToolStateMismatchError, match=r"env.reset\(\{\}\) at s0.t0.c0 answered otherwise"):
            do_act.at(step=1, sample=0, turn=1)(move=2)  # a miss: the reset runs again, and answers "seed 2"
        outcomes = [row.outcome for row in tool_call_rows(journal, payloads=False)]
    assert outcomes[-2:] == ["replayed", "caught up"]


def test_every_kind_of_tool_call_reads_as_one_tool_outcome_and_together_they_are_all(tmp_path):
    """A recording, a replay, a refusal, a miss under cache, a bypass and a catch-up: each row's outcome is a
    `ToolOutcome` member (not a bare word), and no member is one that no call gives."""
    tool, path = Counted(), str(tmp_path / "j")
    with Journal(path) as journal:
        journaled_tool(tool, journal, "add", "dump").at(step=1, sample=0)(a=1, b=2)
        engine = ToolEngine(journal, "cache")
        journaled_tool(lambda: "ready", engine, "env.reset", environment="env").at(step=1, sample=1)()
        journaled_tool(str, engine, "env.step", environment="env").at(step=1, sample=1, turn=1)(object=1)
    with Journal(path) as journal:
        assert journaled_tool(tool, journal, "add", "replay").at(step=1, sample=0)(a=1, b=2) == "3"
        with pytest.raises(ToolReplayMissError):
            journaled_tool(tool, journal, "add", "replay").at(step=1, sample=0)(a=1, b=3)
        journaled_tool(tool, journal, "add", "cache").at(step=1, sample=0)(a=2, b=3)
        journaled_tool(tool, journal, "add", "bypass").at(step=1, sample=0)(a=3, b=3)
        engine = ToolEngine(journal, "cache")
        journaled_tool(lambda: "ready", engine, "env.reset", environment="env").at(step=1, sample=1)()  # served
        journaled_tool(str, engine, "env.step", environment="env").at(step=1, sample=1, turn=1)(object=2)
        rows = tool_call_rows(journal, payloads=False)
    assert all(type(row.outcome) is ToolOutcome for row in rows)
    assert {row.outcome for row in rows} == set(ToolOutcome)


def test_concurrent_async_calls_of_many_samples_each_get_their_own_response(tmp_path):
    async def double(x: int) -> str:
        await asyncio.sleep(0)
        return str(2 * x)

    async def sample(tool, s: int) -> list:
        with tool_turn(step=1, sample=s, turn=0):
            return list(await asyncio.gather(*(tool(x=s * 100 + i) for i in range(4))))

    async def run(policy: str) -> list:
        with Journal(str(tmp_path / "j")) as journal:
            tool = journaled_tool(double, journal, "double", policy)
            return list(await asyncio.gather(*(sample(tool, s) for s in range(32))))

    recorded_run = asyncio.run(run("dump"))
    assert recorded_run[7] == [str(2 * (700 + i)) for i in range(4)]
    assert asyncio.run(run("replay")) == recorded_run
    with Journal(str(tmp_path / "j"), readonly=True) as journal:
        rows = tool_call_rows(journal)
    replays = [row for row in rows if row.outcome == "replayed"]
    assert len(replays) == 128 and all(row.source_key == row.key for row in replays)
    assert all(row.response.text == str(2 * row.request.parsed_arguments()["x"]) for row in rows)


def test_responses_keep_their_type_and_the_first_differing_response_is_named(tmp_path):
    answers = {"a": ToolResponse("seen", reward=1.0, metrics={"n": 2}), "b": {"rows": [1, 2]}}

    def look(what: str):
        return answers[what]

    paths = []
    for name, value in (("left", "seen"), ("right", "other")):
        answers["a"] = ToolResponse(value, reward=1.0, metrics={"n": 2})
        path = str(tmp_path / name)
        with Journal(path) as journal:
            tool = journaled_tool(look, journal, "look", "dump")
            assert tool.at(step=1, sample=0)(what="a") == answers["a"]
            assert tool.at(step=1, sample=0)(what="b") == {"rows": [1, 2]}
        with Journal(path) as journal:
            tool = journaled_tool(look, journal, "look", "replay")
            assert tool.at(step=1, sample=0)(what="a") == answers["a"]
            assert tool.at(step=1, sample=0)(what="b") == {"rows": [1, 2]}
        paths.append(path)
    with Journal(paths[0], readonly=True) as left, Journal(paths[1], readonly=True) as right:
        assert first_tool_difference(tool_call_rows(left), tool_call_rows(left)) is None
        difference = first_tool_difference(tool_call_rows(left), tool_call_rows(right))
    assert difference == 'step 1 tool.look s0.t0.c0: the responses to look({"what":"a"}) differ'


def test_a_response_with_images_replays_its_tensors_reward_and_metrics(tmp_path):
    import torch

    image = torch.arange(12, dtype=torch.uint8).reshape(3, 4)

    def render(scene: str) -> ToolResponse:
        return ToolResponse(f"drew {scene}", reward=0.5, metrics={"ms": 3}, images=(image,))

    answers = []
    for policy in ("dump", "replay"):
        with Journal(str(tmp_path / "j")) as journal:
            answers.append(journaled_tool(render, journal, "render", policy).at(step=1, sample=0)(scene="cube"))
    served = answers[1]
    assert (served.text, served.reward, dict(served.metrics)) == ("drew cube", 0.5, {"ms": 3})
    assert len(served.images) == 1 and torch.equal(served.images[0], image)
    with Journal(str(tmp_path / "j"), readonly=True) as journal:
        (recorded_row, replayed_row) = tool_call_rows(journal)
    assert (recorded_row.outcome, replayed_row.outcome) == ("recorded", "replayed")
    assert torch.equal(replayed_row.response.images[0], image)


def test_a_samples_calls_are_read_as_a_range_of_the_steps_index(journal):
    keys = [ToolCallKey(s, t, c) for s in (0, 1, 2, 300) for t in (0, 255) for c in (0, 255)]
    for key in keys:
        journal.record(4, "r", gen_index=key.gen_index, input={"k": str(key)}, stage="tool.t")
    lo, hi = ToolCallKey.sample_span(1)
    got = journal.recorded_indices(4, stage="tool.t", start=lo, stop=hi)
    assert got == sorted(k.gen_index for k in keys if k.sample == 1)
    assert journal.recorded_indices(4, stage="tool.t", start=hi, stop=hi) == []
    assert journal.recorded_indices(4, stage="tool.t", start=ToolCallKey.sample_span(300)[0]) == sorted(
        k.gen_index for k in keys if k.sample == 300)
    assert journal.recorded_indices(4, stage="tool.t") == sorted(k.gen_index for k in keys)


class Tally:
    """A stateful environment whose fresh state (100) is not its reset state (0); its reset can fail once."""

    def __init__(self, reset_fails: int = 0) -> None:
        self.total, self.runs, self.reset_fails = 100, 0, reset_fails

    def reset(self) -> str:
        self.runs += 1
        if self.reset_fails:
            self.reset_fails -= 1
            raise RuntimeError("sandbox busy")
        self.total = 0
        return "0"

    def add(self, amount: int) -> str:
        self.runs += 1
        self.total += amount
        return str(self.total)


class MixedTally(Tally):
    """`Tally` with an async add (an environment's tool method) beside its sync reset and reward."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list = []

    def reset(self) -> str:
        self.ran.append("reset")
        return super().reset()

    async def add(self, amount: int) -> str:  # type: ignore[override]
        self.ran.append(amount)
        self.total += amount
        return str(self.total)

    def reward(self) -> str:
        self.ran.append("reward")
        return str(self.total * 10)


def _tally_episode(path, env, amounts):
    """A sample of a tolerant agent loop (a tool's error becomes the text the model reads, as verl's does)."""
    seen = []
    with Journal(path) as journal:
        engine = ToolEngine(journal, "cache")
        reset = journaled_tool(env.reset, engine, "tally.reset", environment="tally")
        add = journaled_tool(env.add, engine, "tally.add", environment="tally")
        calls = [lambda: reset.at(step=1, sample=0)()]
        calls += [lambda t=t, a=a: add.at(step=1, sample=0, turn=t)(amount=a) for t, a in enumerate(amounts, 1)]
        for call in calls:
            try:
                seen.append(call())
            except Exception as exc:  # noqa: BLE001 - the loop goes on, as an agent loop does
                seen.append(type(exc).__name__)
    return seen


@pytest.mark.parametrize(("reset_fails", "first_error"), [(1, "RuntimeError"), (0, "ToolStateMismatchError")],
                         ids=["catch-up raises", "catch-up differs"])
def test_a_sample_whose_catch_up_failed_never_runs_live_again(tmp_path, reset_fails, first_error):
    """A failed catch-up (the tool raised, or answered otherwise) leaves the live environment in a state the model
    never saw: every later call of the sample is refused, none runs on that environment or is recorded."""
    path = str(tmp_path / "j")
    assert _tally_episode(path, Tally(), [1, 2, 3]) == ["0", "1", "3", "6"]
    env = Tally(reset_fails)
    if not reset_fails:
        env.reset = lambda: "reset"  # answers otherwise than the recording did
    assert _tally_episode(path, env, [1, 5, 3]) == ["0", "1", first_error, "ToolStateMismatchError"]
    assert env.total == 100  # add(5), add(3) never ran on the environment that missed its catch-up
    with Journal(path, readonly=True) as journal:
        rows = tool_call_rows(journal)
    assert [row.outcome for row in rows if row.session == rows[-1].session] == ["replayed", "replayed"] + (
        [] if reset_fails else ["caught up"])


def test_concurrent_calls_of_one_stateful_sample_are_refused_not_mixed_with_the_recording(tmp_path):
    """Two calls of one stateful sample in flight at once: the second is refused, so a call that started before the
    sample left the recording is never served the recorded state while the live environment ran another history."""

    async def episode(env, amounts, concurrent):
        with Journal(str(tmp_path / "j")) as journal:
            engine = ToolEngine(journal, "cache")
            reset = journaled_tool(env.reset, engine, "env.reset", environment="env")
            add = journaled_tool(env.add, engine, "env.add", environment="env")
            seen = [reset.at(step=1, sample=0)()]
            calls = [add.at(step=1, sample=0, turn=1) for _ in amounts]
            if not concurrent:
                return seen + [await call(amount=amount) for call, amount in zip(calls, amounts)]
            together = (call(amount=amount) for call, amount in zip(calls, amounts))
            return seen + await asyncio.gather(*together, return_exceptions=True)

    assert asyncio.run(episode(MixedTally(), [1, 2], concurrent=False)) == ["0", "1", "3"]
    live = MixedTally()
    # add(9) is the sample's 2nd call, a miss; add(2) its 3rd, the recording's 3rd request: served "3" (a state
    # after add(1)) while the live environment ran reset and add(9), it would mix the two.
    seen = asyncio.run(episode(live, [9, 2], concurrent=True))
    assert seen[:2] == ["0", "9"] and isinstance(seen[2], ToolCallError)
    assert "another call of the sample is under way" in str(seen[2])
    assert live.ran == ["reset", 9]


@pytest.mark.parametrize("spec", ["tool.calculator:nearest", "tools:repeat", "tool.calculator:replay@1-3",
                                  {"tools": "nearest", "generate": "cache"}])
def test_a_per_stage_spec_whose_tool_stage_serves_other_records_is_refused_when_the_engine_is_made(journal, spec):
    """Not at the tool's first call, which may come many steps into a run."""
    with pytest.raises(SpecError, match="cannot decide tool calls"):
        ToolEngine(journal, spec)


@pytest.mark.parametrize(("spec", "tools", "meant"), [("tool:replay", None, "tools"), ("TOOLS:replay", None, "tools"),
                                                       ("Tool.calculator:replay", ["calculator"], "tool.calculator"),
                                                       ("tool_calculator:replay", ["calculator"], "tool.calculator")])
def test_a_misspelt_tools_entry_is_refused_not_left_to_bypass_every_tool(journal, spec, tools, meant):
    with pytest.raises(SpecError, match=f"did you mean '{meant}'"):
        ToolEngine(journal, spec, tools=tools)


def test_a_sync_miss_catches_up_an_environments_async_calls_too(tmp_path):
    """An environment with a sync reset and reward and async steps, killed before its reward was recorded: the
    reward's miss (a sync call) runs the served async steps again, awaited, before the reward runs live."""

    def episode(env, with_reward):
        with Journal(str(tmp_path / "j")) as journal:
            engine = ToolEngine(journal, "cache")
            reset = journaled_tool(env.reset, engine, "env.reset", environment="env")
            add = journaled_tool(env.add, engine, "env.add", environment="env")
            reward = journaled_tool(env.reward, engine, "env.reward", environment="env")
            seen = [reset.at(step=1, sample=0)()]

            async def steps():
                return [await add.at(step=1, sample=0, turn=turn)(amount=turn) for turn in (1, 2)]

            seen += asyncio.run(steps())
            return seen + ([reward.at(step=1, sample=0, turn=3)()] if with_reward else [])

    assert episode(MixedTally(), with_reward=False) == ["0", "1", "3"]  # the process ended before the reward
    live = MixedTally()
    assert episode(live, with_reward=True) == ["0", "1", "3", "30"]
    assert live.ran == ["reset", 1, 2, "reward"]


@pytest.mark.parametrize("policy", ["cache", "replay"])
def test_a_step_that_is_not_an_int_is_refused_naming_it(journal, policy):
    from stepjournal.errors import InvalidKeyError

    tool = journaled_tool(Counted(), journal, "add", policy)
    with pytest.raises(InvalidKeyError, match="step 1.5 is not valid"):
        tool.at(step=1.5, sample=0)(a=1, b=2)


def test_an_environments_tool_wrapped_with_a_journal_instead_of_a_shared_engine_is_refused(journal):
    """Each such tool had an engine of its own, so the environment's calls were not one sequence per sample: a
    replay served reset from the recording and ran add live on an environment never reset (and recorded it)."""
    env = MixedTally()
    with pytest.raises(TypeError, match=r"share one ToolEngine: pass ToolEngine\(journal, policy\)"):
        journaled_tool(env.reset, journal, "tally.reset", "cache", environment="tally")


def test_the_first_tool_difference_keeps_modes_apart():
    """A train call and a validate call at the same step and key are two calls, not one call's older and newer
    answer (which was the later of the two in each side's log)."""
    from stepjournal.tools import ToolCallRow

    def row(mode, text):
        return ToolCallRow(seq=0, session="s", run="r", step=1, mode=mode, stage="tool.search", tool="search",
                           key=ToolCallKey(0), outcome="recorded", request=ToolRequest.of("search", {"q": mode}),
                           response=ToolResponse(text), duration_s=0.0)

    train, validate = row("train", "1"), row("validate", "2")
    assert first_tool_difference([train, validate], [validate, train]) is None
    assert "(validate)" in first_tool_difference([train, validate], [train, row("validate", "3")])


def test_a_lambda_without_a_name_is_refused_as_every_lambda_shares_its_name(journal):
    """Two lambdas were both the tool '<lambda>': a call of one was served the other's response to the same
    arguments (2 * 3 answered 5)."""
    with pytest.raises(TypeError, match="pass name="):
        journaled_tool(lambda a, b: str(a + b), journal)
    mul = journaled_tool(lambda a, b: str(a * b), journal, "mul")
    assert mul.at(step=1, sample=0)(a=2, b=3) == "6"


def test_a_counted_call_index_follows_an_explicit_one_in_the_same_turn(tmp_path):
    """The counted call took c0 again after an explicit c0, and its record hid the first call's from the index: a
    replay of the same calls missed the first request."""
    path = str(tmp_path / "j")

    def calls(policy):
        with Journal(path) as journal:
            search = journaled_tool(lambda q: f"results for {q}", journal, "search", policy)
            first = search.at(step=1, sample=0, call=0)(q="a")
            with tool_turn(step=1, sample=0):
                return [first, search(q="b")]

    assert calls("cache") == ["results for a", "results for b"]
    assert calls("replay") == ["results for a", "results for b"]
