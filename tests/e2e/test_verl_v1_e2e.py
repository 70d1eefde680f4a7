"""verl's V1 trainer, end to end: each mode's own ``fit()`` records 3 steps, a new process replays them.

Real: verl 0.9.1's V1 trainer classes (sync, colocate_async, separate_async) and their ``fit()``,
``ReplayBuffer`` / ``ReplayBufferAsync``, its dataset and dataloader, GRPO advantages, its config
composed by Hydra from ``ppo_trainer.yaml``, TransferQueue on a local Ray started and stopped by the
harness, verl's agent loop (``AgentLoopManagerTQ``, its ``AgentLoopWorkerTQ`` actor running
``SingleTurnAgentLoop`` and writing trajectories into TransferQueue), ``LLMServerManager``'s load
balancer and verl's LLM server clients, the reward loop (``RewardLoopManager`` / ``RewardLoopWorker``
with verl's gsm8k ``compute_score``), and verl's own ``RolloutTqSkip`` writing ``tq_batch.pt`` dumps.
Stand-ins (GPU-bound): the LLM server behind the load balancer (a seeded token sampler), the actor
worker group and the weight sync (tests/verl_v1_harness.py). ``trainer.init()`` runs as its own
sequence of steps minus those that start GPU workers and vLLM (the harness docstring lists them).

The record process and the replay process each run every mode on one Ray instance (starting Ray,
TransferQueue and the agent and reward loop actors costs about a minute on this machine). Between
them, ``stepjournal import-verl`` migrates verl's own dumps.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_support import run_cli
from doc_lines import command_lines, run_line

pytestmark = pytest.mark.e2e  # verl's V1 trainer end to end, on a Ray cluster: `make test-fast` leaves it out

HERE = Path(__file__).parent.parent
HARNESS = HERE / "verl_v1_harness.py"
DOC_LINES = [line for line in command_lines("docs/verl.md") if line.text.startswith("stepjournal import-verl ~/")]


def _phase(root: Path, phase: str) -> dict:
    out = root / f"{phase}.json"
    result = subprocess.run(
        [sys.executable, str(HARNESS), str(root), phase, str(out)],
        capture_output=True, text=True, timeout=1800, cwd=HERE,  # a hang detector: minutes on a loaded machine
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    sys.path.insert(0, str(HERE))
    import verl_v1_harness as harness
    from omegaconf import OmegaConf

    root = tmp_path_factory.mktemp("v1")
    recorded = _phase(root, "record")
    # The config Hydra composed for verl's own run: its model, sampling and data join the imported fingerprint.
    OmegaConf.save(harness.run_config(str(root), harness.passes(str(root), "record")[3]), root / "verl_config.yaml")
    imported = run_cli("import-verl", str(root / "verl_dumps"), "--into", str(root / "verl_dumps" / "stepjournal"),
                       "--trust-pickle", "--config", str(root / "verl_config.yaml"), "--json")
    assert imported.returncode == 0, imported.stderr
    replayed = _phase(root, "replay")
    return {"root": root, "recorded": recorded, "replayed": replayed, "import": json.loads(imported.stdout)}


def _assert_replayed(runs, name, calls_per_step=1):
    recorded, replayed = runs["recorded"][name], runs["replayed"][name]
    steps = [1, 2, 3]
    assert [a[:3] for a in recorded["actions"]] == [
        ["generated", s, i] for s in steps for i in range(calls_per_step)
    ]
    assert [a[:3] for a in replayed["actions"]] == [["replayed", s, i] for s in steps for i in range(calls_per_step)]
    assert replayed["generate_calls"] == 0  # the sampler raises: nothing was generated
    assert recorded["generate_calls"] >= 3
    assert len(replayed["updates"]) == len(recorded["updates"]) == 3 * calls_per_step
    # Rewards, advantages, returns, old log-probs and every other field the actor update was handed.
    assert replayed["updates"] == recorded["updates"]
    # Non-trivial, so that a wrong replay would show: samples were scored differently (24 samples, each
    # right about half the time) and at least one GRPO group had a non-zero advantage. Per-step totals
    # are not compared: the sampler's order under asyncio is free, and equal totals happen (~8 %).
    rewards = {sum(row) for u in recorded["updates"] for row in u["rm_scores"]}
    advantages = [abs(x) for u in recorded["updates"] for row in u["advantages"] for x in row]
    assert max(advantages) > 0 and len(rewards) > 1


def test_the_sync_trainer_replays_three_steps_in_a_new_process_without_generating(runs):
    _assert_replayed(runs, "sync")
    assert runs["replayed"]["sync"]["held"] == 3  # each step's prompts drawn, none submitted


def test_the_colocated_async_trainer_replays_three_steps_through_the_no_code_route_holding_its_warmup_back(runs):
    """The replay run attaches through the wrapped fit() that JournaledAgentLoopManager under use_v1 installs."""
    _assert_replayed(runs, "colocate_async")
    assert runs["replayed"]["colocate_async"]["held"] == 4  # warm-up batch + one per step


def test_the_separate_async_trainer_journals_two_mini_batches_per_step_and_replays_them_call_for_call(runs):
    _assert_replayed(runs, "separate_async", calls_per_step=2)


def test_nearest_serves_unrecorded_steps_from_the_nearest_recorded_one_under_the_new_prompts(runs):
    recorded, replayed = runs["recorded"]["sync"], runs["replayed"]["sync_nearest"]
    assert [(a[0], a[1], a[4]) for a in replayed["actions"]] == [
        ("replayed", 1, 1), ("replayed", 2, 2), ("replayed", 3, 3), ("replayed", 4, 3), ("replayed", 5, 3)]
    assert replayed["updates"][:3] == recorded["updates"]
    for step in (4, 5):
        served, source = replayed["updates"][step - 1], recorded["updates"][2]
        # Same trajectories, rewards and advantages; step tags moved to the step that used them.
        assert {k: v for k, v in served.items() if k != "tags"} == {k: v for k, v in source.items() if k != "tags"}
        assert {t["global_steps"] for t in served["tags"]} == {step}
        # Staleness (weights version against the step) stays as recorded: verl's server reports the version it runs.
        staleness = {(t["min_global_steps"] - t["global_steps"], t["max_global_steps"] - t["global_steps"]) for t in served["tags"]}
        assert staleness == {(t["min_global_steps"] - t["global_steps"], t["max_global_steps"] - t["global_steps"])
                             for t in source["tags"]} == {(-1, -1)}


def test_dumps_of_verls_own_rollout_tq_skip_import_and_replay_under_the_v1_trainer(runs):
    imported = runs["import"]["imported"]
    assert sorted((r["run"], r["step"], r["gen_index"]) for r in imported) == sorted(
        [("v1_sync_stepjournal", s, 0) for s in (1, 2, 3)]
        + [("v1_separate_async_stepjournal", s, i) for s in (1, 2, 3) for i in (0, 1)])
    for name, calls in (("verl_sync", 1), ("verl_separate_async", 2)):
        recorded, replayed = runs["recorded"][name], runs["replayed"][name]
        assert recorded["actions"] == []  # verl's RolloutTqSkip ran, not stepjournal
        assert [a[:3] for a in replayed["actions"]] == [["replayed", s, i] for s in (1, 2, 3) for i in range(calls)]
        assert replayed["generate_calls"] == 0
        assert replayed["updates"] == recorded["updates"]


def test_an_imported_tq_batch_pt_round_trips_exactly(runs):
    from stepjournal import Journal
    from stepjournal.adapters.verl import TQBatch, tq_batch_diff

    root = runs["root"] / "verl_dumps"
    checked = 0
    for row in runs["import"]["imported"]:
        payload = torch.load(root / row["source"] / "tq_batch.pt", weights_only=False)
        expected = TQBatch(payload["tensordict"], payload["keys"], payload["tags"], "train")
        with Journal(str(root / "stepjournal"), run=row["run"], readonly=True) as journal:
            stored = journal.load_output(journal.lookup(row["step"], row["gen_index"]))
        assert tq_batch_diff(stored, expected) == []
        nested = [k for k in stored.fields.keys() if getattr(stored.fields.get(k), "is_nested", False)]
        assert "responses" in nested and stored.fields.get("responses").layout == torch.jagged
        checked += 1
    assert checked == 9


def test_the_docs_import_line_typed_with_home_and_hydra_outputs_where_it_says_imports_the_same_records(
        runs, tmp_path):
    """docs/verl.md's ``stepjournal import-verl ~/.verl/rollout_dump ... --config outputs/.../config.yaml``,
    typed in a folder holding Hydra's ``outputs/`` with HOME holding verl's dumps, as a user has them."""
    (line,) = DOC_LINES
    home, work = tmp_path / "home", tmp_path / "work"
    shutil.copytree(runs["root"] / "verl_dumps", home / ".verl" / "rollout_dump", ignore=shutil.ignore_patterns("stepjournal"))
    hydra = work / "outputs" / "2026-11-30" / "10-00-00" / ".hydra"
    hydra.mkdir(parents=True)
    shutil.copy(runs["root"] / "verl_config.yaml", hydra / "config.yaml")
    done = run_line(line.text, work, env={"HOME": str(home)})
    assert done.returncode == 0, done.stderr

    def rows(journal):
        shown = run_cli("audit", str(journal), "--json")
        assert shown.returncode == 0, shown.stderr
        return [(r["step"], r["gen_index"], r["mode"], r["action"], r["digest"], r["input_digest"])
                for r in json.loads(shown.stdout)]

    typed = rows(home / ".verl" / "rollout_dump" / "stepjournal")
    assert typed == rows(runs["root"] / "verl_dumps" / "stepjournal")[:len(typed)]
    assert len(typed) == len(runs["import"]["imported"])
