"""``stepjournal show STEP --text --sample S`` of a real TRL GRPO journal, through the shell: each turn's assistant
text above the tool calls it made, each call with its arguments, response and outcome.

TRL's tool loop journals each turn's generation as a generate call of its own (only the samples that called a tool
take part in the next); the reader ties a later call's rows to the samples whose conversations they continue, and
puts each turn's text above the calls journaled after its generate call. The journal is tests/trl_tool_runs.py's
setup, recorded and then replayed (generation and tools) with docs/agents.md's lines, each in a new process; only
generation is a stand-in (the tiny model cannot learn to call tools).
"""

from __future__ import annotations

from pathlib import Path
import json
from typing import List, Tuple

import pytest

from doc_lines import run_line
from trl_tool_runs import KINDS, assert_unchanged, recording, replay

SHOW = "stepjournal show runs/tools 0 --text --sample 2"


@pytest.fixture(scope="module", params=KINDS)
def replayed(request, tmp_path_factory):
    """A recording and its replay (generation and tools) in one journal: the recording's session, then the replay's
    (each made once per test run, shared with test_trl_tools.py; show only reads it)."""
    kind = request.param
    _, first = recording(tmp_path_factory, kind)
    again, _ = replay(tmp_path_factory, kind)
    yield kind, again, first
    assert_unchanged(again)


def _show(folder: Path) -> List[str]:
    done = run_line(SHOW, folder, env={"COLUMNS": "200", "PAGER": "cat"})
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _sessions(lines: List[str]) -> List[List[str]]:
    starts = [i for i, line in enumerate(lines) if line.startswith("step 0 sample 2 · session ")]
    return [lines[a:b] for a, b in zip(starts, starts[1:] + [len(lines)])]


def _assistant_turns(result) -> List[dict]:
    """Sample 2's assistant messages at step 0 as TRL built them when recording, each with its tool messages."""
    (batch,) = [b for b in result["batches"] if b["step"] == 0]
    turns: List[dict] = []
    for message in batch["completions"][2]:
        if message["role"] == "assistant":
            turns.append({"message": message, "responses": {}})
        else:
            turns[-1]["responses"][message["name"]] = message["content"]
    return turns


def _lines_of(turn: dict, outcome: str) -> Tuple[List[str], List[List[str]]]:
    """A turn as show prints it: the assistant lines (the stand-in writes each call as the JSON the Qwen2.5 template
    wraps in tool-call tokens), then per call its line (canonical arguments, outcome) and its response's lines."""
    called = [call["function"] for call in turn["message"].get("tool_calls", [])]
    said = [f"    assistant: {json.dumps(call)}" for call in called] or [f"    assistant: {turn['message']['content']}"]
    calls = [[f"    {call['name']}({json.dumps(call['arguments'], sort_keys=True, separators=(',', ':'))})  {outcome}"]
             + [f"      → {line}".rstrip() for line in turn["responses"][call["name"]].splitlines() or [""]]
             for call in called]
    return said, calls


def _at(lines: List[str], wanted: List[str], after: int) -> int:
    """Where `wanted` first stands as consecutive lines after line `after`."""
    for i in range(after + 1, len(lines) - len(wanted) + 1):
        if lines[i:i + len(wanted)] == wanted:
            return i
    raise AssertionError(f"{wanted} not after line {after} of:\n" + "\n".join(lines))


def test_show_text_prints_each_turns_assistant_text_above_the_calls_it_made(replayed):
    kind, folder, first = replayed
    turns = _assistant_turns(first)
    assert len(turns) == 4 and turns[-1]["message"]["content"].startswith("answer ")  # three turns call tools
    sessions = _sessions(_show(folder))
    assert len(sessions) == 2, sessions
    for session, outcome in zip(sessions, ("miss", "replayed")):  # the recording ran every tool: each call a miss
        # Lines as typed (no trailing blanks), less the blank assistant lines between two tool calls' tokens.
        shown = [line.rstrip() for line in session if line.strip() != "assistant:"]
        where = 0
        for number, turn in enumerate(turns[:2]):  # turn 0 and turn 1: the text, then each of its calls
            said, calls = _lines_of(turn, outcome)
            text = _at(shown, said[:1], where)
            # The journal keys a TRL tool call by the generations before it: turn N's calls are at key turn N + 1.
            assert shown[text - 1] == f"  turn {number + 1}", shown
            assert all(line in shown[text:text + len(said) + 1] for line in said)
            where = text
            for call in calls:  # each call below its turn's text and above the next turn's
                assert _at(shown, call, text) < _at(shown, _lines_of(turns[number + 1], outcome)[0][:1], text)
        answer = _at(shown, _lines_of(turns[-1], outcome)[0], where)  # the last answer, which called no tool
        if kind == "env":  # the environment's reset before the first turn, its get_reward after the last
            assert shown[1:4] == ["  turn 0", '    reset({"prompt":[{"content":"compute again","role":"user"}]})  '
                                  f"{outcome}", "      →  (sandbox ready)"]
            assert shown[answer - 1] == "  turn 4" and shown[answer + 1] == f"    get_reward({{}})  {outcome}"
        else:
            assert shown[answer - 1] == "  no tool call" and answer == len(shown) - 1
    print("\n".join(sessions[1]))
