"""Shared pieces of the verl adapter tests (no tests here): realistic DataProtos, a seeded fake
generator, a PPO-shaped training loop built from verl's own DataProto operations, stand-ins for the
legacy trainer's stage workers, and verl's Hydra composition of an entry point's config (`compose`).

The generator is a seeded function, not a model: it answers each prompt with tokens drawn from a
torch generator seeded by (seed, step, call), and answers correctly (first token = the ground truth)
for about half the prompts, so rewards depend on pairing responses with the right ground truth.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.skip import SkipManager
import verl.utils.tensordict_utils as tu

PROMPT_LEN = 6
RESPONSE_LEN = 5
N = 2  # rollout.n
GBS = 4  # prompts per step


def verl_config(tmp: str, **stepjournal: Any) -> Dict[str, Any]:
    """A verl-shaped config (the keys the adapter reads) with a stepjournal section."""
    cfg: Dict[str, Any] = {
        "trainer": {"experiment_name": "exp", "project_name": "proj", "v1": {"trainer_mode": "sync"}},
        "data": {"train_batch_size": GBS, "gen_batch_size": None, "max_prompt_length": PROMPT_LEN,
                 "max_response_length": RESPONSE_LEN},
        "actor_rollout_ref": {"rollout": {"n": N, "agent": {"num_workers": 2}}},
    }
    if stepjournal:
        stepjournal.setdefault("dump_dir", tmp)
        cfg["stepjournal"] = stepjournal
    return cfg


def realistic_dataproto(rows: int = 8, seed: int = 0) -> DataProto:
    """A rollout output as verl's agent loop makes it: ids, masks, fp32/bf16 log-probs, uids, reward dicts."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 32000, (rows, PROMPT_LEN), generator=g, dtype=torch.int64)
    responses = torch.randint(0, 32000, (rows, RESPONSE_LEN), generator=g, dtype=torch.int64)
    attention = torch.ones(rows, PROMPT_LEN + RESPONSE_LEN, dtype=torch.int64)
    attention[:, :2] = 0
    batch = TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "response_mask": (responses % 7 != 0).to(torch.int64),
            "position_ids": torch.clamp(torch.cumsum(attention, dim=1) - 1, min=0),
            "rollout_log_probs": -torch.rand(rows, RESPONSE_LEN, generator=g, dtype=torch.float32),
            "old_log_probs": (-torch.rand(rows, RESPONSE_LEN, generator=g)).to(torch.bfloat16),
            "rm_scores": torch.tensor([[float("nan"), -0.0, 1.0, float("inf"), 0.5]] * rows, dtype=torch.float32),
        },
        batch_size=[rows],
    )
    non_tensor = {
        "uid": np.array([str(uuid.UUID(int=seed * 1000 + i)) for i in range(rows)], dtype=object),
        "data_source": np.array(["openai/gsm8k"] * rows, dtype=object),
        "reward_model": np.array(
            [{"ground_truth": str(i * 7), "style": "rule", "extra": {"ids": [i, i + 1], "note": None}} for i in range(rows)],
            dtype=object,
        ),
        "raw_prompt": np.array([[{"role": "user", "content": f"What is {i} * 7? ✓"}] for i in range(rows)], dtype=object),
        "__num_turns__": np.full(rows, 2, dtype=np.int32),
        "tool_rewards": np.array([None] * rows, dtype=object),
    }
    meta = {"timing": {"gen": 1.25, "agent_loop/slowest/num_preempted": np.int64(0)}, "global_steps": 3,
            "temperature": 1.0, "reward_extra_keys": ["acc"], "eos_token_id": [1, 2], "nested": {"a": (1, "b")}}
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)


def answer_token(ground_truth: str) -> int:
    return int(ground_truth) % 97 + 3


class FakeGenerator:
    """Seeded stand-in for the model servers: ``generate_sequences(prompts) -> DataProto``.

    Copies the input's non-tensor fields into its output, as verl's agent loop does when rewards are
    computed by the trainer, so the trainer's `DataProto.union` checks that they agree.
    """

    def __init__(self, seed: int = 1234, *, fail: bool = False) -> None:
        """`fail`: raise on every training call (replay runs must not generate)."""
        self.seed = seed
        self.fail = fail
        self.calls: List[int] = []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        # Validation calls are bypassed by the journal, so they still generate in a replay run.
        if self.fail and not prompts.meta_info.get("validate", False):
            raise AssertionError("the generator was called for a training step during a replay run")
        step = int(prompts.meta_info.get("global_steps", -1))
        self.calls.append(step)
        # Seeded by what is asked (a model's answer depends on its prompts), not by how often it ran.
        asked = int(hashlib.sha256(repr(list(prompts.non_tensor_batch["raw_prompt"])).encode()).hexdigest()[:8], 16)
        return make_output(prompts, self.seed, step, asked)


def make_output(prompts: DataProto, seed: int, step: int, salt: int) -> DataProto:
    rows = len(prompts)
    g = torch.Generator().manual_seed((seed * 1_000_003 + step * 101 + salt) % (1 << 62))
    responses = torch.randint(3, 30000, (rows, RESPONSE_LEN), generator=g, dtype=torch.int64)
    right = torch.rand(rows, generator=g) < 0.5
    for i, rm in enumerate(prompts.non_tensor_batch["reward_model"]):
        if right[i]:
            responses[i, 0] = answer_token(rm["ground_truth"])
    prompt_ids = torch.tensor(
        [[(sum(map(ord, str(p))) + j) % 32000 for j in range(PROMPT_LEN)] for p in prompts.non_tensor_batch["raw_prompt"]],
        dtype=torch.int64,
    )
    batch = TensorDict(
        {
            "prompts": prompt_ids,
            "responses": responses,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": torch.ones(rows, PROMPT_LEN + RESPONSE_LEN, dtype=torch.int64),
            "rollout_log_probs": -torch.rand(rows, RESPONSE_LEN, generator=g),
            "ref_log_prob_bf16": (-torch.rand(rows, RESPONSE_LEN, generator=g)).to(torch.bfloat16),
        },
        batch_size=[rows],
    )
    non_tensor = {"__num_turns__": np.full(rows, 2, dtype=np.int32)}
    non_tensor.update(prompts.non_tensor_batch)
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info={"timing": {"gen": 0.01 * (salt % 7 + 1)}})


def make_rows(step: int, count: int, offset: int = 0) -> List[Dict[str, Any]]:
    """Dataset rows as verl's RLHFDataset returns them (dummy tensor + Python fields)."""
    rows = []
    for i in range(count):
        k = step * 100 + offset + i
        rows.append({
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
            "raw_prompt": [{"role": "user", "content": f"question {k}: what is {k} + {k}?"}],
            "data_source": "toy/add",
            "reward_model": {"ground_truth": str(2 * k), "style": "rule"},
            "extra_info": {"index": k, "split": "train"},
            "index": k,
            "tools_kwargs": {},
            "interaction_kwargs": {},
        })
    return rows


def score(batch: DataProto) -> torch.Tensor:
    """Rule reward: 1 when the first response token answers the row's own ground truth."""
    truth = torch.tensor([answer_token(rm["ground_truth"]) for rm in batch.non_tensor_batch["reward_model"]])
    return (batch.batch["responses"][:, 0] == truth).to(torch.float32)


def digest(data: DataProto) -> str:
    h = hashlib.sha256()
    for key in data.batch.keys():
        h.update(key.encode())
        h.update(data.batch[key].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


class MiniPPOTrainer:
    """The generate/reward part of verl's ``RayPPOTrainer.fit`` with a fake generator.

    Per step: dataset rows -> ``DataProto.from_single_dict`` -> fresh uids -> verl's own
    ``_get_gen_batch`` -> ``repeat(n)`` -> ``async_rollout_manager.generate_sequences`` -> the batch
    that matches the responses -> ``repeat(n).union(output)`` -> rule rewards. DAPO steps call the
    generator again with fresh prompts (dynamic sampling); validation calls carry ``validate``.
    """

    def __init__(
        self,
        config: Dict[str, Any],
        generator: FakeGenerator,
        *,
        dapo: Optional[Dict[int, int]] = None,
        validate_at: tuple = (0, 6, 12),
        on_call: Optional[Callable[[int, int], None]] = None,
    ) -> None:
        self.config = config
        self.async_rollout_manager = generator
        self.global_steps = 0
        self.dapo = dapo or {}
        self.validate_at = validate_at
        self.on_call = on_call
        self.journaled: Any = None  # the JournaledRollout, when attached
        self.history: Dict[tuple, Dict[str, Any]] = {}

    def _generate(self, batch: DataProto, call: int) -> DataProto:
        gen_batch = RayPPOTrainer._get_gen_batch(self, batch)
        gen_batch.meta_info["global_steps"] = self.global_steps
        gen_batch = gen_batch.repeat(repeat_times=N, interleave=True)
        output = self.async_rollout_manager.generate_sequences(gen_batch)
        if self.journaled is not None:
            batch = self.journaled.matching_batch(batch)
        output.meta_info.pop("timing", None)
        batch = batch.repeat(repeat_times=N, interleave=True).union(output)
        rewards = score(batch)
        self.history[(self.global_steps, call)] = {
            "digest": digest(output),
            "reward": rewards.tolist(),
            "truth": [rm["ground_truth"] for rm in batch.non_tensor_batch["reward_model"]],
            "output": output,
        }
        if self.on_call is not None:
            self.on_call(self.global_steps, call)
        return batch

    def validate(self) -> None:
        rows = make_rows(10_000 + self.global_steps, GBS)
        batch = DataProto.from_single_dict(collate_fn(rows))
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(GBS)], dtype=object)
        gen_batch = RayPPOTrainer._get_gen_batch(self, batch)
        gen_batch.meta_info = {"validate": True, "global_steps": self.global_steps, "do_sample": False}
        out = self.async_rollout_manager.generate_sequences(gen_batch)
        self.history[("validate", self.global_steps)] = {"rows": len(out)}

    def fit(self, *, start: int = 1, total: int = 12) -> None:
        self.global_steps = start - 1
        if self.global_steps in self.validate_at:
            self.validate()
        for step in range(start, total + 1):
            self.global_steps = step
            for call in range(self.dapo.get(step, 1)):
                batch = DataProto.from_single_dict(collate_fn(make_rows(step, GBS, offset=10 * call)))
                batch.meta_info["temperature"] = 1.0
                batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(GBS)], dtype=object)
                self._generate(batch, call)
            if step in self.validate_at:
                self.validate()


def kill_at(step: int, call: int) -> Callable[[int, int], None]:
    """An ``on_call`` hook that kills this process hard (SIGKILL) after the given call was journaled."""

    def hook(s: int, c: int) -> None:
        if (s, c) == (step, call):
            os.kill(os.getpid(), 9)

    return hook


DAPO = {3: 2, 7: 2, 8: 3, 10: 2}  # train step -> generate calls (DAPO's dynamic sampling)


def record_until_killed(tmp: str) -> None:
    """Child process of the resume test: record a run and die by SIGKILL right after step 7's first call."""
    from stepjournal.adapters.verl import attach

    trainer = MiniPPOTrainer(verl_config(tmp, policy="cache"), FakeGenerator(), dapo=DAPO, on_call=kill_at(7, 0))
    trainer.journaled = attach(trainer)
    trainer.fit()
    raise AssertionError("the run should have been killed at step 7")


# module -> (config folder inside the verl package, config name): what each module's @hydra.main names.
ENTRY_POINTS = {
    "verl.trainer.main_ppo": ("trainer/config", "ppo_trainer"),
    "verl.experimental.fully_async_policy.fully_async_main": ("experimental/fully_async_policy/config",
                                                               "fully_async_ppo_trainer"),
}


def compose(module: str, overrides: list):
    import verl
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    folder, name = ENTRY_POINTS[module]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), folder), version_base=None):
        return hydra_compose(config_name=name, overrides=overrides)


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


class Workers:
    """``actor_rollout_wg`` / ``ref_policy_wg`` / ``critic_wg``: outputs shaped as verl's engine workers return them."""

    def __init__(self):
        self.calls = {"old_log_prob": 0, "ref_log_prob": 0, "values": 0}

    def compute_log_prob(self, td):
        self.calls["old_log_prob"] += 1
        ids = td["input_ids"].unbind()
        out = tu.get_tensordict({"log_probs": _nested([-(t % 7).float() / 10 for t in ids]),
                                 "entropy": _nested([(t % 3).float() / 10 for t in ids])})
        tu.assign_non_tensor(out, metrics={"mfu": 0.0})
        return out

    def compute_ref_log_prob(self, td):
        self.calls["ref_log_prob"] += 1
        return tu.get_tensordict({"log_probs": _nested([-(t % 5).float() / 10 for t in td["input_ids"].unbind()])})

    def infer_batch(self, td):
        self.calls["values"] += 1
        values = tu.get_tensordict({"values": _nested([(t % 4).float() / 10 for t in td["input_ids"].unbind()])})
        return type("Future", (), {"get": lambda self: values})()


@pytest.fixture(autouse=True)
def fresh_skip_manager():
    """verl's SkipManager keeps its state on the class: each test of a module that imports this fixture leaves
    none behind."""
    yield
    SkipManager.config = None
    SkipManager.step = -1
    SkipManager.skip_instances = {}
