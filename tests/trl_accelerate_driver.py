"""A GRPO training driver as a user writes one, for `accelerate launch` (one process per rank).

    CUDA_VISIBLE_DEVICES="" accelerate launch --multi_gpu --num_processes 2 trl_accelerate_driver.py JOURNAL POLICY OUT

Every process attaches the one journal folder (LMDB is safe for several processes of one machine)
and records or replays its own shard (mode ``train/p<rank>``). Each writes OUT/rank<k>.json: what it
logged (floats as exact hex), its adapter counts and how many times generate and the reward ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from stepjournal import Journal  # noqa: E402
from stepjournal.adapters.trl import attach  # noqa: E402
from trl_tiny import grpo_args, length_reward, logged, prompts_dataset, tiny_model, tiny_tokenizer  # noqa: E402

journal_path, policy, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
calls = {"generate": 0, "reward": 0}


def reward(completions, **kwargs):
    calls["reward"] += 1
    return length_reward(completions, **kwargs)


tokenizer = tiny_tokenizer()
trainer = GRPOTrainer(model=tiny_model(tokenizer), reward_funcs=reward, args=GRPOConfig(**grpo_args(out / "trainer", 4)),
                      train_dataset=prompts_dataset(), processing_class=tokenizer)
generate = trainer.model.generate


def counted_generate(*args, **kwargs):
    calls["generate"] += 1
    return generate(*args, **kwargs)


trainer.model.generate = counted_generate
rank = trainer.accelerator.process_index
with Journal(journal_path, run="grpo") as journal:
    handle = attach(trainer, journal, policy)
    trainer.train()
(out / f"rank{rank}.json").write_text(json.dumps({
    "logged": logged(trainer), "counts": handle.counts, "calls": calls,
    "num_processes": trainer.accelerator.num_processes,
}))
