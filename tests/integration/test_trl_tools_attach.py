"""Attaching to a real `GRPOTrainer` with tools: which specs journal the tool calls, which are refused, and
that detaching gives the trainer back its own methods (no training here; tests/integration/test_trl_tools.py
trains)."""

from __future__ import annotations

import pytest

from trl_tool_runs import SandboxEnv, trainer

from stepjournal import Journal
from stepjournal.adapters.trl import TrlAdapterError, attach
from stepjournal.policies import SpecError, ToolEngine


@pytest.fixture(scope="module")
def trainers(tmp_path_factory):
    out = tmp_path_factory.mktemp("trl-attach")
    return {kind: trainer(kind, out / kind) for kind in ("tools", "env")}


def test_a_spec_naming_tool_stages_journals_each_tool_and_environment_under_one_tool_engine(trainers, tmp_path):
    with Journal(str(tmp_path / "j")) as journal:
        handle = attach(trainers["tools"], journal, "generate:cache/tools:replay/tool.python:cache")
        try:
            assert isinstance(handle.tool_engine, ToolEngine)
            assert handle.tool_engine.tools == ("calculator", "python")
            assert handle.tool_engine.rule("tool.calculator") == "replay"
            assert handle.tool_engine.rule("tool.python") == "cache"
            assert handle.tool_counts == {}
        finally:
            handle.detach()
        env = trainers["env"]
        handle = attach(env, journal, "tools:cache")
        try:
            assert handle.tool_engine.tools == ("SandboxEnv",)
            (instance,) = env._environment_pool[None]
            assert "reset" in vars(instance) and "get_reward" in vars(instance)  # journaled on the instance
        finally:
            handle.detach()


def test_a_spec_without_tool_stages_leaves_the_tools_alone(trainers, tmp_path):
    env = trainers["env"]
    factory = env.environment_factories[None]
    with Journal(str(tmp_path / "j")) as journal:
        handle = attach(env, journal, "generate:cache/reward:cache")
        try:
            assert handle.tool_engine is None and handle.tool_counts == {}
            assert env.environment_factories[None] is factory
            assert "_generate" not in vars(env)
        finally:
            handle.detach()


def test_detach_gives_back_the_methods_the_factories_and_the_environments_own_reset(trainers, tmp_path):
    env = trainers["env"]
    factory = env.environment_factories[None]
    with Journal(str(tmp_path / "j")) as journal:
        attach(env, journal, "generate:replay/tools:replay").detach()
    assert env.environment_factories[None] is factory
    for name in ("_generate", "_generate_single_turn", "_generate_and_score_completions"):
        assert name not in vars(env), name
    (instance,) = env._environment_pool[None]
    assert "reset" not in vars(instance) and "get_reward" not in vars(instance)
    assert type(instance) is SandboxEnv


@pytest.mark.parametrize("spec, names", [
    ("generate:cache/tool.calculater:replay", "tool.calculator"),  # misspelt: did you mean
    ("generate:cache/tool.calculator:repeat", "repeat"),  # a policy that would serve another call's response
])
def test_a_tool_stage_the_trainer_lacks_or_a_policy_no_tool_takes_is_refused_when_attaching(trainers, tmp_path,
                                                                                           spec, names):
    with Journal(str(tmp_path / "j")) as journal:
        with pytest.raises(SpecError, match=names):
            attach(trainers["tools"], journal, spec)
    assert "_stepjournal" not in vars(trainers["tools"])


def test_tool_stages_for_a_trainer_with_a_rollout_func_are_refused(trainers, tmp_path):
    tools = trainers["tools"]
    tools.rollout_func = lambda prompts, trainer: {}
    try:
        with Journal(str(tmp_path / "j")) as journal:
            with pytest.raises(TrlAdapterError, match="rollout_func"):
                attach(tools, journal, "generate:cache/tools:cache")
    finally:
        tools.rollout_func = None
