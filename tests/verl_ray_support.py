"""Ray actors for the multi-node fully-async test (no tests here; tests/e2e/test_verl_multinode.py uses them).

Ray workers import this module by name (the test puts tests/ on their PYTHONPATH), so it holds only
what a worker process needs: the rollouter around verl's real ``FullyAsyncAgentLoopManager`` and the
seeded sampler that stands in for verl's GPU-bound agent-loop workers.
"""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any, Dict, List, Sequence

import numpy as np
import ray
import torch
from omegaconf import OmegaConf

from verl_support import FakeGenerator, make_rows

RUN_KEY = "exp_proj"  # verl_run_key of verl_support.verl_config: {experiment}_{project}


def rollout_config(dump_dir: str, *, n: int = 2, experiment: str = "exp", policy: str = "",
                   payload_store: str = "") -> Dict[str, Any]:
    """A fully-async rollouter's config: one prompt per feed index, `n` responses each.

    Without `policy` it enables verl's own ``skip.async_rollout`` form (action cache, as docs/verl.md's
    command line); with one, a ``stepjournal`` section (``step_source: feed_index``) instead, whose
    ``payload_store`` is `payload_store` when given.
    """
    from verl_support import verl_config

    stores = {"payload_store": payload_store} if payload_store else {}
    cfg = verl_config(dump_dir, policy=policy, step_source="feed_index", **stores) if policy else verl_config(dump_dir)
    cfg["trainer"]["experiment_name"] = experiment
    cfg["data"].update(train_batch_size=0, gen_batch_size=1)
    cfg["actor_rollout_ref"]["rollout"].update(n=n, multi_turn={"enable": False})
    if not policy:
        cfg["skip"] = {"async_rollout": {"enable": True, "dump_dir": dump_dir, "steps": list(range(64)), "action": "cache"}}
    return cfg


def shell(line: str, cwd: str) -> subprocess.CompletedProcess:
    """Run one command line through the shell, as a user types it (PATH and credentials from the environment)."""
    return subprocess.run(line, shell=True, cwd=cwd, capture_output=True, text=True, timeout=900)  # a hang detector only


@ray.remote(num_cpus=0)
class SeededSampler:
    """Stands in for verl's ``AgentLoopWorker`` (an LLM server needs a GPU): ``generate_sequences``
    answers from a generator seeded by the prompt, so any worker on any node gives the same answer.
    With `fail` it raises: a replay must not generate."""

    def __init__(self, seed: int = 1234, *, fail: bool = False) -> None:
        self.generator = FakeGenerator(seed, fail=fail)

    def generate_sequences(self, prompts: Any) -> Any:
        return self.generator.generate_sequences(prompts)

    def calls(self) -> int:
        return len(self.generator.calls)


@ray.remote(num_cpus=0)
class Rollouter:
    """The rollout side: verl's real ``FullyAsyncAgentLoopManager`` dispatching to `workers`.

    The manager is built with ``__new__`` and given ``config`` and ``agent_loop_workers``: verl's own
    ``__init__`` starts the GPU-bound LLM servers. Its ``generate_sequences_single`` is verl's method as
    patched in this process by the Ray setup hook (``install_fully_async``); nothing here patches it.
    """

    def __init__(self, config: Dict[str, Any], workers: Sequence[Any]) -> None:
        from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncAgentLoopManager

        self.cls = FullyAsyncAgentLoopManager
        self.workers = list(workers)
        self.manager: Any = None
        self.configure(config)

    def configure(self, config: Dict[str, Any]) -> None:
        """A new manager for `config` (the previous one's journal closed first: one LMDB env per path)."""
        self.close()
        self.config = OmegaConf.create(config)
        manager = self.cls.__new__(self.cls)
        manager.config = self.config
        manager.agent_loop_workers = self.workers
        self.manager = manager

    def where(self) -> Dict[str, Any]:
        """This actor's node and whether its process's verl class was patched by the setup hook."""
        method = self.cls.generate_sequences_single
        return {
            "node": ray.get_runtime_context().get_node_id(),
            "installed": bool(getattr(self.cls, "_stepjournal_installed", False)),
            "patched_by": getattr(method, "__module__", None),
        }

    async def roll(self, indices: List[int], epoch: int = 0) -> List[Any]:
        """Generate one sample per feed index, all at once, named as verl's
        ``FullyAsyncRollouter._process_single_sample_streaming`` names them."""
        from verl.experimental.fully_async_policy.detach_utils import prepare_single_generation_data
        from verl.utils.dataset.rl_dataset import collate_fn

        async def one(index: int) -> Any:
            full_batch = prepare_single_generation_data(collate_fn(make_rows(index, 1)), self.config)
            sample_id = f"sample_{epoch}_{index}"  # _feed_samples: f"sample_{epoch}_{self.global_steps}"
            full_batch.non_tensor_batch["uid"] = np.array([f"uid_{sample_id}"] * len(full_batch), dtype=object)
            return await self.manager.generate_sequences_single(full_batch)

        return list(await asyncio.gather(*[one(i) for i in indices]))

    async def try_roll(self, indices: List[int]) -> Dict[str, Any]:
        """`roll`, reporting a refusal as (type, message, attributes) instead of raising it across Ray."""
        try:
            await self.roll(indices)
        except Exception as exc:  # noqa: BLE001 - the test asserts on the type's name and message
            return {"type": type(exc).__name__, "message": str(exc), "mro": [c.__name__ for c in type(exc).__mro__],
                    "step": getattr(exc, "step", None), "differences": getattr(exc, "differences", None)}
        return {"type": None}

    def journal_path(self) -> str:
        return self.manager.stepjournal.journal.path

    def close(self) -> None:
        if self.manager is not None and "_stepjournal" in self.manager.__dict__:
            self.manager.stepjournal.close()

    def shell(self, line: str, cwd: str) -> Dict[str, Any]:
        done = shell(line, cwd)
        return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                "node": ray.get_runtime_context().get_node_id()}


def reward(responses: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Rule reward: 1 where the first response token answers the row's ground truth."""
    return (responses[:, 0] == truth).to(torch.float32)
