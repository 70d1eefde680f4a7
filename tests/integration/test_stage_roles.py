"""A stage's role is data: the adapter that owns a stage declares it record-only, and the engine enforces it
(`Engine(..., roles=)`), for a spec when the engine is made and for a decision when it is made."""

from __future__ import annotations

import pytest

from stepjournal import Journal
from stepjournal.errors import ConfigError, StageRoleError
from stepjournal.policies import CallContext, Engine, GenerateCall, ServeRecorded, check_stage_roles, may_replay, parse
from stepjournal.policies import parse_stages
from stepjournal.vocabulary import Action, Stage, StageRole

ROLES = (Stage("generate"), Stage("reward", parts=True), Stage("metrics", StageRole.RECORD_ONLY))


@pytest.mark.parametrize("spec", ["dump", "passthrough", "bypass", "dump@1-3;passthrough"])
def test_a_policy_that_always_runs_the_call_may_decide_a_record_only_stage(spec):
    assert not may_replay(parse(spec))
    check_stage_roles(parse_stages({"generate": "cache", "metrics": spec}), ROLES)


@pytest.mark.parametrize("spec", ["cache", "replay", "repeat", "nearest", "dump@1-3;repeat"])
def test_a_policy_that_may_replay_is_refused_for_a_record_only_stage_with_typed_fields(spec):
    with pytest.raises(StageRoleError) as refused:
        check_stage_roles(parse_stages({"generate": "cache", "metrics": spec}), ROLES)
    assert isinstance(refused.value, ConfigError)
    assert (refused.value.stage, refused.value.role, refused.value.policy) == ("metrics", StageRole.RECORD_ONLY, spec)


def test_a_stage_with_parts_gives_each_part_its_role(tmp_path):
    roles = (Stage("reward", StageRole.RECORD_ONLY, parts=True),)
    with Journal(tmp_path / "j") as journal:
        with pytest.raises(StageRoleError, match="'reward.length'"):
            Engine(journal, {"generate": "cache", "reward.length": "replay"}, roles=roles)
        assert journal.last_seq() == 0


class _ServesAnyway:
    """A plugin's policy: it serves whatever is recorded, whatever the stage."""

    name = "serves_anyway"

    def decide(self, ctx: CallContext, view):
        found = view.lookup(ctx.step, ctx.gen_index)
        return GenerateCall(reason="nothing recorded") if found is None else ServeRecorded(found, reason="recorded")


def test_the_engine_refuses_a_decision_to_replay_a_record_only_stage_and_journals_nothing(tmp_path):
    with Journal(tmp_path / "j") as journal:
        engine = Engine(journal, _ServesAnyway(), roles=ROLES)
        first = engine.call(1, lambda: {"loss": 1.0}, stage="metrics", input_digest="d")
        assert first.action is Action.GENERATED
        seq = journal.last_seq()
        with pytest.raises(StageRoleError) as refused:
            engine.call(1, lambda: {"loss": 2.0}, stage="metrics", input_digest="d", gen_index=0)
        assert (refused.value.stage, refused.value.policy) == ("metrics", "serves_anyway")
        assert journal.last_seq() == seq
        # A stage that may replay is served by the same policy.
        engine.call(1, lambda: [1], stage="reward.length", input_digest="d")
        assert engine.call(1, lambda: [2], stage="reward.length", input_digest="d", gen_index=0).action == "replayed"
