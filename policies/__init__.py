"""Policies: pure decisions about each generate call, evaluated against the journal.

A policy gets a `CallContext` and a read-only `JournalView` and returns a decision. The `Engine`
carries decisions out and journals them. Specs such as ``"dump@1-5;repeat"`` are parsed by `parse`; a policy per stage
(``"generate:cache/reward:replay@1-5"`` or a mapping) by `parse_stages`.
"""

from ._base import (
    BypassCall,
    CallContext,
    Decision,
    GenerateCall,
    JournalView,
    Policy,
    RefuseCall,
    ServeRecorded,
    is_policy,
)
from ._builtin import BUILTIN_POLICIES, Bypass, Cache, Dump, Nearest, Passthrough, Repeat, RepeatLast, Replay
from ._config import EngineConfig, load_config, open_engine
from ._checks import stage_input_digest
from ._engine import CallHooks, Engine, Outcome, PendingCall
from ._errors import (
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
)
from ._options import EngineOptions
from ._plugins import PluginStatus, plugin_report
from ._ranges import StepRange, StepRanges
from ._spec import DISABLE_PLUGINS_ENV, PLUGIN_GROUP, Schedule, parse, plugin_names, policy_by_name
from ._roles import check_stage_roles, may_replay
from ._stages import StagePolicies, parse_stages
from ._tool_engine import ToolEngine, ToolStateMismatchError
from ._tool_policy import (
    TOOL_RULES,
    RecordedToolCall,
    ToolCallFacts,
    ToolPolicy,
    ToolReplayMissError,
    match_tool_call,
    recorded_tool_calls,
    sample_history,
    tool_rule,
)

__all__ = [
    "parse",
    "parse_stages",
    "StagePolicies",
    "check_stage_roles",
    "may_replay",
    "StageRoleError",
    "stage_input_digest",
    "StageInputMismatchError",
    "policy_by_name",
    "plugin_names",
    "plugin_report",
    "PluginStatus",
    "PLUGIN_GROUP",
    "DISABLE_PLUGINS_ENV",
    "StepRange",
    "StepRanges",
    "Schedule",
    "Policy",
    "is_policy",
    "CallContext",
    "JournalView",
    "Decision",
    "GenerateCall",
    "ServeRecorded",
    "RefuseCall",
    "BypassCall",
    "BUILTIN_POLICIES",
    "Dump",
    "Replay",
    "Cache",
    "Repeat",
    "RepeatLast",
    "Nearest",
    "Passthrough",
    "Bypass",
    "Engine",
    "EngineOptions",
    "CallHooks",
    "Outcome",
    "PendingCall",
    "EngineConfig",
    "load_config",
    "open_engine",
    "PolicyError",
    "SpecError",
    "SpecWarning",
    "PluginError",
    "PluginLoadError",
    "ConfigError",
    "OptionError",
    "ReplayRefusedError",
    "ReplayMissError",
    "FingerprintMismatchError",
    "InputMismatchError",
    "ToolEngine",
    "ToolStateMismatchError",
    "ToolReplayMissError",
    "ToolPolicy",
    "ToolCallFacts",
    "RecordedToolCall",
    "TOOL_RULES",
    "match_tool_call",
    "recorded_tool_calls",
    "sample_history",
    "tool_rule",
]
