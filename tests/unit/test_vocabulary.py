"""`stepjournal.vocabulary`: the shared words keep the stored text, agree with the events, and are checked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from stepjournal.errors import InvalidKeyError
from stepjournal.events import ToolCallKey
from stepjournal.tools import ACTIONS, CALL_EVENT_TYPES, ToolCallRow
from stepjournal.vocabulary import (ACTION_COLOURS, CALL_ACTIONS, DEFAULT_MODE, DEFAULT_STAGE, Action, Stage, StageRole,
                                    ToolOutcome, check_stage, check_stages, stage_names)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_call_actions_are_the_events_actions_in_their_order():
    """One source: the enum's call actions are the words the events, the audit and the runs index use."""
    assert tuple(CALL_ACTIONS) == ACTIONS and len(CALL_EVENT_TYPES) == len(CALL_ACTIONS)
    assert set(Action) - set(CALL_ACTIONS) == {Action.RELEASED}


def test_an_action_is_its_stored_text_everywhere():
    action = Action.REPLAYED
    assert action == "replayed" and str(action) == f"{action}" == "replayed" and repr([action]) == "['replayed']"
    assert json.dumps({"action": action}) == '{"action": "replayed"}'
    assert msgspec.json.encode(action) == b'"replayed"'
    assert {"replayed": 1}[action] == 1 and Action("refused") is Action.REFUSED


def test_a_tool_outcome_is_its_printed_text_everywhere():
    """`audit --tools --json`, `show --text` and the report print an outcome as the word it always was."""
    outcome = ToolOutcome.CAUGHT_UP
    assert outcome == "caught up" and str(outcome) == f"{outcome}" == "caught up" and repr([outcome]) == "['caught up']"
    assert json.dumps({"outcome": outcome}) == '{"outcome": "caught up"}'
    assert msgspec.json.encode(ToolOutcome.MISS) == b'"miss"'
    assert ToolOutcome("refused") is ToolOutcome.REFUSED and ToolOutcome.REPLAYED == Action.REPLAYED


def test_the_tool_outcomes_are_the_words_the_docs_name():
    """One source: docs/agents.md and docs/architecture.md list exactly the enum's words, in its order."""
    agents = re.search(r"and outcome \(((?:`[^`]+`[,:]\s*)+)", (DOCS / "agents.md").read_text(encoding="utf-8"))
    vocabulary = re.search(r"- `ToolOutcome`: [^(]*\(((?:``[^`]+``[,;]\s*)+)",
                           (DOCS / "architecture.md").read_text(encoding="utf-8"))
    assert agents is not None and vocabulary is not None
    words = [outcome.value for outcome in ToolOutcome]
    assert re.findall(r"`([^`]+)`", agents.group(1)) == words
    assert re.findall(r"``([^`]+)``", vocabulary.group(1)) == words


def test_a_tool_row_holds_a_tool_outcome_and_refuses_any_other_word():
    def row(outcome):
        return ToolCallRow(seq=0, session="s", run="r", step=1, mode="train", stage="tool.t", tool="t",
                           key=ToolCallKey(0), outcome=outcome, request=None, response=None, duration_s=0.0)

    assert row("miss").outcome is ToolOutcome.MISS
    with pytest.raises(ValueError, match="'missed'"):
        row("missed")


def test_every_action_has_one_colour():
    assert set(ACTION_COLOURS) == set(Action)
    assert all(colour.startswith("#") and len(colour) == 7 for colour in ACTION_COLOURS.values())


def test_the_defaults_are_the_journals():
    assert (DEFAULT_STAGE, DEFAULT_MODE) == ("generate", "train")


def test_a_stage_declaration_checks_its_name_and_role():
    with pytest.raises(InvalidKeyError, match="stage ''"):
        Stage("")
    with pytest.raises(ValueError):
        Stage("metrics", "never")
    assert Stage("metrics", "record_only").role is StageRole.RECORD_ONLY
    with pytest.raises(InvalidKeyError, match="stage 'a\\\\x00b'"):
        check_stage("a\x00b")


def test_an_adapters_stages_are_read_in_order_and_each_once():
    stages = (Stage("generate"), Stage("reward", parts=True), Stage("metrics", StageRole.RECORD_ONLY))
    assert stage_names(stages) == ("generate", "reward", "metrics")
    assert list(check_stages(stages)) == ["generate", "reward", "metrics"]
    with pytest.raises(InvalidKeyError, match="'reward' is declared twice"):
        check_stages(stages + (Stage("reward"),))
