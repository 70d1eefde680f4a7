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
