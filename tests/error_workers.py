"""Workers for tests/integration/test_errors_across_processes.py, importable by `spawn` children: each raises one
error the library raises, by the call a user makes."""

from __future__ import annotations


def replay_miss(path: str) -> None:
    """A replay of a step nothing recorded: `ReplayMissError` (its step and call index as fields)."""
    from stepjournal import Journal
    from stepjournal.adapters import journaled

    with Journal(path, run="exp") as journal:
        journaled(lambda step: step, journal, "replay")(step=3)


def bad_size(path: str) -> None:
    """A retention byte cap that is not a size: `RetentionError` (option, value, parts)."""
    from stepjournal.upkeep import Retention

    Retention(max_bytes="10X")


def bad_option(path: str) -> None:
    """An engine option given a value it does not take: `OptionError` (option, value, allowed)."""
    from stepjournal.policies import EngineOptions

    EngineOptions(on_input_mismatch="sometimes")
