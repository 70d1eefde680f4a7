"""The TRL adapter's downstream stages on real `GRPOTrainer` runs with ``beta > 0``: each reward function,
the old-policy and the reference log-probs, and the logged metrics.

The tiny offline setup of test_trl_adapter.py; the model is saved to a folder and loaded from it, so
TRL can load the reference model too. The reward function counts its calls, standing in for an
expensive one (a sandbox, a judge); the reference model's forwards and TRL's log-prob computations
outside the loss are counted too.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer, RLOOConfig, RLOOTrainer

from stepjournal import Journal
from stepjournal.policies import SpecError, StageInputMismatchError, StageRoleError
from stepjournal.vocabulary import StageRole
from stepjournal.adapters.trl import attach

from test_trl_adapter import GENERATION_STEPS, PROMPTS, STEPS, common_args, forbid_generation, grpo, logged, losses, tiny_model
from test_trl_adapter import tokenizer  # noqa: F401  (the module's fixture)
from cli_support import run_cli

ALL_STAGES = "generate:{p}/reward:{p}/old_log_prob:{p}/ref_log_prob:{p}"


def make_reward(name: str, scale: float = 1.0):
    """A reward function called `name` that counts its calls (`.calls`); `scale` -1 prefers what 1 does not."""

    def reward(completions, **kwargs) -> list[float]:
        reward.calls += 1
        return [scale * float(len(c) % 5) for c in completions]

    reward.__name__ = reward.__qualname__ = name
    reward.calls = 0
    return reward


@pytest.fixture(scope="module")
def model_dir(tokenizer, tmp_path_factory) -> Path:  # noqa: F811
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    tiny_model(tokenizer).save_pretrained(folder)
    return folder


class Counted:
    """The trainer's work outside the loss, counted: the reference model's forwards and TRL's log-prob calls."""

    def __init__(self, trainer: GRPOTrainer, monkeypatch) -> None:
        self.ref_forwards = 0
        self.logps_calls = 0  # `_get_per_token_logps_and_entropies` without grad: old and ref log-probs
        trainer.ref_model.register_forward_pre_hook(lambda *_: self._ref())
        original = GRPOTrainer._get_per_token_logps_and_entropies

        @functools.wraps(original)  # keeps the signature the adapter checks
        def counting(trainer_self, *args, **kwargs):
            if not torch.is_grad_enabled():
                self.logps_calls += 1
            return original(trainer_self, *args, **kwargs)

        monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", counting)

    def _ref(self) -> None:
        self.ref_forwards += 1


def grpo_beta(tokenizer, model_dir: Path, out: Path, reward, config=None) -> GRPOTrainer:  # noqa: F811
    """A 4-step GRPO trainer with beta 0.04, loading its model (and TRL its reference model) from `model_dir`."""
    return grpo(tokenizer, out, reward=reward, config={"beta": 0.04, **(config or {})}, model=str(model_dir))


@pytest.fixture(scope="module")
def recorded(tokenizer, model_dir, tmp_path_factory):  # noqa: F811
    """One recorded 4-step GRPO run (beta 0.04) with every stage: its journal folder, trainer and counts."""
    folder = tmp_path_factory.mktemp("grpo_stages")
    reward = make_reward("length")
    trainer = grpo_beta(tokenizer, model_dir, folder / "out", reward)
    with pytest.MonkeyPatch.context() as monkeypatch:
        counted = Counted(trainer, monkeypatch)
        with Journal(folder / "journal") as journal:
            handle = attach(trainer, journal, ALL_STAGES.format(p="dump"))
            trainer.train()
    return folder / "journal", trainer, reward, counted, handle


def copy_journal(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_show_text_decodes_each_sample_as_the_trainer_did_with_the_reward_its_function_gave(
        recorded, tokenizer, tmp_path):  # noqa: F811
    """`show --text` of a real GRPO recording: the trainer's own tokenizer (saved where the CLI loads it
    offline) decodes what TRL decoded, and each reward is the reward function's value for that text."""
    path, _, _, _, _ = recorded
    folder = tmp_path / "tokenizer"
    tokenizer.save_pretrained(folder)
    done = run_cli("show", str(path), "0", "--text", "--tokenizer", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["samples"]
    with Journal(path, readonly=True) as journal:
        output, given = journal.load_output(journal.lookup(0)), journal.load_input(journal.lookup(0))
    assert [s["response"] for s in found] == tokenizer.batch_decode(output["completion_ids"], skip_special_tokens=True)
    assert [s["prompt"] for s in found] == tokenizer.batch_decode(given["prompt_ids"], skip_special_tokens=True)
    # make_reward("length"): len(completion) % 5 of the text TRL decoded, sample by sample.
    assert [s["rewards"]["reward.length"] for s in found] == [float(len(s["response"]) % 5) for s in found]
    assert all(s["logprob_mean"] is not None and s["action"] == "generated" for s in found)
    table = run_cli("show", str(path), "0", "--text", "--tokenizer", str(folder))
    assert table.returncode == 0 and f"· {len(found)} samples" in table.stdout.splitlines()[0]
    assert "reward.length" in table.stdout and "  response: " in table.stdout


def test_export_tensorboard_writes_the_numbers_trl_logged_at_each_step(recorded, tmp_path):
    """The metrics stage of a real GRPO run, through `export --tensorboard`, read back with TensorBoard's reader:
    each step's loss, reward and kl are the trainer's own log_history entries (as float32, a scalar's type)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path, trainer, _, _, _ = recorded
    done = run_cli("export", str(path), "--tensorboard", str(tmp_path / "tb"), "--no-text")
    assert done.returncode == 0, done.stderr
    (folder,) = {p.parent for p in (tmp_path / "tb").rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    f32 = lambda v: float(torch.tensor(float(v), dtype=torch.float32))  # noqa: E731
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in history] == list(range(1, STEPS + 1))
    for name in ("loss", "reward", "kl", "completions/mean_length"):  # TRL logs the reward at generating steps only
        assert {e.step: e.value for e in events.Scalars(f"metrics/{name}")} == {
            entry["step"]: f32(entry[name]) for entry in history if name in entry}
    assert "metrics/step_time" not in events.Tags()["scalars"]  # a timing the metrics stage leaves out
    assert {e.step for e in events.Scalars("samples/count")} == set(GENERATION_STEPS)
    assert {e.step: e.value for e in events.Scalars("metrics/train_loss")} == {
        STEPS: f32(trainer.state.log_history[-1]["train_loss"])}  # train()'s own log, the last step's second call


def test_a_recording_journals_each_stage_at_the_step_it_runs(recorded):
    path, trainer, reward, counted, handle = recorded
    # The recording did the work that a replay must skip: 2 generations, 2 reward calls, old and ref log-probs.
    assert reward.calls == len(GENERATION_STEPS)
    assert counted.ref_forwards >= len(GENERATION_STEPS) and counted.logps_calls == 2 * len(GENERATION_STEPS)
    assert handle.stages == ("generate", "old_log_prob", "ref_log_prob", "reward.length", "metrics")
    with Journal(path, readonly=True) as journal:
        # and the tokenizer, kept once when `attach` ran (docs/journal.md, "The run's tokenizer")
        assert sorted(journal.stages()) == ["generate", "metrics", "old_log_prob", "ref_log_prob", "reward.length",
                                            "tokenizer"]
        for stage in ("generate", "reward.length", "old_log_prob", "ref_log_prob"):
            assert journal.recorded_steps(stage=stage) == GENERATION_STEPS
        assert journal.recorded_steps(stage="metrics") == list(range(1, STEPS + 1))
        assert journal.recorded_indices(STEPS, stage="metrics") == [0, 1]  # the last step's log, then train()'s
        metrics = journal.load_output(journal.lookup(1, stage="metrics"))
        ref = journal.load_output(journal.lookup(0, stage="ref_log_prob"))
        rewards = journal.load_output(journal.lookup(0, stage="reward.length"))
    first = trainer.state.log_history[0]
    assert metrics["loss"] == first["loss"] and metrics["kl"] == first["kl"] and "step_time" not in metrics
    logps = ref["outputs"][0]
    assert logps.dtype == torch.float32 and logps.shape[0] == len(PROMPTS)
    assert len(rewards["rewards"]) == len(PROMPTS) and rewards["log_metric"] == []


def test_a_replayed_grpo_run_computes_no_generate_reward_or_log_probs_and_logs_the_same_bit_for_bit(
    tokenizer, model_dir, recorded, tmp_path, monkeypatch  # noqa: F811
):
    source, recorded_run, _, _, _ = recorded
    reward = make_reward("length")
    trainer = grpo_beta(tokenizer, model_dir, tmp_path / "out", reward)
    forbid_generation(trainer, monkeypatch)
    counted = Counted(trainer, monkeypatch)
    with Journal(copy_journal(source, tmp_path / "journal")) as journal:
        handle = attach(trainer, journal, ALL_STAGES.format(p="replay"))
        trainer.train()
        session = [r for r in journal.audit() if r.session == journal.session]
    # Nothing downstream ran: no reward call, no reference forward, no log-prob computation outside the loss.
    assert (reward.calls, counted.ref_forwards, counted.logps_calls) == (0, 0, 0)
    assert handle.counts["replayed"] == len(GENERATION_STEPS)
    for stage in ("reward.length", "old_log_prob", "ref_log_prob"):
        assert handle.stage_counts[stage] == {"replayed": len(GENERATION_STEPS)}
    assert handle.stage_counts["metrics"] == {"generated": STEPS + 1}  # recorded again, never replayed into training
    assert sorted({(r.stage, r.action) for r in session}) == [
        ("generate", "replayed"), ("metrics", "generated"), ("old_log_prob", "replayed"),
        ("ref_log_prob", "replayed"), ("reward.length", "replayed"),
    ]
    assert len(losses(trainer)) == STEPS and losses(trainer) == losses(recorded_run)
    assert logged(trainer) == logged(recorded_run)  # loss, kl, reward, grad_norm ... bit for bit
    assert "kl" in recorded_run.state.log_history[0]


def test_a_reward_replayed_onto_other_completions_is_refused(tokenizer, model_dir, recorded, tmp_path):  # noqa: F811
    source, _, _, _, _ = recorded
    reward = make_reward("length")
    # generate is not named: it samples again, at another temperature, so the completions differ.
    trainer = grpo_beta(tokenizer, model_dir, tmp_path / "out", reward, config={"temperature": 0.5})
    with Journal(copy_journal(source, tmp_path / "journal")) as journal:
        attach(trainer, journal, {"reward": "replay"})
        with pytest.raises(StageInputMismatchError, match="refused to replay stage 'reward.length' at step 0") as caught:
            trainer.train()
        refused = [r for r in journal.audit() if r.session == journal.session and r.action == "refused"]
    assert (caught.value.step, caught.value.stage) == (0, "reward.length")
    assert caught.value.recorded_digest != caught.value.current_digest
    assert [(r.step, r.stage) for r in refused] == [(0, "reward.length")]
    assert reward.calls == 0

    # With on_stage_input_mismatch="generate" the reward is computed again on the new completions.
    trainer = grpo_beta(tokenizer, model_dir, tmp_path / "out2", reward, config={"temperature": 0.5})
    with Journal(tmp_path / "journal") as journal:
        handle = attach(trainer, journal, {"reward": "replay"}, on_stage_input_mismatch="generate")
        trainer.train()
    assert reward.calls == len(GENERATION_STEPS)
    assert handle.stage_counts["reward.length"] == {"generated": len(GENERATION_STEPS)}


def test_one_spec_is_generates_and_the_metrics_stage_is_recorded_by_default(tokenizer, model_dir, tmp_path):  # noqa: F811
    reward = make_reward("length")
    trainer = grpo_beta(tokenizer, model_dir, tmp_path / "out", reward, config={"max_steps": 1})
    with Journal(tmp_path / "journal") as journal:
        handle = attach(trainer, journal, "cache")
        trainer.train()
        assert journal.stages() == ["tokenizer", "generate", "metrics"]  # the tokenizer kept when `attach` ran
        assert handle.stages == ("generate", "metrics")
    assert reward.calls == 1 and trainer.reward_funcs[0] is reward  # not wrapped: not journaled
    handle.detach()


def test_a_per_stage_spec_naming_an_unknown_stage_is_refused_with_the_closest_name(
    tokenizer, model_dir, tmp_path  # noqa: F811
):
    reward = make_reward("length")
    trainer = grpo_beta(tokenizer, model_dir, tmp_path / "out", reward)
    with Journal(tmp_path / "journal") as journal:
        with pytest.raises(SpecError, match=r"'reward\.lenght' \(did you mean 'reward\.length'\?\)"):
            attach(trainer, journal, "generate:cache/reward.lenght:replay")
        with pytest.raises(SpecError, match=r"'ref_logprob' \(did you mean 'ref_log_prob'\?\)"):
            attach(trainer, journal, {"generate": "cache", "ref_logprob": "replay"})
        assert getattr(trainer, "_stepjournal", None) is None
        assert journal.last_seq() == 0  # a refused start leaves no session in the log
        handle = attach(trainer, journal, "generate:cache/reward.length:cache/old_log_prob:cache")
        assert handle.stages == ("generate", "reward.length", "old_log_prob", "metrics")
        handle.detach()
        assert trainer.reward_funcs[0] is reward  # detach gives the trainer its own functions back
        assert "_get_per_token_logps_and_entropies" not in vars(trainer) and "log" not in vars(trainer)


def test_a_metrics_policy_that_may_replay_is_refused_as_verl_refuses_it(tokenizer, model_dir, tmp_path):  # noqa: F811
    """TRL declares ``metrics`` record-only, as verl does; the engine enforces the typed role for both."""
    trainer = grpo_beta(tokenizer, model_dir, tmp_path / "out", make_reward("length"))
    with Journal(tmp_path / "journal") as journal:
        for spec in ("generate:cache/metrics:replay", {"generate": "cache", "metrics": "dump@1-2;repeat"}):
            with pytest.raises(StageRoleError) as refused:
                attach(trainer, journal, spec)
            assert (refused.value.stage, refused.value.role) == ("metrics", StageRole.RECORD_ONLY)
        assert getattr(trainer, "_stepjournal", None) is None and journal.last_seq() == 0
        handle = attach(trainer, journal, "generate:cache/metrics:passthrough")
        assert handle.stages[-1] == "metrics"
        handle.detach()


# -- RLOO, an async reward function and its logged metrics ---------------------------------------------------------
def make_async_judge():
    """An async reward function (a judge, say) that logs a metric of its own and counts its calls."""

    async def judge(completions, log_metric, **kwargs) -> list[float]:
        judge.calls += 1
        scores = [float(len(set(c)) % 3) for c in completions]
        log_metric("judge/mean", sum(scores) / len(scores))
        return scores

    judge.calls = 0
    return judge


def test_rloo_replays_an_async_reward_and_its_logged_metric_bit_for_bit(tokenizer, tmp_path, monkeypatch):  # noqa: F811
    def rloo(out: Path, judge) -> RLOOTrainer:
        return RLOOTrainer(
            model=tiny_model(tokenizer), reward_funcs=judge, args=RLOOConfig(**common_args(out, STEPS)),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tokenizer,
        )

    judge = make_async_judge()
    recorded_run = rloo(tmp_path / "out-record", judge)
    with Journal(tmp_path / "journal") as journal:
        attach(recorded_run, journal, "generate:dump/reward:dump/old_log_prob:dump")
        recorded_run.train()
    assert judge.calls == len(GENERATION_STEPS)
    assert "judge/mean" in recorded_run.state.log_history[0]

    judge = make_async_judge()
    trainer = rloo(tmp_path / "out-replay", judge)
    forbid_generation(trainer, monkeypatch)
    with Journal(tmp_path / "journal") as journal:
        handle = attach(trainer, journal, "generate:replay/reward:replay/old_log_prob:replay")
        trainer.train()
    assert judge.calls == 0
    assert handle.stage_counts["reward.judge"] == {"replayed": len(GENERATION_STEPS)}
    assert handle.stage_counts["old_log_prob"] == {"replayed": len(GENERATION_STEPS)}
    assert logged(trainer) == logged(recorded_run)  # judge/mean too: its log_metric call was made again


def test_the_weights_version_is_the_policys_global_step_and_the_reference_models_last_sync(
    tokenizer, model_dir, tmp_path  # noqa: F811
):
    from stepjournal.adapters.trl._stages import weights_version  # private: a TRL adapter internal under test

    fixed = grpo_beta(tokenizer, model_dir, tmp_path / "a", make_reward("length"))
    synced = grpo_beta(tokenizer, model_dir, tmp_path / "b", make_reward("length"),
                       config={"sync_ref_model": True, "ref_model_sync_steps": 2})
    seen = []
    for step in (0, 1, 2, 3, 5):
        fixed.state.global_step = synced.state.global_step = step
        seen.append((weights_version(fixed, "old_log_prob"), weights_version(fixed, "ref_log_prob"),
                     weights_version(synced, "ref_log_prob")))
    assert seen == [(0, 0, 0), (1, 0, 0), (2, 0, 2), (3, 0, 2), (5, 0, 4)]
