"""Adapters: connect stepjournal to raw training loops, verl and TRL.

`journaled` wraps any rollout function, `journaled_tool` any tool of an agent loop; `record_tokenizer` keeps
the run's tokenizer in the journal, so that ``show --text``, ``diff --text`` and ``report`` decode its token
ids with no flag (`journal_tokenizer` reads it back, as data). The verl and TRL adapters live in
`stepjournal.adapters.verl` and `stepjournal.adapters.trl` and need the `verl` / `trl` extras.
"""

__all__ = ["journaled", "default_input_of", "record_tokenizer", "journal_tokenizer", "StoredTokenizer",
           "TokenizerDocumentError", "TOKENIZER_STAGE", "journaled_tool", "tool_turn", "ToolTurn", "current_tool_turn"]

# Each public name's module, imported on first use, so that `stepjournal.adapters.cli` (the command line)
# starts without the engine, torch or numpy: --help and --version answer at once.
_MODULES = {"journaled": "_raw", "default_input_of": "_raw", "record_tokenizer": "_tokenizer",
            "journal_tokenizer": "_tokenizer", "StoredTokenizer": "_tokenizer",
            "TokenizerDocumentError": "_tokenizer", "TOKENIZER_STAGE": "_tokenizer", "journaled_tool": "_tools",
            "tool_turn": "_tools", "ToolTurn": "_tools", "current_tool_turn": "_tools"}


def __getattr__(name: str):
    if name in _MODULES:
        import importlib

        module = importlib.import_module(f".{_MODULES[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stepjournal.adapters' has no attribute {name!r}")
