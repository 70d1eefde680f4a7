"""`stepjournal.vocabulary`: the shared words keep the stored text, agree with the events, and are checked."""

from __future__ import annotations

import json

import msgspec
import pytest

from stepjournal.errors import InvalidKeyError
from stepjournal.tools import ACTIONS, CALL_EVENT_TYPES
from stepjournal.vocabulary import (ACTION_COLOURS, CALL_ACTIONS, DEFAULT_MODE, DEFAULT_STAGE, Action, Stage, StageRole,
                                    check_stage, check_stages, stage_names)


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
