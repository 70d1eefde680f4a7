"""verl's real tool dispatch (``ToolAgentLoop._call_tool``) over journaled tools, in one process, without Ray.

The calculator is a real verl ``FunctionTool``; the sandbox (tests/verl_tool_standins.py) a real verl
``BaseTool`` that runs the model's code in a subprocess; executions are counted from the lines they write.
The V1 trainer around them is tests/e2e/test_verl_tools.py's.
"""

from __future__ import annotations

import asyncio
import json
import pytest

from stepjournal import Journal
from stepjournal.tools import tool_call_rows


def _loop(engine):
    """`JournaledToolAgentLoop` with only what its dispatch reads: the two tools, journaled by `engine`."""
    from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY
    from verl.tools.schemas import OpenAIFunctionToolSchema

    import verl_tool_calculator  # noqa: F401  (registers the calculator @function_tool)
    from stepjournal.adapters.verl import JournaledToolAgentLoop
    from stepjournal.adapters.verl._tool_loop import (  # private: the wrappers under test
        _journaled_base_tool, _journaled_function,
    )
    from verl_tool_standins import SandboxTool

    schema = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
        "name": "sandbox", "description": "Run code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}})
    loop = JournaledToolAgentLoop.__new__(JournaledToolAgentLoop)
    loop.tools = {"calculator": _journaled_function(FUNCTION_TOOL_REGISTRY["calculator"], engine),
                  "sandbox": _journaled_base_tool(SandboxTool({"type": "native"}, schema), engine)}
    loop.max_tool_response_length, loop.tool_response_truncate_side = 256, "middle"
    return loop


async def _sample(loop, step, sample, calls):
    """One sample's turns: each turn one call of (tool, arguments); what the model read back."""
    from verl.experimental.agent_loop.tool_agent_loop import AgentData
    from verl.experimental.agent_loop.tool_parser import FunctionCall
    from stepjournal.adapters.verl import ToolCallPlace
    from stepjournal.adapters.verl._tool_loop import _PLACE  # private: the wrappers' place context

    _PLACE.set(ToolCallPlace(step=step, sample=sample))  # what JournaledToolAgentLoop.run sets for its sample
    data = AgentData([], None, None, None, None, {}, "r", {})
    read = []
    for tool, arguments in calls:
        data.assistant_turns += 1
        data.tool_calls = [FunctionCall(name=tool, arguments=json.dumps(arguments))]
        response, _, _ = await loop._call_tool(data.tool_calls[0], {}, data)
        read.append(response.text)
    return read


def _run(path, policy, code, monkeypatch, counts, first="2+3"):
    from stepjournal.policies import ToolEngine

    monkeypatch.setenv("VERL_TOOL_COUNTS", str(counts))
    counts.mkdir()
    with Journal(str(path), run="tools") as journal:
        loop = _loop(ToolEngine(journal, policy, tools=["calculator", "sandbox"]))
        read = asyncio.run(_sample(loop, 1, 0, [("calculator", {"expression": first}), ("sandbox", {"code": code}),
                                                ("calculator", {"expression": "7-1"})]))
    found = {tool: len((counts / tool).read_text().splitlines()) if (counts / tool).exists() else 0
             for tool in ("calculator", "sandbox")}
    return read, found


def test_verls_dispatch_records_both_tools_and_a_replay_runs_neither(tmp_path, monkeypatch):
    path = tmp_path / "journal"
    recorded = _run(path, "cache", "print(5 * 2)", monkeypatch, tmp_path / "record")
    assert recorded == (["5", "10", "6"], {"calculator": 2, "sandbox": 3})
    assert _run(path, "replay", "print(5 * 2)", monkeypatch, tmp_path / "replay") == (
        ["5", "10", "6"], {"calculator": 0, "sandbox": 0})
    with Journal(str(path), readonly=True) as journal:
        rows = tool_call_rows(journal)
    assert [(str(r.key), str(r.request), r.outcome) for r in rows[:5]] == [
        ("s0.t0.c0", 'calculator({"expression":"2+3"})', "miss"),
        ("s0.t1.c0", 'sandbox.create({"create_kwargs":{}})', "miss"),
        ("s0.t1.c1", 'sandbox.execute({"code":"print(5 * 2)"})', "miss"),
        ("s0.t1.c2", "sandbox.release({})", "miss"),
        ("s0.t2.c0", 'calculator({"expression":"7-1"})', "miss"),
    ]


def test_a_changed_sandbox_call_is_refused_under_replay_and_verl_shows_the_refusal_to_the_model(tmp_path,
                                                                                                 monkeypatch):
    path = tmp_path / "journal"
    _run(path, "cache", "print(5 * 2)", monkeypatch, tmp_path / "record")
    read, found = _run(path, "replay", "print(5 * 3)", monkeypatch, tmp_path / "replay")
    assert found == {"calculator": 0, "sandbox": 0}
    assert read[0] == "5" and read[2] == "6"  # the other requests are served
    assert read[1].startswith("Error executing tool 'sandbox': replay: no recorded response to sandbox.execute")
    with Journal(str(path), readonly=True) as journal:
        last = [r for r in tool_call_rows(journal) if r.session == tool_call_rows(journal)[-1].session]
    # The release verl makes in its `finally` is refused too (the sample left the recording), and ends nothing.
    assert [(r.tool, r.outcome) for r in last] == [("calculator", "replayed"), ("sandbox.create", "replayed"),
                                                  ("sandbox", "refused"), ("sandbox", "refused"),
                                                  ("calculator", "replayed")]


def test_a_changed_sandbox_call_under_cache_catches_up_then_runs_live(tmp_path, monkeypatch):
    path = tmp_path / "journal"
    _run(path, "cache", "print(5 * 2)", monkeypatch, tmp_path / "record")
    read, found = _run(path, "cache", "print(5 * 3)", monkeypatch, tmp_path / "changed")
    assert read == ["5", "15", "6"]
    assert found == {"calculator": 0, "sandbox": 3}  # the served create run again, then execute and release
    with Journal(str(path), readonly=True) as journal:
        rows = tool_call_rows(journal)
        last = [r for r in rows if r.session == rows[-1].session]
    assert [r.outcome for r in last] == ["replayed", "replayed", "caught up", "miss", "miss", "replayed"]


def test_a_verl_spec_may_name_tool_stages_and_a_misspelt_stage_is_still_refused():
    from stepjournal.adapters.verl.v1._stages import check_verl_stages  # private: the stage check under test
    from stepjournal.policies import ConfigError

    assert check_verl_stages("generate:passthrough/tools:replay").stages == ("generate", "tools")
    assert check_verl_stages("generate:cache/tool.sandbox:cache").stages == ("generate", "tool.sandbox")
    with pytest.raises(ConfigError, match="did you mean 'generate'"):
        check_verl_stages("generat:cache/tools:replay")
