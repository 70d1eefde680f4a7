"""Adapters: connect stepjournal to raw training loops, verl and TRL.

`journaled` wraps any rollout function, `journaled_tool` any tool of an agent loop. The verl and TRL adapters live in `stepjournal.adapters.verl`
and `stepjournal.adapters.trl` and need the `verl` / `trl` extras.
"""

__all__ = ["journaled", "default_input_of", "journaled_tool", "tool_turn", "ToolTurn", "current_tool_turn"]
_TOOL_NAMES = ("journaled_tool", "tool_turn", "ToolTurn", "current_tool_turn")


def __getattr__(name: str):
    # Imported on first use, so that `stepjournal.adapters.cli` (the command line) starts without
    # the engine, torch or numpy: --help and --version answer at once.
    if name in _TOOL_NAMES:
        from . import _tools

        value = getattr(_tools, name)
        globals()[name] = value
        return value
    if name in __all__:
        from . import _raw

        value = getattr(_raw, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stepjournal.adapters' has no attribute {name!r}")
