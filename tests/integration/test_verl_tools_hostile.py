"""verl's real tool dispatch (``ToolAgentLoop._call_tool``) over journaled tools, with hostile calls: a tool that
raises. The harness is tests/integration/test_verl_tools_units.py's (the real calculator ``FunctionTool`` and the
real subprocess sandbox ``BaseTool``, without Ray)."""

from __future__ import annotations

from test_verl_tools_units import _run


def test_a_tool_that_raised_when_recorded_is_replayed_as_the_same_error_text_and_does_not_run(tmp_path, monkeypatch):
    """verl shows the model ``Error executing tool ...: <error>``; a replay shows the same text (not a refusal's),
    so a live generation reads what it read when recording, and the calculator does not run again."""
    path = tmp_path / "journal"
    recorded, ran = _run(path, "cache", "print(5 * 2)", monkeypatch, tmp_path / "record", first="7 // 0")
    assert recorded[0].startswith("Error executing tool 'calculator': ") and ran["calculator"] == 2
    replayed, ran = _run(path, "replay", "print(5 * 2)", monkeypatch, tmp_path / "replay", first="7 // 0")
    assert replayed == recorded and ran == {"calculator": 0, "sandbox": 0}


def _parallel_turn(path, policy, monkeypatch, counts):
    """One turn in which the model wrote two sandbox calls and a calculator call, dispatched as verl does
    (``asyncio.gather`` of ``_call_tool``, up to ``max_parallel_calls``): what the model read back."""
    import asyncio
    import json

    from verl.experimental.agent_loop.tool_agent_loop import AgentData
    from verl.experimental.agent_loop.tool_parser import FunctionCall

    from stepjournal import Journal
    from stepjournal.adapters.verl import ToolCallPlace
    from stepjournal.adapters.verl._tool_loop import _PLACE  # private: the wrappers' place context
    from stepjournal.policies import ToolEngine
    from test_verl_tools_units import _loop

    monkeypatch.setenv("VERL_TOOL_COUNTS", str(counts))
    counts.mkdir()

    async def turn(loop):
        _PLACE.set(ToolCallPlace(step=1, sample=0))
        data = AgentData([], None, None, None, None, {}, "r", {})
        data.assistant_turns = 1
        data.tool_calls = [FunctionCall(name="sandbox", arguments=json.dumps({"code": "print(1 + 1)"})),
                           FunctionCall(name="calculator", arguments=json.dumps({"expression": "2*8"})),
                           FunctionCall(name="sandbox", arguments=json.dumps({"code": "print(3 * 3)"}))]
        responses = await asyncio.gather(*(loop._call_tool(call, {}, data) for call in data.tool_calls))
        return [response.text for response, _, _ in responses]

    with Journal(str(path), run="tools") as journal:
        read = asyncio.run(turn(_loop(ToolEngine(journal, policy, tools=["calculator", "sandbox"]))))
    return read, {tool: len((counts / tool).read_text().splitlines()) if (counts / tool).exists() else 0
                  for tool in ("calculator", "sandbox")}


def test_two_sandbox_calls_of_one_turn_dispatched_in_parallel_are_recorded_as_the_tool_answered_and_replayed(
        tmp_path, monkeypatch):
    """verl gathers a turn's calls; each sandbox call is its own create / execute / release. Recording them under
    ``cache`` shows the model what the sandbox printed (not a refusal of the journal), and a replay serves it."""
    path = tmp_path / "journal"
    recorded, ran = _parallel_turn(path, "cache", monkeypatch, tmp_path / "record")
    assert recorded == ["2", "16", "9"] and ran == {"calculator": 1, "sandbox": 6}
    assert _parallel_turn(path, "replay", monkeypatch, tmp_path / "replay") == (recorded, {"calculator": 0,
                                                                                           "sandbox": 0})
