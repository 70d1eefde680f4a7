"""The audit from Python: `Journal.audit` returns one typed record per generate call; runs are summarised."""

from __future__ import annotations

import json

import attrs
import pytest
import torch

import stepjournal
from stepjournal import Journal
from stepjournal.events import AUDIT_SCHEMA_VERSION
from stepjournal.index import AuditRecord, RunSummary, summarize_runs
from stepjournal.policies import StepRanges


def rollout(step: int) -> dict:
    return {"ids": torch.full((2, 3), step), "uid": [f"s{step}-0", f"s{step}-1"]}


@pytest.fixture
def journal(jpath):
    """Run "exp": steps 1-3 generated (step 2 twice), a validation bypass, a refusal, then a resumed
    session that replays steps 1-3 and repeats step 1 into step 4; run "other" generates step 1."""
    with Journal(jpath, run="exp", fingerprint={"model": "m"}) as j:
        for step in (1, 2, 3):
            j.record(step, rollout(step), policy="cache", reason="miss")
        j.record(2, rollout(20), gen_index=1, policy="cache", reason="miss")
        j.record_bypass(3, policy="cache", reason="validation")
        j.record_refusal(4, policy="replay", reason="nothing recorded at step 4")
        j.record(5, rollout(5), store_output=False, policy="passthrough", reason="not stored")
    with Journal(jpath, run="exp", fingerprint={"model": "m"}) as j:
        for step in (1, 2, 3):
            j.record_replay(step, j.lookup(step), policy="replay", reason="recorded")
        j.record_replay(4, j.lookup(1), policy="repeat", reason="step 4 -> 1")
    with Journal(jpath, run="other") as j:
        j.record(1, rollout(1))
    with Journal(jpath, readonly=True) as j:
        yield j


def test_audit_returns_one_typed_record_per_call_in_log_order(journal):
    records = journal.audit()
    assert all(isinstance(r, AuditRecord) for r in records)
    assert [r.seq for r in records] == sorted(r.seq for r in records)
    assert [(r.run, r.step, r.gen_index, r.action) for r in records] == [
        ("exp", 1, 0, "generated"),
        ("exp", 2, 0, "generated"),
        ("exp", 3, 0, "generated"),
        ("exp", 2, 1, "generated"),
        ("exp", 3, 0, "bypassed"),
        ("exp", 4, 0, "refused"),
        ("exp", 5, 0, "generated"),
        ("exp", 1, 0, "replayed"),
        ("exp", 2, 0, "replayed"),
        ("exp", 3, 0, "replayed"),
        ("exp", 4, 0, "replayed"),
        ("other", 1, 0, "generated"),
    ]


def test_audit_records_are_frozen_attrs_classes(journal):
    record = journal.audit()[0]
    assert attrs.has(AuditRecord)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        record.step = 9  # type: ignore[misc]


def test_replayed_records_name_their_source_and_the_payload_served(journal):
    first = journal.audit(run="exp")[0]
    repeat = journal.audit(run="exp", steps={4}, actions={"replayed"})[0]
    assert (repeat.source_run, repeat.source_step, repeat.source_gen_index, repeat.source_seq) == ("exp", 1, 0, first.seq)
    assert repeat.digest == first.digest and repeat.nbytes == first.nbytes
    assert repeat.stored is False and (repeat.policy, repeat.reason) == ("repeat", "step 4 -> 1")


def test_only_generated_calls_with_an_output_are_marked_stored(journal):
    stored = {(r.step, r.action, r.stored) for r in journal.audit(run="exp")}
    assert (1, "generated", True) in stored
    assert (5, "generated", False) in stored  # journaled without storing its output
    assert all(not s for _, action, s in stored if action != "generated")


def test_calls_without_a_payload_have_no_digest_or_source(journal):
    for r in journal.audit(actions={"bypassed", "refused"}):
        assert r.digest is None and r.nbytes is None and r.source_step is None and r.source_seq is None


def test_audit_filters_by_run_steps_mode_and_action(journal):
    assert {r.run for r in journal.audit(run="other")} == {"other"}
    assert {r.step for r in journal.audit(steps=StepRanges.parse("2-3"))} == {2, 3}
    assert [r.action for r in journal.audit(mode="validate")] == ["bypassed"]
    assert {r.action for r in journal.audit(actions={"refused", "bypassed"})} == {"refused", "bypassed"}


def test_json_rows_carry_the_schema_version_and_the_documented_keys(journal):
    row = journal.audit(steps={4}, actions={"replayed"})[0].to_json()
    assert row["schema_version"] == AUDIT_SCHEMA_VERSION == 1
    assert {"run", "step", "gen_index", "action", "source_step", "policy", "digest", "ts"} <= row.keys()
    assert row["time"].endswith("Z") and row["source_step"] == 1
    json.dumps(row, allow_nan=False)  # plain JSON


def test_summarize_runs_counts_actions_and_sessions_per_run(journal):
    exp, other = summarize_runs(journal)
    assert isinstance(exp, RunSummary) and (exp.run, other.run) == ("exp", "other")
    assert len(exp.sessions) == 2 and len(other.sessions) == 1
    assert exp.counts == {"generated": 5, "replayed": 4, "bypassed": 1, "refused": 1}
    assert exp.modes == {"train": 10, "validate": 1}
    assert (exp.first_step, exp.last_step, exp.calls) == (1, 5, 11)
    assert exp.fingerprints() == [{"model": "m"}]
    assert json.loads(json.dumps(exp.to_json()))["sessions"][0]["fingerprint"] == {"model": "m"}


def test_audit_names_are_public(journal):
    import stepjournal.events
    import stepjournal.index

    for face, name in ((stepjournal.index, "AuditRecord"), (stepjournal.index, "RunSummary"),
                       (stepjournal.events, "AUDIT_SCHEMA_VERSION"), (stepjournal.index, "summarize_runs")):
        assert name in face.__all__ and hasattr(face, name)


def test_a_refused_call_counts_but_does_not_widen_the_step_span(jpath):
    with Journal(jpath, run="span") as j:
        for step in (1, 2, 3, 4):
            j.record(step, {"x": torch.tensor([step])})
        j.record_refusal(9, reason="replay miss")
        (summary,) = summarize_runs(j.events())
    assert (summary.first_step, summary.last_step) == (1, 4)
    assert summary.counts["refused"] == 1
