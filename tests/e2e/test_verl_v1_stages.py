"""verl's V1 trainer with every expensive stage journaled: a replay in a new process computes none of them.

Real (verl 0.9.1), as in tests/e2e/test_verl_v1_e2e.py: the sync V1 trainer's ``fit()`` and its own stage
methods (``_compute_reward_colocate``, ``_compute_old_log_prob`` without bypass, ``_compute_ref_log_prob``,
``_compute_values``, ``_compute_advantage`` for GRPO and GAE, ``_update_actor`` / ``_update_critic``,
``_compute_metrics``), its config composed by Hydra, TransferQueue, verl's agent loop and LLM server
client. Stand-ins (GPU-bound, each counting its calls; tests/verl_v1_stage_standins.py): the LLM server,
the actor's ``compute_log_prob``, the reference policy's ``compute_ref_log_prob``, the critic's
``infer_batch`` and a colocated reward model's ``compute_rm_score``.

Process 1 records (policy ``generate:cache/reward:cache/old_log_prob:cache/ref_log_prob:cache``; a
GAE run ``generate:cache/values:cache``). Process 2 (the LLM server raises) replays them, replays the
same generations with ``algorithm.norm_adv_by_std_in_grpo=false``, and generates anew with another
sampler seed while asking to replay the old log-probs.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from doc_lines import command_lines, run_line

pytestmark = pytest.mark.e2e  # verl's V1 trainer end to end, on a Ray cluster: `make test-fast` leaves it out

HERE = Path(__file__).parent.parent
HARNESS = HERE / "verl_v1_harness.py"
STEPS = [1, 2, 3]
DOC_LINES = [line for line in command_lines("docs/verl.md") if line.text.startswith("stepjournal diff /ckpt/")]


def _phase(root: Path, phase: str) -> dict:
    out = root / f"{phase}.json"
    result = subprocess.run([sys.executable, str(HARNESS), str(root), phase, str(out)],
                            capture_output=True, text=True, timeout=1800, cwd=HERE)  # a hang detector only
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("v1_stages")
    return {"root": root, "recorded": _phase(root, "stages_record"), "replayed": _phase(root, "stages_replay")}


def _nonzero(updates, field):
    return [s for s, u in zip(STEPS, updates) if any(abs(x) > 0 for row in u[field] for x in row)]


def test_a_replayed_v1_run_computes_no_generate_reward_or_log_prob_and_hands_the_actor_the_same_batches(runs):
    recorded, replayed = runs["recorded"]["stages"], runs["replayed"]["stages"]
    assert recorded["counts"] == {"old_log_prob": 3, "ref_log_prob": 3, "reward": 3, "values": 0}
    assert recorded["generate_calls"] >= 3
    assert replayed["counts"] == {"old_log_prob": 0, "ref_log_prob": 0, "reward": 0, "values": 0}
    assert replayed["generate_calls"] == 0  # the LLM server raises in this process
    assert [a[:2] for a in replayed["actions"]] == [["replayed", s] for s in STEPS]
    stages = ("reward", "old_log_prob", "ref_log_prob")
    assert [a[:3] for a in recorded["stage_actions"]] == [
        [action, stage, s] for s in STEPS for action, stage in [("generated", st) for st in stages] + [("generated", "metrics")]]
    assert [a[:3] for a in replayed["stage_actions"]] == [
        [action, stage, s] for s in STEPS for action, stage in [("replayed", st) for st in stages] + [("generated", "metrics")]]
    # Rewards, old and reference log-probs, advantages, every field the actor update was handed.
    assert replayed["updates"] == recorded["updates"]
    assert _nonzero(recorded["updates"], "advantages") and _nonzero(recorded["updates"], "ref_log_prob")


def test_the_replayed_runs_logged_metrics_losses_included_equal_the_recorded_ones(runs):
    import stepjournal.adapters.verl  # noqa: F401  (registers the TQBatch codec)
    from stepjournal import Journal, diff_journals

    recorded, replayed = runs["recorded"]["stages"], runs["replayed"]["stages"]
    with Journal(recorded["journal"], run="v1_stages_stepjournal", readonly=True) as journal:
        report = diff_journals(journal, journal, run_a="v1_stages_stepjournal", run_b="v1_stages_stepjournal",
                               session_a=recorded["session"], session_b=replayed["session"])
        metrics = journal.load_output(journal.lookup(2, stage="metrics"))
    assert report.exit_code == 0, report.summary
    assert {(p.stage, p.step) for p in report.pairs} == {
        (stage, s) for s in STEPS for stage in ("generate", "reward", "old_log_prob", "ref_log_prob", "metrics")}
    assert {"actor/pg_loss", "actor/kl_loss", "critic/advantages/max", "actor/entropy"} <= set(metrics)
    assert not any(key.startswith(("timing_s/", "perf/")) for key in metrics)


def test_a_gae_run_replays_the_critics_values_without_running_the_critic(runs):
    recorded, replayed = runs["recorded"]["stages_gae"], runs["replayed"]["stages_gae"]
    assert recorded["counts"]["values"] == 3 and replayed["counts"]["values"] == 0
    assert replayed["generate_calls"] == 0
    assert [a[:3] for a in replayed["stage_actions"] if a[1] == "values"] == [["replayed", "values", s] for s in STEPS]
    assert replayed["updates"] == recorded["updates"]
    assert _nonzero(recorded["updates"], "values") and _nonzero(recorded["updates"], "returns")


def test_old_log_probs_recorded_on_other_trajectories_are_refused_with_stage_input_mismatch(runs):
    from stepjournal import Journal

    run = runs["replayed"]["stages_new_batch"]
    assert run["generate_calls"] > 0  # this run generated anew, with another sampler seed
    assert run["error"]["type"] == "StageInputMismatchError"
    assert (run["error"]["step"], run["error"]["stage"]) == (1, "old_log_prob")
    assert "on_stage_input_mismatch='generate'" in run["error"]["message"]
    assert run["counts"]["old_log_prob"] == 0  # refused, not computed
    with Journal(run["journal"], run="v1_stages_stepjournal", readonly=True) as journal:
        refused = [r for r in journal.audit(stage="old_log_prob") if r.session == run["session"]]
    assert [(r.action, r.step) for r in refused] == [("refused", 1)]


def test_stepjournal_diff_says_generate_is_equal_and_metrics_differ_where_the_advantage_change_acts(runs):
    """Two replays of the same generations, one with norm_adv_by_std_in_grpo=false: docs/verl.md's line
    through a shell, with this run's journal and session ids in place of the page's."""
    a, b = runs["replayed"]["stages"], runs["replayed"]["stages_no_std"]
    (line,) = DOC_LINES
    typed = (line.text.replace("/ckpt/rollouts/stepjournal", shlex.quote(a["journal"]))
             .replace("9c64594c", a["session"][:8]).replace("fb7195fb", b["session"][:8]))
    shown = run_line(typed, None, timeout=120)
    as_json = run_line(typed + " --json", None, timeout=120)
    assert shown.returncode == 1 and as_json.returncode == 1, shown.stderr + as_json.stderr
    report = json.loads(as_json.stdout)
    # Advantages move only where a group's rewards differ: GRPO's std is 0 in a group that agrees.
    # The steps where some group's rewards differ (the sampler's draws under asyncio decide which:
    # a step whose groups all agree has zero advantages either way, and equal metrics).
    acting = _nonzero(runs["recorded"]["stages"]["updates"], "advantages")
    acts = acting[0]
    first = report["first_divergence"]
    assert (first["stage"], first["step"]) == ("metrics", acts)
    states = {(p["stage"], p["step"]): p["state"] for p in report["pairs"]}
    assert all(state == "equal" for (stage, _), state in states.items() if stage != "metrics")
    assert {stage for stage, _ in states} == {"generate", "reward", "old_log_prob", "ref_log_prob", "metrics"}
    assert [s for s in STEPS if states[("metrics", s)] != "equal"] == acting
    assert f"at step {acts} the first differing stage is metrics" in shown.stdout
    assert "generate, reward, old_log_prob, ref_log_prob are equal" in shown.stdout
    assert "actor/pg_loss" in shown.stdout


def test_show_text_of_a_v1_step_prints_each_samples_prompt_response_and_reward_as_the_trainer_decoded_and_scored_it(
        runs):
    """`stepjournal show J 2 --text`, typed through a shell with no ``--tokenizer``: the run's own tokenizer (verl's
    model path, which the recording's fingerprint names) decodes each sample; the reward beside it is what the
    reward model scored for that text, and what the trainer handed the actor at that step."""
    import os
    import shlex

    from transformers import AutoTokenizer
    from verl_v1_stage_standins import reward_model_score

    recorded = runs["recorded"]["stages"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}
    line = f"stepjournal show {shlex.quote(recorded['journal'])} 2 --text"
    table = subprocess.run(line, shell=True, capture_output=True, text=True, env=env, timeout=300)
    as_json = subprocess.run(line + " --json", shell=True, capture_output=True, text=True, env=env, timeout=300)
    assert table.returncode == 0 and as_json.returncode == 0, table.stderr + as_json.stderr
    samples = json.loads(as_json.stdout)["samples"]
    assert len(samples) == 8  # 4 prompts, rollout.n 2

    tokenizer = AutoTokenizer.from_pretrained(str(runs["root"] / "tiny-model"), local_files_only=True)
    handed = recorded["updates"][STEPS.index(2)]  # what verl's trainer handed the actor at step 2
    trainer_rewards = sorted((tuple(ids), sum(scores)) for ids, scores in zip(handed["responses"], handed["rm_scores"]))
    assert sorted((tuple(s["response_ids"]), s["rewards"]["reward"]) for s in samples) == trainer_rewards
    for s in samples:
        assert s["prompt"] == tokenizer.decode(s["prompt_ids"], skip_special_tokens=True)
        assert s["response"] == tokenizer.decode(s["response_ids"], skip_special_tokens=True)
        # The reward model scores the response's tokens, the ones this text decodes from.
        assert s["rewards"] == {"reward": reward_model_score(s["response_ids"])}
        assert "What is" in s["prompt"] and s["response"].startswith("#### ")
        assert s["logprob_mean"] is not None and s["truncated"] is False
        # The latest call at step 2 is the replay process's: it names the recorded step it served.
        assert (s["action"], s["source_step"]) == ("replayed", 2)
        assert f"response: {s['response']}" in table.stdout
    assert "replayed from step 2" in table.stdout
    assert {s["rewards"]["reward"] for s in samples} <= {0.0, 1.0}
