"""verl's real ToolAgentLoop in the V1 trainer, its tool calls journaled; each phase in a new process.

Real (verl 0.9.1): the sync V1 trainer's ``fit()``, Hydra's composition of its config, TransferQueue, the
``AgentLoopWorkerTQ`` Ray actor running ``ToolAgentLoop`` (selected under its ``tool_agent`` name by an
agent-loop config file, as `JournaledToolAgentLoop`), verl's ``HermesToolParser``, its tool loading
(``multi_turn.function_tool_path`` for the calculator ``@function_tool``, ``multi_turn.tool_config_path`` for
the sandbox ``BaseTool``) and its dispatch (``_call_tool``: the function call; create / execute / release).
The sandbox runs the model's code in a Python subprocess. Executions are counted from the lines the tools
write (the sandbox's execute line by its subprocess), in the worker's process. Stand-in: the LLM server
(tests/verl_tool_standins.py: hermes tool calls, a pure function of the conversation).

Process 1 records (``generate:cache/tools:cache``). Then, each in a new process: replay of both;
generation live with the tools replayed; the stand-in changed at turn 1 (its sandbox code) under
``tools:replay`` (refused), then under ``tools:cache`` (the tools run and are recorded).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from doc_lines import run_line

pytestmark = pytest.mark.e2e  # verl's V1 trainer end to end, on a Ray cluster: `make test-fast` leaves it out

HERE = Path(__file__).parent.parent
HARNESS = HERE / "verl_v1_harness.py"
PHASES = ("tools_record", "tools_replay", "tools_live", "tools_changed_replay", "tools_changed_cache")
STEPS, SAMPLES = (1, 2, 3), 8  # train_batch_size 4, rollout.n 2
# What a trajectory is: its prompt (dataset index, session), tokens, masks, log-probs, reward and advantage
# (timings differ in every run).
TRAJECTORY = ("index", "session_id", "prompts", "responses", "response_mask", "rollout_log_probs", "rm_scores",
              "num_turns", "advantages")


def _audit(path: str) -> dict:
    """`stepjournal audit PATH --tools`, through a shell as typed; the per-step table and its --json."""
    typed = f"stepjournal audit {path} --tools"
    shown, as_json = run_line(typed, None, timeout=300), run_line(typed + " --json", None, timeout=300)
    assert shown.returncode == 0 and as_json.returncode == 0, shown.stderr + as_json.stderr
    return {"text": shown.stdout, "steps": json.loads(as_json.stdout)["steps"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("v1_tools")
    out = {}
    for phase in PHASES:
        counts = root / "counts" / phase
        counts.mkdir(parents=True)
        env = {**os.environ, "VERL_TOOL_COUNTS": str(counts), "PYTHONPATH": str(HERE)}  # Ray workers import the tools
        result = subprocess.run([sys.executable, str(HARNESS), str(root), phase, str(root / f"{phase}.json")],
                                capture_output=True, text=True, timeout=1800, cwd=HERE, env=env)  # a hang detector only
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
        out[phase] = json.loads((root / f"{phase}.json").read_text())[phase]
        out[phase]["audit"] = _audit(out[phase]["journal"])
        print(phase, "tool executions:", out[phase]["executions"], "audit per step:",
              [(s["step"], s["calls"], s["misses"], s["refused"]) for s in out[phase]["audit"]["steps"]])
    return out


def _trajectories(run):
    """Each actor update's trajectories by prompt and session: a live run's finish in another order, and verl
    hands them to the actor in the order they finished (a replay serves the recorded order)."""
    return [sorted(({name: update[name][row] for name in TRAJECTORY} for row in range(len(update["keys"]))),
                   key=lambda t: (t["index"], t["session_id"])) for update in run["updates"]]


def _outcomes(run):
    return Counter((call["tool"], call["outcome"]) for call in run["tool_calls"])


def test_a_recorded_agentic_run_journals_every_call_of_both_tools(runs):
    recorded = runs["tools_record"]
    calls = len(STEPS) * SAMPLES
    # Two calculator calls a sample; the sandbox's create, execute (a subprocess) and release once.
    assert recorded["executions"] == {"calculator": 2 * calls, "sandbox": 3 * calls}
    assert _outcomes(recorded) == {("calculator", "miss"): 2 * calls, ("sandbox.create", "miss"): calls,
                                   ("sandbox.execute", "miss"): calls, ("sandbox.release", "miss"): calls}
    assert [a[:2] for a in recorded["actions"]] == [["generated", s] for s in STEPS]
    sample = [c for c in recorded["tool_calls"] if c["step"] == 1 and c["sample"] == 0]
    assert [(c["key"], c["request"], c["response"]) for c in sample] == [
        ("s0.t0.c0", 'calculator({"expression":"0+0"})', "0"),
        ("s0.t1.c0", 'sandbox.create({"create_kwargs":{}})', ""),
        ("s0.t1.c1", 'sandbox.execute({"code":"print(0 * 2)"})', "0"),
        ("s0.t1.c2", "sandbox.release({})", ""),
        ("s0.t2.c0", 'calculator({"expression":"0-1"})', "-1"),
    ]
    assert {s["run"] for s in recorded["audit"]["steps"]} == {recorded["run"]}
    assert [(s["step"], s["calls"], s["misses"]) for s in recorded["audit"]["steps"]] == [
        (s, 5 * SAMPLES, 5 * SAMPLES) for s in STEPS]


def test_a_replay_of_generate_and_tools_executes_no_tool_and_hands_the_actor_the_same_batches(runs):
    recorded, replayed = runs["tools_record"], runs["tools_replay"]
    assert replayed["executions"] == {"calculator": 0, "sandbox": 0}
    assert replayed["generate_calls"] == 0  # the LLM server raises in this process
    assert [a[:2] for a in replayed["actions"]] == [["replayed", s] for s in STEPS]
    assert replayed["updates"] == recorded["updates"]  # every field: trajectories, rewards, advantages
    assert any(1.0 in row for update in recorded["updates"] for row in update["rm_scores"])


def test_tools_replayed_while_generation_runs_live_give_the_same_trajectories_and_execute_no_tool(runs):
    recorded, live = runs["tools_record"], runs["tools_live"]
    assert live["executions"] == {"calculator": 0, "sandbox": 0}
    assert live["generate_calls"] == recorded["generate_calls"] > 0  # the stand-in generated every turn again
    assert _trajectories(live) == _trajectories(recorded)
    assert set(_outcomes(live)) == {("calculator", "replayed"), ("sandbox.create", "replayed"),
                                    ("sandbox.execute", "replayed"), ("sandbox.release", "replayed")}
    assert sum(_outcomes(live).values()) == 5 * len(STEPS) * SAMPLES


def test_a_generation_changed_at_one_turn_misses_from_there_on_under_each_rule_and_audit_counts_them(runs):
    calls = len(STEPS) * SAMPLES
    refused, cached = runs["tools_changed_replay"], runs["tools_changed_cache"]
    # replay: the turn-0 calculator and the sandbox's create are served; the changed execute is refused, and so
    # is every later call of the sample (its release, the calculator on what the model read then).
    assert refused["executions"] == {"calculator": 0, "sandbox": 0}
    # (A refusal journals no request: its row names the stage's tool, the environment.)
    assert _outcomes(refused) == {("calculator", "replayed"): calls, ("sandbox.create", "replayed"): calls,
                                  ("sandbox", "refused"): 2 * calls, ("calculator", "refused"): calls}
    # cache: the same misses run the real tools (the sandbox caught up first: its served create run again).
    assert cached["executions"] == {"calculator": calls, "sandbox": 3 * calls}
    assert _outcomes(cached) == {("calculator", "replayed"): calls, ("sandbox.create", "replayed"): calls,
                                 ("sandbox.create", "caught up"): calls, ("sandbox.execute", "miss"): calls,
                                 ("sandbox.release", "miss"): calls, ("calculator", "miss"): calls}
    changed = [c for c in cached["tool_calls"] if c["step"] == 1 and c["sample"] == 0 and c["outcome"] == "miss"]
    assert [(c["key"], c["request"], c["response"]) for c in changed] == [
        ("s0.t1.c1", 'sandbox.execute({"code":"print(0 * 2 + 1)"})', "1"),
        ("s0.t1.c2", "sandbox.release({})", ""),
        ("s0.t2.c0", 'calculator({"expression":"1-1"})', "0"),
    ]
    # `stepjournal audit --tools`, through a shell after each phase: the misses each changed run added, per step.
    before = {s["step"]: s for s in runs["tools_live"]["audit"]["steps"]}
    after_replay = {s["step"]: s for s in refused["audit"]["steps"]}
    after_cache = {s["step"]: s for s in cached["audit"]["steps"]}
    for step in STEPS:
        assert after_replay[step]["refused"] - before[step]["refused"] == 3 * SAMPLES
        assert after_replay[step]["misses"] - before[step]["misses"] == 3 * SAMPLES  # refusals are misses
        assert after_cache[step]["misses"] - after_replay[step]["misses"] == 3 * SAMPLES
        assert after_cache[step]["refused"] == after_replay[step]["refused"]
    print("audit after the changed runs:\n" + cached["audit"]["text"].split("per step")[-1])


def test_show_text_renders_a_sample_as_its_turns_in_each_session(runs):
    """`stepjournal show PATH 1 --text --sample 0` through a shell: the recording, then each run after it."""
    path = runs["tools_changed_cache"]["journal"]
    shown = run_line(f"stepjournal show {path} 1 --text --sample 0", None, timeout=300)
    assert shown.returncode == 0, shown.stderr
    sessions = shown.stdout.split("step 1 sample 0 · session ")[1:]
    assert len(sessions) == 4  # record, live, changed under replay, changed under cache (a replay runs no loop)
    assert 'turn 1\n    sandbox.create({"create_kwargs":{}})  miss' in sessions[0]
    assert 'sandbox.execute({"code":"print(0 * 2)"})  miss\n      → 0\n' in sessions[0]
    assert 'calculator({"expression":"0-1"})  replayed\n      → -1' in sessions[1]
    assert 'sandbox.execute({"code":"print(0 * 2 + 1)"})  miss\n      → 1' in sessions[3]
    assert 'calculator({"expression":"1-1"})  miss\n      → 0' in sessions[3]
