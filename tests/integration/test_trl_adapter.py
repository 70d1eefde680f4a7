"""The TRL adapter, on real `GRPOTrainer` / `RLOOTrainer` runs: a tiny Qwen2 built from a config and a
tokenizer trained in-process, on the CPU, with no network.

Each run has the same seeds and model init, so a replayed run must log exactly (bit for bit) what the
recorded run logged. Timing metrics are the only logged values left out of the comparisons.
"""

from __future__ import annotations

import copy
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer
from trl_tiny import PROMPTS, length_reward, logged, tiny_model, tiny_tokenizer
from trl_tiny import grpo_args as common_args

from stepjournal import Journal
from stepjournal.policies import FingerprintMismatchError, InputMismatchError
from stepjournal.adapters.trl._codec import (  # private: a TRL adapter internal under test
    capture_rng_state, restore_rng_state,
)
from stepjournal.adapters.cli import main as cli_main
from stepjournal.adapters.trl import (
    PAYLOAD_FORMAT,
    SUPPORTED_TRL,
    JournaledRLOOTrainer,
    TrlAdapterError,
    TrlSignatureError,
    attach,
    trainer_fingerprint,
)
from cli_support import run_cli

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4
# steps_per_generation=2 with one micro-step per optimizer step: TRL generates at steps 0 and 2.
GENERATION_STEPS = [0, 2]


# -- a tiny, offline TRL setup (tests/trl_tiny.py, shared with the accelerate driver) ------------------------
@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return tiny_tokenizer()


def grpo(tokenizer, out: Path, *, max_steps: int = STEPS, cls=GRPOTrainer, reward=length_reward, config=None,
         prompts=PROMPTS, model=None, **extra):
    args = GRPOConfig(**{**common_args(out, max_steps), **(config or {})})
    return cls(
        model=tiny_model(tokenizer) if model is None else model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        **extra,
    )


def rloo(tokenizer, out: Path, *, cls=RLOOTrainer, **extra):
    return cls(
        model=tiny_model(tokenizer),
        reward_funcs=length_reward,
        args=RLOOConfig(**common_args(out, STEPS)),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
        **extra,
    )


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def forbid_generation(trainer, monkeypatch) -> None:
    def generate(*args, **kwargs):
        raise AssertionError("this run must replay: model.generate was called")

    monkeypatch.setattr(trainer.model, "generate", generate)


def calls_of(journal: Journal) -> list[tuple[int, int, str, str]]:
    """(step, gen_index, mode, action) of this session's generate calls, from the audit (metrics are a stage of their own)."""
    return [(r.step, r.gen_index, r.mode, r.action) for r in generate_rows(journal)]


def generate_rows(journal: Journal) -> list:
    """This session's audit rows of the generate stage."""
    return [r for r in journal.audit(stage="generate") if r.session == journal.session]


def record_grpo(tokenizer, folder: Path, max_steps: int = STEPS):
    trainer = grpo(tokenizer, folder / "out", max_steps=max_steps)
    with Journal(folder / "journal") as journal:
        attach(trainer, journal, "dump")
        trainer.train()
        recorded = calls_of(journal)
    return trainer, recorded


@pytest.fixture(scope="module")
def grpo_recorded(tokenizer, tmp_path_factory):
    """One recorded 4-step GRPO run: its journal folder (copy it before writing) and its trainer."""
    folder = tmp_path_factory.mktemp("grpo_record")
    trainer, recorded = record_grpo(tokenizer, folder)
    return folder / "journal", trainer, recorded


def copy_journal(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "journal"
    shutil.copytree(source, target)
    return target


# -- GRPO: record, replay, cache ------------------------------------------------------------------------------
def test_grpo_records_each_generation_at_the_optimizer_step_it_happens(grpo_recorded):
    _, _, recorded = grpo_recorded
    assert recorded == [(step, 0, "train", "generated") for step in GENERATION_STEPS]


def test_grpo_replay_reproduces_losses_and_logged_metrics_without_generating(
    tokenizer, grpo_recorded, tmp_path, monkeypatch, capsys
):
    source, recorded_run, _ = grpo_recorded
    trainer = grpo(tokenizer, tmp_path / "out")
    forbid_generation(trainer, monkeypatch)
    path = copy_journal(source, tmp_path)
    with Journal(path) as journal:
        # verify_input: a replay is refused unless the trainer asked with the very prompt ids recorded.
        handle = attach(trainer, journal, "replay", verify_input=True, on_input_mismatch="error")
        trainer.train()
        assert calls_of(journal) == [(step, 0, "train", "replayed") for step in GENERATION_STEPS]
    assert handle.counts == {"generated": 0, "replayed": len(GENERATION_STEPS), "bypassed": 0}
    assert handle.rng_restored == len(GENERATION_STEPS)
    assert len(losses(trainer)) == STEPS
    assert losses(trainer) == losses(recorded_run)
    assert logged(trainer) == logged(recorded_run)

    # `stepjournal audit` shows which steps were replayed, and from which recorded call.
    capsys.readouterr()  # drop what training printed
    assert cli_main(["audit", str(path), "--action", "replayed", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["source_step"], r["source_gen_index"], r["mode"]) for r in rows] == [
        (step, step, 0, "train") for step in GENERATION_STEPS
    ]


def test_grpo_replay_without_restoring_the_rng_drifts(tokenizer, grpo_recorded, tmp_path, monkeypatch):
    """Why the RNG state is stored: skipping sampling alone changes TRL's later shuffles."""
    source, recorded_run, _ = grpo_recorded
    trainer = grpo(tokenizer, tmp_path / "out")
    forbid_generation(trainer, monkeypatch)
    with Journal(copy_journal(source, tmp_path)) as journal:
        attach(trainer, journal, "replay", restore_rng=False)
        trainer.train()
    assert logged(trainer) != logged(recorded_run)


def test_serving_another_steps_record_keeps_the_current_rng(tokenizer, grpo_recorded, tmp_path, monkeypatch):
    """The stored RNG state belongs to its own step: a `repeat_last` replay of step 2 at step 0 leaves it."""
    source, _, _ = grpo_recorded
    trainer = grpo(tokenizer, tmp_path / "out", max_steps=STEPS // 2)
    forbid_generation(trainer, monkeypatch)
    with Journal(copy_journal(source, tmp_path)) as journal:
        handle = attach(trainer, journal, "repeat_last")
        trainer.train()
        [served] = generate_rows(journal)
    assert (served.step, served.action, served.source_step) == (0, "replayed", 2)
    assert handle.rng_restored == 0


def test_grpo_cache_over_a_half_filled_journal_generates_only_the_missing_steps(
    tokenizer, grpo_recorded, tmp_path
):
    _, full_run, _ = grpo_recorded
    _, half = record_grpo(tokenizer, tmp_path, max_steps=STEPS // 2)
    assert half == [(0, 0, "train", "generated")]

    trainer = grpo(tokenizer, tmp_path / "out-cache")
    with Journal(tmp_path / "journal") as journal:
        attach(trainer, journal, "cache")
        trainer.train()
        assert calls_of(journal) == [(0, 0, "train", "replayed"), (2, 0, "train", "generated")]
        assert journal.recorded_steps() == GENERATION_STEPS
    # The replayed step restored the RNG, so the generated one sampled what the full recording did.
    assert logged(trainer) == logged(full_run)


# -- a replay at the same step checks the prompts ---------------------------------------------------------
OTHER_PROMPTS = [f"{p} hello" for p in PROMPTS]  # another dataset: other prompt ids at every step


def test_replay_into_a_trainer_with_another_dataset_refuses_naming_the_step(tokenizer, grpo_recorded, tmp_path, monkeypatch):
    source, _, _ = grpo_recorded
    trainer = grpo(tokenizer, tmp_path / "out", prompts=OTHER_PROMPTS)
    forbid_generation(trainer, monkeypatch)
    with Journal(copy_journal(source, tmp_path)) as journal:
        attach(trainer, journal, "replay")
        with pytest.raises(InputMismatchError, match="prompts differ from the ones recorded at step 0 index 0") as caught:
            trainer.train()
        assert (caught.value.step, caught.value.gen_index) == (0, 0)
        assert calls_of(journal) == [(0, 0, "train", "refused")]
        assert "prompts differ" in generate_rows(journal)[0].reason


def test_cache_into_a_trainer_with_another_dataset_regenerates_each_step(tokenizer, grpo_recorded, tmp_path):
    source, _, _ = grpo_recorded
    fresh = grpo(tokenizer, tmp_path / "fresh", prompts=OTHER_PROMPTS)
    fresh.train()  # what an unjournaled run on the other dataset logs
    trainer = grpo(tokenizer, tmp_path / "out", prompts=OTHER_PROMPTS)
    with Journal(copy_journal(source, tmp_path)) as journal:
        handle = attach(trainer, journal, "cache")
        trainer.train()
        assert calls_of(journal) == [(step, 0, "train", "generated") for step in GENERATION_STEPS]
        assert all("prompts differ" in r.reason for r in generate_rows(journal))
    assert handle.counts["replayed"] == 0
    assert logged(trainer) == logged(fresh)


def test_the_same_dataset_still_replays_and_check_prompts_off_serves_other_prompts(
    tokenizer, grpo_recorded, tmp_path, monkeypatch
):
    source, _, _ = grpo_recorded
    trainer = grpo(tokenizer, tmp_path / "out", prompts=OTHER_PROMPTS)
    forbid_generation(trainer, monkeypatch)
    with Journal(copy_journal(source, tmp_path)) as journal:
        handle = attach(trainer, journal, "replay", check_prompts="off")  # the behaviour before the check
        trainer.train()
        assert calls_of(journal) == [(step, 0, "train", "replayed") for step in GENERATION_STEPS]
    assert handle.counts["replayed"] == len(GENERATION_STEPS)
    with Journal(tmp_path / "j2") as journal, pytest.raises(TrlAdapterError, match="check_prompts='sometimes'"):
        attach(grpo(tokenizer, tmp_path / "out2"), journal, check_prompts="sometimes")


def test_serving_another_steps_record_is_not_a_prompt_mismatch(tokenizer, grpo_recorded, tmp_path, monkeypatch):
    source, _, _ = grpo_recorded
    trainer = grpo(tokenizer, tmp_path / "out", prompts=OTHER_PROMPTS)
    forbid_generation(trainer, monkeypatch)
    with Journal(copy_journal(source, tmp_path)) as journal:
        attach(trainer, journal, "repeat_last")  # serves the last recorded step, by design other prompts
        trainer.train()
        rows = generate_rows(journal)
    assert [(r.step, r.action) for r in rows] == [(step, "replayed") for step in GENERATION_STEPS]
    # Step 0 is served step 2's record as the policy says. At step 2 the last recorded step is step 2
    # itself, recorded for other prompts: set aside, the policy's rule then picks step 0.
    assert [r.source_step for r in rows] == [2, 0]


# -- engine options: one object, every option ------------------------------------------------------------------
def test_attach_takes_every_engine_option_as_a_keyword_or_as_one_options_object(tokenizer, tmp_path):
    from stepjournal.policies import EngineOptions

    trainer = grpo(tokenizer, tmp_path / "out")
    with Journal(tmp_path / "journal") as journal:
        handle = attach(trainer, journal, on_corrupt="regenerate", verify_input=True)
        assert handle.engine.options == EngineOptions(on_corrupt="regenerate", verify_input=True, bypass_modes=("eval",),
                                                      check_prompts="same_step")
        handle.detach()
        options = EngineOptions(allow_fingerprint_mismatch=True, on_input_mismatch="error")
        handle = attach(trainer, journal, options=options, bypass_eval=False)
        assert handle.engine.options == EngineOptions(allow_fingerprint_mismatch=True, on_input_mismatch="error",
                                                      bypass_modes=(), check_prompts="same_step")
        handle.detach()
        with pytest.raises(TypeError, match="did you mean 'on_corrupt'"):
            attach(trainer, journal, on_corupt="regenerate")
        with pytest.raises(TypeError, match="options= and also verify_input="):
            attach(trainer, journal, options=options, verify_input=True)
        with pytest.raises(TypeError, match="bypass_eval"):
            attach(trainer, journal, bypass_modes=["eval"])
        assert getattr(trainer, "_stepjournal", None) is None  # a refused attach leaves the trainer as it was


def test_recorded_payloads_hold_prompt_ids_completion_ids_logprobs_and_rng_state(grpo_recorded, tmp_path):
    source, _, _ = grpo_recorded
    with Journal(copy_journal(source, tmp_path), readonly=True) as journal:
        recorded = journal.lookup(0)
        given, output = journal.load_input(recorded), journal.load_output(recorded)
    assert given["num_generations"] == 4
    assert len(given["prompt_ids"]) == 8 and all(isinstance(t, int) for ids in given["prompt_ids"] for t in ids)
    assert output["format"] == PAYLOAD_FORMAT and output["kind"] == "_generate_single_turn"
    assert len(output["completion_ids"]) == 8 and all(0 < len(ids) <= 8 for ids in output["completion_ids"])
    assert output["logprobs"] is None  # transformers' generate does not return them (vLLM would)
    rng = output["rng"]
    assert rng["torch"].dtype == torch.uint8 and rng["torch"].shape == torch.get_rng_state().shape
    assert set(rng) >= {"torch", "python", "numpy"}


def test_rng_state_round_trips_through_the_journal(jpath):
    state = capture_rng_state()
    expected = (torch.rand(3).tolist(), random.random(), float(np.random.rand()))
    with Journal(jpath) as journal:
        stored = journal.load_output(journal.record(0, {"rng": state}))
    torch.rand(5), random.random(), np.random.rand()  # move every generator on
    assert restore_rng_state(stored["rng"]) == ("torch", "python", "numpy")
    assert (torch.rand(3).tolist(), random.random(), float(np.random.rand())) == expected


# -- RLOO, and the mixin form ------------------------------------------------------------------------------------
def test_rloo_replay_through_the_mixin_reproduces_the_recorded_run(tokenizer, tmp_path, monkeypatch):
    recorded_run = rloo(tokenizer, tmp_path / "out-record")
    with Journal(tmp_path / "journal") as journal:
        attach(recorded_run, journal, "dump")
        recorded_run.train()
        assert calls_of(journal) == [(step, 0, "train", "generated") for step in GENERATION_STEPS]

    with Journal(tmp_path / "journal") as journal:
        trainer = rloo(tokenizer, tmp_path / "out-replay", cls=JournaledRLOOTrainer, journal=journal,
                       journal_policy="replay")
        forbid_generation(trainer, monkeypatch)
        trainer.train()
        assert calls_of(journal) == [(step, 0, "train", "replayed") for step in GENERATION_STEPS]
        assert trainer.stepjournal.counts["replayed"] == len(GENERATION_STEPS)
    assert len(losses(trainer)) == STEPS
    assert logged(trainer) == logged(recorded_run)


# -- rollout_func ----------------------------------------------------------------------------------------------
def noisy_reward(completions, **kwargs) -> list[float]:
    # Draws from Python's RNG after each rollout: a replay must leave it where the recording did.
    return [float(len(c) % 5) + random.random() for c in completions]


def sampling_rollout(prompts, trainer) -> dict:
    """A custom rollout drawing from torch's and Python's global RNGs, as a real sampler would."""
    tok = trainer.processing_class
    completion_ids = [torch.randint(3, len(tok), (random.randint(2, 6),)).tolist() for _ in prompts]
    return {
        "prompt_ids": [tok(p)["input_ids"] for p in prompts],
        "completion_ids": completion_ids,
        "logprobs": [[-1.0] * len(ids) for ids in completion_ids],
        "origin": ["sampling_rollout"] * len(prompts),  # an extra field, forwarded to the rewards
    }


def failing_rollout(prompts, trainer) -> dict:
    raise AssertionError("this run must replay: rollout_func was called")


def test_rollout_func_is_journaled_instead_of_single_turn(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    recorded_run = grpo(tokenizer, tmp_path / "out-record", reward=noisy_reward, rollout_func=sampling_rollout)
    with Journal(tmp_path / "journal") as journal:
        handle = attach(recorded_run, journal, "dump")
        assert handle.target == "rollout_func"
        recorded_run.train()
        output = journal.load_output(journal.lookup(0))
        assert output["kind"] == "rollout_func"
        assert output["rollout"]["origin"][0] == "sampling_rollout"
        assert output["rollout"]["logprobs"][0][0] == -1.0

    trainer = grpo(tokenizer, tmp_path / "out-replay", reward=noisy_reward, rollout_func=failing_rollout)
    forbid_generation(trainer, monkeypatch)
    with Journal(tmp_path / "journal") as journal:
        attach(trainer, journal, "replay")
        trainer.train()
        assert calls_of(journal) == [(step, 0, "train", "replayed") for step in GENERATION_STEPS]
    assert logged(trainer) == logged(recorded_run)


# -- evaluation ---------------------------------------------------------------------------------------------------
def test_eval_generations_are_bypassed_and_journaled_under_mode_eval(tokenizer, tmp_path):
    trainer = grpo(
        tokenizer,
        tmp_path / "out",
        config={"per_device_eval_batch_size": 4},  # 2 prompts x 4 generations: two eval batches
        eval_dataset=Dataset.from_dict({"prompt": PROMPTS[:2]}),
    )
    with Journal(tmp_path / "journal") as journal:
        attach(trainer, journal, "replay")  # an empty journal: only a bypass can let eval run
        trainer.evaluate()
        assert calls_of(journal) == [(0, 0, "eval", "bypassed"), (0, 1, "eval", "bypassed")]


# -- guards ----------------------------------------------------------------------------------------------------------
class DriftedGRPOTrainer(GRPOTrainer):
    """Stands for a TRL release whose `_generate_single_turn` takes other parameters."""

    def _generate_single_turn(self, prompt_ids, sampling_params):
        raise AssertionError("never called: attach must refuse first")


def test_attach_refuses_a_trainer_whose_intercepted_method_has_drifted(tokenizer, tmp_path):
    trainer = grpo(tokenizer, tmp_path / "out", cls=DriftedGRPOTrainer)
    with Journal(tmp_path / "journal") as journal:
        with pytest.raises(TrlSignatureError, match=r"DriftedGRPOTrainer\._generate_single_turn.*expects"):
            attach(trainer, journal, "cache")
    assert "_generate_single_turn" not in vars(trainer)


def test_attach_refuses_other_objects_and_a_second_attach(tokenizer, tmp_path):
    trainer = grpo(tokenizer, tmp_path / "out")
    with Journal(tmp_path / "journal") as journal:
        with pytest.raises(TrlAdapterError, match="GRPOTrainer or trl.RLOOTrainer"):
            attach(object(), journal)
        handle = attach(trainer, journal)
        with pytest.raises(TrlAdapterError, match="already attached"):
            attach(trainer, journal)
        handle.detach()
        assert "_generate_single_turn" not in vars(trainer)
        attach(trainer, journal).detach()


def test_fingerprint_names_what_a_recording_depends_on(tokenizer, tmp_path):
    fp = trainer_fingerprint(grpo(tokenizer, tmp_path / "out"))
    assert fp["trainer"] == "GRPOTrainer" and fp["num_generations"] == 4 and fp["num_processes"] == 1
    Journal(tmp_path / "journal", fingerprint=fp).close()  # every value is a JSON scalar


SETTING_CHANGES = [
    # (which fingerprint key must change, GRPOConfig keywords)
    ("top_p", {"top_p": 0.9}),
    ("top_k", {"top_k": 5}),
    ("min_p", {"min_p": 0.1}),
    ("repetition_penalty", {"repetition_penalty": 1.2}),
    ("generation_kwargs", {"generation_kwargs": {"no_repeat_ngram_size": 2}}),
    ("temperature", {"temperature": 0.7}),
    ("max_completion_length", {"max_completion_length": 6}),
]


@pytest.mark.parametrize("key,config", SETTING_CHANGES, ids=[c[0] for c in SETTING_CHANGES])
def test_every_sampling_setting_is_in_the_fingerprint(tokenizer, tmp_path, key, config):
    base = trainer_fingerprint(grpo(tokenizer, tmp_path / "a"))
    assert trainer_fingerprint(grpo(tokenizer, tmp_path / "b")) == base  # stable across builds
    changed = trainer_fingerprint(grpo(tokenizer, tmp_path / "c", config=config))
    assert changed[key] != base[key]
    assert changed["generation_config"] != base["generation_config"]  # what transformers samples with


def test_the_model_config_and_the_tokenizer_are_in_the_fingerprint(tokenizer, tmp_path):
    base = trainer_fingerprint(grpo(tokenizer, tmp_path / "a"))
    wider = grpo(tokenizer, tmp_path / "b")
    torch.manual_seed(0)
    wider.model = Qwen2ForCausalLM(Qwen2Config(**{**wider.model.config.to_dict(), "intermediate_size": 48}))
    assert trainer_fingerprint(wider)["model_config"] != base["model_config"]
    assert trainer_fingerprint(wider)["model"] == base["model"]  # the model type alone tells them apart no more
    templated = grpo(tokenizer, tmp_path / "c")
    templated.processing_class = copy.deepcopy(tokenizer)
    templated.processing_class.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert trainer_fingerprint(templated)["chat_template"] != base["chat_template"]
    assert {"tokenizer", "tokenizer_vocab_size", "tokenizer_vocab"} <= set(base)


def test_a_replay_after_changing_a_sampling_setting_is_refused(tokenizer, tmp_path, monkeypatch):
    recorded = grpo(tokenizer, tmp_path / "rec", max_steps=1)
    with Journal(tmp_path / "journal", fingerprint=trainer_fingerprint(recorded)) as journal:
        attach(recorded, journal, "dump")
        recorded.train()
    trainer = grpo(tokenizer, tmp_path / "out", max_steps=1, config={"top_p": 0.5})
    forbid_generation(trainer, monkeypatch)
    with Journal(tmp_path / "journal", fingerprint=trainer_fingerprint(trainer)) as journal:
        attach(trainer, journal, "replay")
        with pytest.raises(FingerprintMismatchError, match="top_p: recorded 1.0, now 0.5"):
            trainer.train()


@pytest.fixture(scope="module")
def grpo_recorded_with_fingerprint(tokenizer, tmp_path_factory):
    """A one-step GRPO run recorded under its trainer's fingerprint: its journal folder (copy it before writing)."""
    folder = tmp_path_factory.mktemp("grpo_fingerprint")
    recorded = grpo(tokenizer, folder / "out", max_steps=1)
    with Journal(folder / "journal", fingerprint=trainer_fingerprint(recorded)) as journal:
        attach(recorded, journal, "dump")
        recorded.train()
    return folder / "journal"


@pytest.mark.parametrize(
    "setting, recorded_value, value",
    [
        ("num_generations", 4, 2),
        ("per_device_train_batch_size", 4, 8),
        ("steps_per_generation", 2, 1),
        ("num_iterations", 1, 2),
        ("seed", 7, 8),
        ("temperature", 1.0, 0.7),
        ("top_k", 0, 3),
        ("max_completion_length", 8, 6),
    ],
)
def test_a_replay_with_one_fingerprinted_setting_changed_names_that_setting(
    tokenizer, grpo_recorded_with_fingerprint, tmp_path, monkeypatch, setting, recorded_value, value
):
    """The configuration is checked before the prompts: the refusal names the setting, and only what is true."""
    trainer = grpo(tokenizer, tmp_path / "out", max_steps=1, config={setting: value})
    forbid_generation(trainer, monkeypatch)
    with Journal(copy_journal(grpo_recorded_with_fingerprint, tmp_path), fingerprint=trainer_fingerprint(trainer)) as journal:
        attach(trainer, journal, "replay")
        with pytest.raises(FingerprintMismatchError) as caught:
            trainer.train()
        rows = generate_rows(journal)
    assert caught.value.differences[setting] == (recorded_value, value)
    assert f"{setting}: recorded {recorded_value!r}, now {value!r}" in str(caught.value)
    message = str(caught.value)
    assert "prompts differ" not in message and "nothing recorded" not in message
    assert [(r.step, r.action) for r in rows] == [(0, "refused")] and rows[0].reason == message


def test_a_replay_with_other_prompts_says_only_that_the_prompts_differ(tokenizer, grpo_recorded, tmp_path, monkeypatch):
    trainer = grpo(tokenizer, tmp_path / "out", prompts=OTHER_PROMPTS)
    forbid_generation(trainer, monkeypatch)
    with Journal(copy_journal(grpo_recorded[0], tmp_path)) as journal:
        attach(trainer, journal, "replay")
        with pytest.raises(InputMismatchError) as caught:
            trainer.train()
    message = str(caught.value)
    assert "prompts differ from the ones recorded at step 0 index 0" in message
    assert "nothing recorded" not in message and "check_prompts='off'" in message


def test_supported_trl_range_is_the_one_the_extra_declares():
    # A regex rather than tomllib, which Python 3.10 (still supported) lacks.
    extra = re.search(r"^trl = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert extra is not None and extra.group(1) == f'"trl{SUPPORTED_TRL}"'


def test_cli_in_a_subprocess_reads_a_grpo_journal(grpo_recorded):
    """The shell command on a journal the TRL adapter wrote: audit, verify and show, without TRL loaded."""
    source, _, recorded = grpo_recorded

    audit = run_cli("audit", str(source), "--stage", "generate", "--json")
    assert audit.returncode == 0, audit.stderr
    rows = json.loads(audit.stdout)
    assert [(r["step"], r["gen_index"], r["mode"], r["action"]) for r in rows] == recorded
    assert run_cli("verify", str(source)).returncode == 0
    shown = run_cli("show", str(source), str(GENERATION_STEPS[0]))
    assert shown.returncode == 0, shown.stderr
    assert "completion_ids" in shown.stdout and "rng" in shown.stdout


def test_the_handle_is_a_trl_recorder_and_trl_journal_stays_its_alias():
    from stepjournal.adapters.trl import TrlJournal, TrlRecorder

    assert TrlJournal is TrlRecorder and TrlRecorder.__name__ == "TrlRecorder"
    assert attach.__annotations__["return"] in ("TrlRecorder", TrlRecorder)


def test_without_trl_the_errors_import_and_attach_names_the_extra(tmp_path):
    """trl blocked: the errors and SUPPORTED_TRL import, `attach` raises ImportError with the pip hint."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'trl':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import stepjournal.adapters.trl as t\n"
        "assert issubclass(t.TrlSignatureError, t.TrlAdapterError) and t.SUPPORTED_TRL.startswith('>=')\n"
        "try:\n"
        "    from stepjournal.adapters.trl import attach\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('attach imported without trl')\n"
        "assert 'trl' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "attach needs TRL" in result.stdout and "pip install -e '.[trl]'" in result.stdout
