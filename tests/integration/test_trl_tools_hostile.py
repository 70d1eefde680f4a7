"""TRL's real `GRPOTrainer` with hostile tools, journaled: a tool that raises, a tool that answers with a value
the journal's codec has no form for. Only generation is a stand-in (tests/trl_tool_runs.py's seeded trainer,
its script of turns replaced here); TRL's tool loop, its failure counting and its training are its own.
"""

from __future__ import annotations

from typing import Any, List

import pytest

from trl_tool_runs import StandInGRPOTrainer, _call, answer_reward, tool_tokenizer
from trl_tiny import logged, tiny_model
from datasets import Dataset
from trl import GRPOConfig

from stepjournal import Journal
from stepjournal.adapters.trl import attach

RUNS: List[str] = []  # each real run of a tool in this process


def divide(a: int, b: int) -> str:
    """Divide two integers.

    Args:
        a: the dividend.
        b: the divisor.
    """
    RUNS.append(f"divide({a},{b})")
    return str(a // b)  # b == 0 raises: TRL shows the model {"error": ...} and counts a failure


def digits(n: int) -> Any:
    """The set of the digits of a number.

    Args:
        n: the number.
    """
    RUNS.append(f"digits({n})")
    return set(str(n))  # TRL shows the model str() of it; the journal's codec has no form for a set


class HostileStandIn(StandInGRPOTrainer):
    """Turn 1: ``divide(a, 0)`` and ``digits(a)``; then an answer that quotes both responses."""

    def _next_turn(self, responses: List[str], changed: bool) -> str:
        if not responses:
            return _call("divide", a=17, b=0) + "\n" + _call("digits", n=1771) + "<|im_end|>"
        return f"answer {len(responses[0])}{len(responses[1])}<|im_end|>"


def _trainer(out) -> HostileStandIn:
    tokenizer = tool_tokenizer()
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=4, num_generations=4, steps_per_generation=2,
        max_completion_length=256, max_steps=2, logging_steps=1, learning_rate=1e-2, lr_scheduler_type="constant",
        beta=0.0, bf16=False, use_cpu=True, report_to=[], save_strategy="no", seed=7, disable_tqdm=True,
    )
    prompts = Dataset.from_dict({"prompt": [[{"role": "user", "content": "compute"}],
                                            [{"role": "user", "content": "compute again"}]]})
    return HostileStandIn(model=tiny_model(tokenizer, max_positions=1024), reward_funcs=answer_reward, args=args,
                          train_dataset=prompts, processing_class=tokenizer, kind="tools", tools=[divide, digits])


def _train(out, journal: Journal, spec: str) -> Any:
    trainer = _trainer(out)
    handle = attach(trainer, journal, spec)
    try:
        trainer.train()
    finally:
        handle.detach()
    return trainer, handle


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trl-hostile")
    RUNS.clear()
    with Journal(str(folder / "j")) as journal:
        trainer, _ = _train(folder / "record", journal, "generate:cache/tools:cache")
    assert RUNS and all(run in ("divide(17,0)", "digits(1771)") for run in RUNS)
    return folder, trainer, len(RUNS)


def test_tools_replayed_under_live_generation_serve_a_raised_error_and_an_odd_value_as_recorded(recorded):
    """A tool that raised and one whose value the codec cannot hold were seen by the model as text: replayed with
    live generation, TRL sees the same text and counts the same failures, and no tool runs."""
    folder, record, _ = recorded
    RUNS.clear()
    with Journal(str(folder / "j")) as journal:
        trainer, handle = _train(folder / "live", journal, "tools:replay")
    assert RUNS == []
    assert handle.tool_counts == {"tool.divide": {"replayed": 8}, "tool.digits": {"replayed": 8}}
    assert [batch["completions"] for batch in trainer.batches] == [batch["completions"] for batch in record.batches]
    failures = [entry.get("tools/failure_frequency") for entry in logged(trainer)]
    assert failures == [entry.get("tools/failure_frequency") for entry in logged(record)] and failures[0] is not None
