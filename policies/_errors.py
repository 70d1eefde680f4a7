"""Errors of the policy engine, under stepjournal's one base class.

They are defined with every other error of stepjournal and print under their public module,
``stepjournal.errors`` (docs/errors.md); this module offers them to the policies room, which imports
the journal's public modules only.
"""

from __future__ import annotations

from stepjournal.errors import (
    ConfigError,
    FingerprintMismatchError,
    InputMismatchError,
    OptionError,
    PluginError,
    PluginLoadError,
    PolicyError,
    ReplayMissError,
    ReplayRefusedError,
    SpecError,
    SpecWarning,
    StageInputMismatchError,
    StageRoleError,
    ToolReplayMissError,
    ToolStateMismatchError,
)

__all__ = [
    "ConfigError",
    "FingerprintMismatchError",
    "InputMismatchError",
    "OptionError",
    "PluginError",
    "PluginLoadError",
    "PolicyError",
    "ReplayMissError",
    "ReplayRefusedError",
    "SpecError",
    "SpecWarning",
    "StageInputMismatchError",
    "StageRoleError",
    "ToolReplayMissError",
    "ToolStateMismatchError",
]
