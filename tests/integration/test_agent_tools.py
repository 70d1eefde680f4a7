"""A hand-written agent loop's tools (a calculator and a sandbox that runs Python in a subprocess) recorded in
one process and replayed in new ones: 0 tool executions and the same trajectories; a live generation
changed at turn 2 misses from there on, under each rule; concurrent async samples; the counts read back."""

from __future__ import annotations

from typing import Any, Dict

import pytest

import json
import os
import subprocess
import sys
from pathlib import Path

from agent_tools import run_async_phase, run_phase
from cli_support import run_cli
from reliability_support import worker_context
from stepjournal import Journal
from stepjournal.tools import tool_call_rows, tool_step_summaries


def _child(queue: Any, phase: str, args: tuple, kwargs: dict) -> None:
    run = {"sync": run_phase, "async": run_async_phase}[phase]
    queue.put(run(*args, **kwargs))


def in_new_process(phase: str, *args: Any, **kwargs: Any) -> Dict[str, Any]:
    """Run a phase of the loop in a fresh process; what it returns."""
    ctx = worker_context()
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, phase, args, kwargs))
    proc.start()
    result = queue.get(timeout=300)
    proc.join(60)
    assert proc.exitcode == 0
    return result


@pytest.fixture
def recorded(tmp_path):
    """A journal of two steps of three samples, recorded with `cache` (every call a miss: both tools run)."""
    path = str(tmp_path / "agents")
    first = in_new_process("sync", path, "cache")
    assert first["executions"] == {"calculator": 12, "sandbox": 24} and first["misses"] == []
    return path, first


def test_replay_in_a_new_process_runs_no_tool_and_gives_the_same_trajectories(recorded):
    path, first = recorded
    again = in_new_process("sync", path, "replay")
    assert again["executions"] == {"calculator": 0, "sandbox": 0}
    assert again["trajectories"] == first["trajectories"]
    assert first["trajectories"]["2/1"][3] == (2, "sandbox.execute", {"instance": "i1", "code": "print(x * 2)"}, "6")
    with Journal(path, readonly=True) as journal:
        summaries = tool_step_summaries(tool_call_rows(journal))
    # Recording with cache, each sample's second "s+t" was already served from its turn 0: 3 replays a step.
    assert [(s.step, s.calls, s.replayed, s.misses) for s in summaries] == [(1, 42, 24, 18), (2, 42, 24, 18)]
    assert all(s.saved_s > 0 for s in summaries)


def test_a_generation_changed_at_turn_2_misses_from_there_on_and_cache_records_the_live_calls(recorded):
    path, first = recorded
    changed = in_new_process("sync", path, "cache", changed_sample=0, shift=True)
    # Per step: the sandbox's catch-up (create, first execute), the changed execute and the release run;
    # the calculator runs the new request only: its turn-0 request, asked again at the shifted turn, is served.
    assert changed["executions"] == {"calculator": 2, "sandbox": 8}
    assert changed["misses"] == []
    live = changed["trajectories"]["1/0"]
    assert live[3] == (2, "sandbox.execute", {"instance": "i0", "code": "print(x * 3)"}, "3")
    assert [turn for turn, *_ in live] == [0, 0, 1, 2, 4, 4, 4]
    for name in ("1/1", "1/2", "2/1", "2/2"):
        assert changed["trajectories"][name] == first["trajectories"][name]
    with Journal(path, readonly=True) as journal:
        rows = tool_call_rows(journal)
    rows = [row for row in rows if row.session == rows[-1].session]
    summaries = tool_step_summaries(rows)
    assert [(s.step, s.calls, s.replayed, s.misses, s.refused) for s in summaries] == [(1, 21, 18, 3, 0),
                                                                                      (2, 21, 18, 3, 0)]
    sample0 = [(str(row.key), row.tool, row.outcome) for row in rows if row.step == 1 and row.key.sample == 0]
    assert sample0 == [
        ("s0.t0.c0", "calculator", "replayed"), ("s0.t0.c1", "sandbox.create", "replayed"),
        ("s0.t1.c0", "sandbox.execute", "replayed"),
        ("s0.t0.c1", "sandbox.create", "caught up"), ("s0.t1.c0", "sandbox.execute", "caught up"),
        ("s0.t2.c0", "sandbox.execute", "miss"), ("s0.t4.c0", "calculator", "miss"),
        ("s0.t4.c1", "calculator", "replayed"), ("s0.t4.c2", "sandbox.release", "miss"),
    ]
    # The command line counts the same, and names the changed call and the catch-up.
    done = run_cli("audit", path, "--tools", "--json", "--steps", "1")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert [(s["calls"], s["replayed"], s["misses"]) for s in shown["steps"]] == [(42, 21, 21)]
    assert shown["steps"][0]["saved_s"] > 0
    text = run_cli("show", path, "1", "--text", "--sample", "0").stdout
    assert 'sandbox.execute({"code":"print(x * 3)","instance":"i0"})  miss' in text
    assert text.count("caught up") == 2 and "session 2 of 2" in text
    # diff names the first tool call that answers otherwise than in a journal recorded unchanged.
    unchanged = str(Path(path).parent / "unchanged")
    in_new_process("sync", unchanged, "dump")
    done = run_cli("diff", unchanged, path, "--tools")
    assert done.returncode == 1, done.stderr
    assert done.stdout.split() == ("first differing tool response: step 1 tool.sandbox s0.t2.c0: the requests differ "
                                   '(sandbox.execute({"code":"print(x * 2)","instance":"i0"}) vs '
                                   'sandbox.execute({"code":"print(x * 3)","instance":"i0"}))').split()
    assert run_cli("diff", unchanged, unchanged, "--tools").returncode == 0
    # Recorded now: the changed sample replays its new history, with no tool run.
    again = in_new_process("sync", path, "replay", changed_sample=0, shift=True)
    assert again["executions"] == {"calculator": 0, "sandbox": 0}
    assert again["trajectories"] == changed["trajectories"]


def test_show_text_and_audit_tools_through_a_shell_name_each_turn_and_the_tool_time_saved(recorded, tmp_path):
    """The two reading lines as a user types them in bash: `show --text` renders the changed sample's turns, each
    call with its arguments, response and outcome; `audit --tools` ends with the per-step table whose `saved`
    column is the tool time the replays saved."""
    path, _ = recorded
    in_new_process("sync", path, "cache", changed_sample=0, shift=True)
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}", "J": path}
    shown = subprocess.run(["bash", "-c", 'stepjournal show "$J" 1 --text --sample 0'], env=env,
                           capture_output=True, text=True, timeout=600)
    assert shown.returncode == 0, shown.stderr
    last = shown.stdout[shown.stdout.index("session 2 of 2"):].splitlines()
    assert last[1:8] == ["  turn 0", '    calculator({"expression":"0+1"})  replayed', "      → 1",
                         '    sandbox.create({"instance":"i0"})  replayed', "      → created i0",
                         "  turn 1", '    sandbox.execute({"code":"x = 1","instance":"i0"})  replayed']
    assert '    sandbox.execute({"code":"print(x * 3)","instance":"i0"})  miss' in last
    audit = subprocess.run(["bash", "-c", 'stepjournal audit "$J" --tools --steps 1'], env=env,
                           capture_output=True, text=True, timeout=600)
    assert audit.returncode == 0, audit.stderr
    table = audit.stdout.splitlines()
    assert table[table.index("per step") + 1].split() == ["step", "calls", "replayed", "misses", "refused",
                                                          "tool", "time", "saved"]
    step, calls, replayed, misses, refused, tool_time, saved = table[table.index("per step") + 3].split()
    assert (step, calls, replayed, misses, refused) == ("1", "42", "21", "21", "0")
    with Journal(path, readonly=True) as journal:
        (summary,) = tool_step_summaries(tool_call_rows(journal, steps={1}, payloads=False))
    assert saved == f"{summary.saved_s:.2f}s" and summary.saved_s > 0


def test_under_replay_the_changed_call_is_refused_naming_its_request_and_nothing_runs(recorded):
    path, first = recorded
    refused = in_new_process("sync", path, "replay", changed_sample=0)
    assert refused["executions"] == {"calculator": 0, "sandbox": 0}
    assert refused["misses"] == [
        {"step": step, "stage": "tool.sandbox", "key": "s0.t2.c0",
         "request": 'sandbox.execute({"code":"print(x * 3)","instance":"i0"})'} for step in (1, 2)
    ]
    assert "1/0" not in refused["trajectories"] and refused["trajectories"]["1/1"] == first["trajectories"]["1/1"]
    with Journal(path, readonly=True) as journal:
        rows = tool_call_rows(journal)
        last = [row for row in rows if row.session == rows[-1].session]
    assert [(s.misses, s.refused) for s in tool_step_summaries(last)] == [(1, 1), (1, 1)]


def test_concurrent_async_samples_record_and_replay_in_new_processes(tmp_path):
    path = str(tmp_path / "async")
    first = in_new_process("async", path, "cache")
    assert first["executions"] == {"calculator": 24, "sandbox": 72}
    assert first["results"][5] == ["6", "created i5", "60", "released i5"]
    again = in_new_process("async", path, "replay")
    assert again["executions"] == {"calculator": 0, "sandbox": 0}
    assert again["results"] == first["results"]
