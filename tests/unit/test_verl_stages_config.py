"""Turning verl's stages on: the per-stage spec in a verl config, checked against the stages verl journals.

Configs are composed by verl's own Hydra (``ppo_trainer.yaml``) from override lines as a user types
them; nothing here starts Ray.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stepjournal.adapters.verl import read_verl_config
from stepjournal.adapters.verl.v1._stages import (  # private: a verl adapter internal under test
    VERL_STAGES, check_verl_stages, loggable_metrics,
)
from stepjournal.policies import ConfigError, StagePolicies, StageRoleError
from stepjournal.vocabulary import StageRole

from verl_support import compose


def _policy(*overrides):
    return read_verl_config(compose("verl.trainer.main_ppo", ["+stepjournal.dump_dir=/ckpt/rollouts", *overrides])).policy


def test_the_compact_per_stage_form_passes_through_verls_hydra_unquoted_and_names_each_stage():
    policy = _policy("+stepjournal.policy=generate:cache/reward:cache/old_log_prob:cache/ref_log_prob:replay@1-5")
    parsed = check_verl_stages(policy)
    assert isinstance(parsed, StagePolicies)
    assert parsed.stages == ("generate", "reward", "old_log_prob", "ref_log_prob")
    assert parsed.for_stage("ref_log_prob").name == "replay@1-5"


def test_hydras_own_mapping_syntax_gives_the_same_per_stage_policy():
    policy = _policy("+stepjournal.policy={generate:cache,values:'replay@1-5'}")
    assert policy == {"generate": "cache", "values": "replay@1-5"}
    assert check_verl_stages(policy).stages == ("generate", "values")


def test_a_stage_verl_does_not_journal_is_refused_with_the_closest_name():
    with pytest.raises(ConfigError, match=r"unknown stage 'old_logprob'.*old_log_prob"):
        check_verl_stages(_policy("+stepjournal.policy=generate:cache/old_logprob:cache"))


@pytest.mark.parametrize("spec", ["metrics:cache", "metrics:replay", "metrics:dump@1-3;repeat"])
def test_a_metrics_policy_that_could_replay_is_refused(spec):
    """verl declares ``metrics`` record-only (a typed role); the policies' check enforces it, reading no name."""
    with pytest.raises(StageRoleError, match="calls are recorded, never replayed") as refused:
        check_verl_stages(f"generate:cache/{spec}")
    assert isinstance(refused.value, ConfigError)
    assert (refused.value.stage, refused.value.role, refused.value.policy) == (
        "metrics", StageRole.RECORD_ONLY, spec.split(":", 1)[1])


def test_metrics_may_be_named_to_record_or_store_nothing_and_one_spec_stays_valid():
    assert check_verl_stages("generate:cache/metrics:passthrough").stages == ("generate", "metrics")
    assert check_verl_stages("generate:cache/metrics:dump@1-3;passthrough").for_stage("metrics") is not None
    assert check_verl_stages("cache").name == "cache"  # one spec: generate only, as before stages
    assert VERL_STAGES == ("generate", "reward", "old_log_prob", "ref_log_prob", "values", "metrics")


def test_logged_metrics_keep_numbers_and_leave_out_timing_and_throughput():
    metrics = {"actor/pg_loss": np.float32(0.25), "critic/score/mean": torch.tensor(1.5), "training/global_step": 3,
               "timing_s/gen": 0.4, "timing_per_token_ms/adv": 0.01, "perf/throughput": 100.0, "note": "x",
               "val-aux/list": [1, 2]}
    assert loggable_metrics(metrics) == {"actor/pg_loss": 0.25, "critic/score/mean": 1.5, "note": "x",
                                         "training/global_step": 3}
