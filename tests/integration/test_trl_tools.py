"""TRL's real `GRPOTrainer` with ``tools=`` (a sync calculator, an async Python runner) and with an
``environment_factory`` (a stateful sandbox: reset, its tool method, ``get_reward``), each tool call journaled.

Only generation is a stand-in (tests/trl_tool_runs.py): a seeded script that writes each turn as the
Qwen2.5 chat template's tool-call text, which TRL parses with its own response schema. The tiny model
cannot learn to call tools (it trains on tokens it did not sample); everything else is TRL's: its tool
loop, its environments, its rewards and its training. The tools really run: executions are counted by
the calculator and the sandbox's subprocess runs, not by the journal.

Every phase is a new process started through bash with docs/agents.md's lines (the runner,
``STEPJOURNAL=PATH:SPEC python -m stepjournal.adapters.trl``), on a copy of the recorded journal:
recorded; generation and tools replayed (0 executions, metrics bit for bit); tools replayed while the
stand-in generates live (0 executions, the same trajectories); the stand-in changed at one turn of one
sample (its later calls are misses: ``cache`` runs and records them, ``replay`` refuses), counted by
``stepjournal audit --tools`` through the shell.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List

import pytest

from doc_lines import run_line
from trl_tool_runs import KINDS, assert_unchanged, copy_recording as _copy, doc_lines, recording, replay
from trl_tool_runs import run_phase as _run

from stepjournal import Journal
from stepjournal.tools import tool_call_rows, tool_step_summaries

DOC_LINES = doc_lines()
RECORD, REPLAY, LIVE, CHANGED, AUDIT = (line.text for line in DOC_LINES)

# Per kind: the tools' executions when recording (two rollout batches of 8 samples), the calls journaled,
# and, when sample 2 of step 0 changes at turn 2, the calls that miss, what `cache` runs, what `replay` refuses.
EXPECTED: Dict[str, Dict[str, Any]] = {
    # 4 calls a sample: calculator(a*b); python(print(v+1)) and calculator(v-1); calculator(w*2).
    # Changed: python(print(v+2)) and the calculator call that reads its output miss; calculator(v-1) is served.
    "tools": {"recorded": {"calculator": 48, "sandbox": 16}, "calls": 64,
              "missed": [("s2.t2.c0", "python"), ("s2.t3.c0", "calculator")],
              "cache_runs": {"calculator": 1, "sandbox": 1}, "refused_stage": "tool.python"},
    # 5 calls a sample, one sequence: reset, python(x = a*b), python(print(x + 1)), python(print(.. * 2)), get_reward.
    # Changed: from python(print(x + 2)) on, every call of the sample misses; the catch-up runs reset and the
    # first python again on the live sandbox (create, execute), then the two pythons run: 4 sandbox runs.
    "env": {"recorded": {"calculator": 0, "sandbox": 72}, "calls": 80,
            "missed": [("s2.t2.c0", "SandboxEnv"), ("s2.t3.c0", "SandboxEnv"), ("s2.t4.c0", "SandboxEnv")],
            "cache_runs": {"calculator": 0, "sandbox": 4}, "refused_stage": "tool.SandboxEnv"},
}


def _last_session(folder: Path) -> List[Any]:
    with Journal(str(folder / "runs" / "tools"), readonly=True) as journal:
        rows = tool_call_rows(journal)
    return [row for row in rows if row.session == rows[-1].session]


def _samples(result: Dict[str, Any]) -> Dict[str, Any]:
    """Each sample's conversation and rewards, by ``step/sample``."""
    found = {}
    for batch in result["batches"]:
        for sample, completion in enumerate(batch["completions"]):
            rewards = {name: values[sample] for name, values in batch["rewards"].items()}
            found[f"{batch['step']}/{sample}"] = (completion, rewards)
    return found


@pytest.fixture(scope="module", params=KINDS)
def recorded(request, tmp_path_factory):
    """One recording per kind, in a new process (made once per test run, shared with test_trl_tools_show.py):
    every tool call ran and was recorded."""
    kind = request.param
    folder, result = recording(tmp_path_factory, kind)
    assert result["executions"] == EXPECTED[kind]["recorded"] and result["refused"] is None
    rows = _last_session(folder)
    assert len(rows) == EXPECTED[kind]["calls"] and {row.outcome for row in rows} == {"miss"}
    # Sample 2 of step 0 went through every turn, as the changed runs assume.
    assert _samples(result)["0/2"][0][-1]["content"].startswith("answer ")
    yield kind, folder, result
    assert_unchanged(folder)  # every phase ran on its own copy


def test_the_docs_show_the_lines_this_module_runs():
    assert RECORD.startswith("STEPJOURNAL=runs/tools:generate:cache/tools:cache python -m stepjournal.adapters.trl")
    assert "generate:replay/tools:replay" in REPLAY and "STEPJOURNAL=runs/tools:tools:replay " in LIVE
    assert "STEPJOURNAL=runs/tools:tools:cache " in CHANGED and AUDIT == "stepjournal audit runs/tools --tools"


def test_generation_and_tools_replayed_run_no_tool_and_log_bit_for_bit(recorded, tmp_path_factory):
    kind, _, first = recorded
    replayed, again = replay(tmp_path_factory, kind)  # a copy of the recording, replayed (shared with the show test)
    assert again["executions"] == {"calculator": 0, "sandbox": 0}
    assert again["batches"] == first["batches"]  # completions (tool calls, responses) and rewards
    assert again["logged"] == first["logged"]  # losses, grad norms, rewards, tool frequencies: floats as exact hex
    assert any(entry.get("loss") not in (None, "0x0.0p+0") for entry in first["logged"])  # it trained on something
    rows = _last_session(replayed)
    assert len(rows) == EXPECTED[kind]["calls"] and {row.outcome for row in rows} == {"replayed"}


def test_tools_replayed_while_the_stand_in_generates_live_give_the_same_trajectories(recorded, tmp_path):
    kind, folder, first = recorded
    live = _run(LIVE, _copy(folder, tmp_path / "live"), kind)
    assert live["executions"] == {"calculator": 0, "sandbox": 0}
    assert _samples(live) == _samples(first)
    assert live["logged"] == first["logged"]  # the seeded stand-in drew what it drew when recording
    with Journal(str(tmp_path / "live" / "runs" / "tools"), readonly=True) as journal:
        session = [event.session for _, event in journal.sessions()][-1]
        generated = [r.action for r in journal.audit() if r.session == session and r.stage == "generate"]
    assert generated and set(generated) == {"bypassed"}  # generation ran live, outside the journal
    assert {row.outcome for row in _last_session(tmp_path / "live")} == {"replayed"}


def _audit_per_step(folder: Path) -> Dict[int, Dict[str, int]]:
    """``stepjournal audit runs/tools --tools`` through the shell: its per-step table, as printed."""
    done = run_line(AUDIT, folder, env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = lines.index("per step")
    header = lines[start + 1].split()
    assert header[:5] == ["step", "calls", "replayed", "misses", "refused"], header
    table = {}
    for line in lines[start + 3:]:
        cells = line.split()
        if cells and cells[0].isdigit():
            table[int(cells[0])] = dict(zip(header[1:5], map(int, cells[1:5])))
    return table


def test_a_stand_in_changed_at_one_turn_misses_from_there_on_and_cache_runs_and_records_them(recorded, tmp_path):
    kind, folder, first = recorded
    expected = EXPECTED[kind]
    changed = _run(CHANGED, _copy(folder, tmp_path / "changed"), kind, change=True)
    assert changed["refused"] is None
    assert changed["executions"] == expected["cache_runs"]  # only the calls after the change ran
    before, after = _samples(first), _samples(changed)
    assert [name for name in before if before[name] != after[name]] == ["0/2"]
    rows = _last_session(tmp_path / "changed")
    misses = [(str(row.key), row.tool if kind == "tools" else "SandboxEnv") for row in rows if row.outcome == "miss"]
    assert misses == expected["missed"]
    if kind == "env":  # the recorded state is never mixed with the live sandbox: served calls run again first
        caught = [(str(row.key), row.tool) for row in rows if row.outcome == "caught up"]
        assert caught == [("s2.t0.c0", "reset"), ("s2.t1.c0", "python")]
    (summary_0, summary_2) = tool_step_summaries(rows)
    assert (summary_0.step, summary_0.misses, summary_2.step, summary_2.misses) == (0, len(misses), 2, 0)
    # The audit, run through the shell, counts them: the recording's calls (each a miss of an empty journal)
    # and this session's.
    printed = _audit_per_step(tmp_path / "changed")
    half = expected["calls"] // 2
    assert printed[0]["misses"] == half + len(misses) and printed[2]["misses"] == half
    assert printed[0]["refused"] == 0
    print(f"{kind}: audit counts {printed[0]['misses'] - half} misses at step 0 of the changed run")


def test_a_stand_in_changed_at_one_turn_is_refused_under_replay(recorded, tmp_path):
    kind, folder, _ = recorded
    refused = _run(LIVE, _copy(folder, tmp_path / "refused"), kind, change=True)
    assert refused["executions"] == {"calculator": 0, "sandbox": 0}
    assert refused["refused"]["error"] == "ToolReplayMissError"
    assert (refused["refused"]["stage"], refused["refused"]["key"], refused["refused"]["step"]) == (
        EXPECTED[kind]["refused_stage"], "s2.t2.c0", 0)
    assert re.fullmatch(r'python\(\{"code":"print\((x|\d+) ?\+ ?2\)"\}\)', refused["refused"]["request"])
    printed = _audit_per_step(tmp_path / "refused")
    assert printed[0]["refused"] == 1
