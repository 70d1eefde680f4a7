"""A verl V1 trainer on CPU: verl's own trainer classes, agent loop, reward loop, config and TransferQueue.

Real (verl 0.9.1): the V1 trainer of each mode and its ``fit()``; ``init()``'s own sequence minus
its GPU steps (`init_on_cpu`); ``AgentLoopManagerTQ`` created as ``TaskRunnerV1`` creates it, its
``AgentLoopWorkerTQ`` Ray actor running ``SingleTurnAgentLoop`` (chat template and Continuous Token
tokenization, ``_agent_loop_postprocess`` writing trajectories, keys and tags into TransferQueue);
``LLMServerManager``'s load balancer and verl's ``LLMServerClient`` / ``FullyAsyncLLMServerClient``;
``RewardLoopManager`` and its ``RewardLoopWorker`` actor scoring with verl's gsm8k ``compute_score``.

Stand-ins, each for something that needs a GPU: the LLM server behind the load balancer
(`TinyTokenServer`: vLLM's token-in/token-out ``generate`` returning a ``TokenOutput``), the actor
worker group (`ActorStandIn`: log-probs come from the rollout under ``bypass_mode``, the update
records the batch it is handed) and the weight sync (`CheckpointStandIn`: tells the server its
weights version, as ``CheckpointEngineManager`` does).

``trainer.init()`` itself is not called: ``_setup`` creates verl's resource pools with
``use_gpu=True`` placement groups, spawns the FSDP worker groups and calls ``init_model``, launches
vLLM replicas (``LLMServerManager.create`` -> ``init_hybrid``/``init_standalone``) and builds the
``CheckpointEngineManager`` over them; none of that can start without GPUs and vLLM. `init_on_cpu`
runs every other step of it, in its order, then the trainer's own ``on_init_end``.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from typing import Any, Dict, List

import ray
import torch

RAY_CPUS = 8
TQ_CONF = {"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}

_CORPUS = [
    "What is 3 plus 4? Answer with a number.",
    "Compute 2 times 5 and say the result.",
    "The answer is #### 7",
    "user assistant system",
]


def make_model_dir(root: str) -> str:
    """A tiny Qwen2 config and a tokenizer trained in-process (no download), as verl's model.path."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config

    path = os.path.join(root, "tiny-model")
    if os.path.isdir(path):
        return path
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(_CORPUS * 4, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>",
                                   padding_side="left")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast.save_pretrained(path)
    Qwen2Config(vocab_size=len(fast), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                architectures=["Qwen2ForCausalLM"]).save_pretrained(path)
    return path


def make_train_file(root: str, rows: int = 24) -> str:
    import pandas as pd

    path = os.path.join(root, "train.parquet")
    if os.path.isfile(path):
        return path
    records = []
    for i in range(rows):
        a, b = i % 5, (i * 3) % 4
        records.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {a} plus {b}? Answer with a number."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": i, "split": "train"},
        })
    pd.DataFrame(records).to_parquet(path)
    return path


def compose(overrides: List[str]) -> Any:
    """verl's ``ppo_trainer.yaml`` composed by Hydra with `overrides`, as ``main_ppo`` composes it."""
    import verl.trainer
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = os.path.join(os.path.dirname(verl.trainer.__file__), "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=list(overrides))


def mode_overrides(mode: str, root: str, *, n: int = 2, batch: int = 4, steps: int = 3,
                   extra: List[str] = ()) -> List[str]:
    model = make_model_dir(root)
    data = make_train_file(root)
    parameter_sync = 2 if mode == "separate_async" else 1
    out = [
        f"trainer.v1.trainer_mode={mode}",
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data}",
        f"data.val_files={data}",
        f"data.train_batch_size={batch}",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "data.dataloader_num_workers=0",
        "data.shuffle=false",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.name=vllm",  # the server stand-in takes vLLM's place
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch // parameter_sync}",
        "algorithm.adv_estimator=grpo",
        "algorithm.rollout_correction.bypass_mode=true",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[]",
        "trainer.resume_mode=disable",
        "trainer.experiment_name=v1_" + mode,
        "trainer.project_name=stepjournal",
    ]
    if mode == "separate_async":
        out += [
            f"trainer.v1.separate_async.parameter_sync_step={parameter_sync}",
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
        ]
    return out + list(extra)


def journal_overrides(root: str, policy: str = "cache") -> List[str]:
    """stepjournal's own section."""
    return [f"+stepjournal.dump_dir={os.path.join(root, 'dumps')}", f"+stepjournal.policy='{policy}'"]


def verl_skip_overrides(root: str) -> List[str]:
    """verl's own V1 skip (``skip.rollout_tq``): read by stepjournal when attached, else run by verl."""
    return ["skip.rollout_tq.enable=true", "skip.rollout_tq.steps=[1,2,3]", "skip.rollout_tq.action=cache",
            f"skip.rollout_tq.dump_dir={os.path.join(root, 'verl_dumps')}"]


def passes(root: str, phase: str) -> List[Dict[str, Any]]:
    """The runs of one process: name, mode, overrides, whether stepjournal attaches (in "replay" the sampler raises)."""
    if phase.startswith("stages_"):
        from verl_v1_stage_standins import stage_passes

        return stage_passes(root, phase, journal_overrides)
    if phase.startswith("tools_"):
        from verl_tool_standins import tool_passes

        return tool_passes(root, phase, journal_overrides)
    modes = ("sync", "colocate_async", "separate_async")
    if phase == "record":
        out = [dict(name=m, mode=m, extra=journal_overrides(root), attach=True) for m in modes]
        # verl's own RolloutTqSkip writes tq_batch.pt dumps (torch.save), for import-verl to migrate.
        out += [dict(name=f"verl_{m}", mode=m, extra=verl_skip_overrides(root), attach=False)
                for m in ("sync", "separate_async")]
        return out
    out = [dict(name=m, mode=m, extra=journal_overrides(root), attach=True) for m in modes]
    # The no-code route: the agent loop manager is marked as JournaledAgentLoopManager's V1 form is,
    # and the trainer's own (wrapped) fit attaches the journal.
    out[1]["route"] = "manager"
    # Steps 4 and 5 were never recorded: `nearest` serves step 3's batch under their own prompts.
    out.append(dict(name="sync_nearest", mode="sync", extra=journal_overrides(root, "nearest@1-5;passthrough"),
                    attach=True, steps=5))
    # The imported verl dumps, replayed by stepjournal reading verl's own skip.rollout_tq section.
    out += [dict(name=f"verl_{m}", mode=m, extra=verl_skip_overrides(root), attach=True)
            for m in ("sync", "separate_async")]
    return out


def run_config(root: str, run: Dict[str, Any]) -> Any:
    overrides = mode_overrides(run["mode"], root, steps=run.get("steps", 3), extra=run["extra"])
    given = {o.split("=", 1)[0] for o in run["extra"]}  # a run's own value of a key replaces the default one
    return compose([o for o in overrides if o in run["extra"] or o.split("=", 1)[0] not in given])


# -- stand-ins for what needs a GPU ---------------------------------------------------------------------


class FailingSampler(RuntimeError):
    """Raised by the stand-in LLM server when a run that must replay tries to generate."""


@ray.remote(num_cpus=0)
class TinyTokenServer:
    """The LLM server (``vLLMHttpServer``'s token-in/token-out ``generate``): a tiny seeded sampler.

    Returns a ``TokenOutput`` as vLLM's server does: token ids, float log-probs, ``stop_reason``,
    ``num_preempted`` and ``extra_fields`` with the weights version (``global_steps``, set by the
    checkpoint stand-in as verl's ``CheckpointEngineManager`` sets it). It reads the two numbers of
    the gsm8k-like prompt and answers right half the time, so rewards differ. ``fail``: it raises.
    """

    def __init__(self, model_path: str, seed: int, fail: bool) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(os.path.join(model_path, "tokenizer.json"))
        self.eos = self.tokenizer.token_to_id("<|im_end|>")
        self.seed, self.fail, self.calls, self.global_steps = seed, fail, 0, None

    def configure(self, fail: bool, seed: int) -> None:
        self.fail, self.seed = fail, seed

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def call_count(self) -> int:
        return self.calls

    async def generate(self, prompt_ids: List[int], sampling_params: Dict[str, Any], request_id: str,
                       image_data: Any = None, video_data: Any = None, audio_data: Any = None,
                       mm_processor_kwargs: Any = None, priority: int = 0, kv_transfer_params: Any = None) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        if self.fail:
            raise FailingSampler("the replay run tried to generate")
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=True)
        rng = random.Random(f"{self.seed}:{self.calls}:{text}")
        a, b = (int(x) for x in re.findall(r"\d+", text)[-2:])
        answer = a + b if rng.random() < 0.5 else rng.randint(0, 9)
        ids = self.tokenizer.encode(f"#### {answer}", add_special_tokens=False).ids + [self.eos]
        limit = sampling_params.get("max_tokens")
        ids = ids[:limit] if limit else ids
        return TokenOutput(token_ids=ids, log_probs=[round(-rng.random(), 4) for _ in ids], stop_reason="completed",
                           num_preempted=0, extra_fields={"global_steps": self.global_steps, "num_cached_tokens": 0})


def server_manager_class() -> type:
    """verl's ``LLMServerManager`` (its load balancer and clients) with the stand-in server as its only replica."""
    from verl.workers.rollout.llm_server import LLMServerManager

    class StandInServerManager(LLMServerManager):
        rollout_replica_class = None  # no vLLM/SGLang replica class: the server is TinyTokenServer

        def __init__(self, *args: Any, server: Any = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.server = server

        async def _initialize_llm_servers(self, start_rank: Any = None) -> None:
            self.rollout_replicas = []
            self.server_handles = [self.server] if self.server is not None else []
            self.server_addresses = ["tiny-token-server:0"] if self.server is not None else []

    return StandInServerManager


class ActorStandIn:
    """The actor worker group: no GPU work; `update_actor` keeps what it was handed, read from TransferQueue."""

    def __init__(self) -> None:
        self._dispatch_info = {"actor": [0]}
        self.updates: List[Dict[str, Any]] = []

    def _query_dispatch_info(self, role: str) -> List[int]:
        return [0]

    def update_actor(self, batch: Any) -> Dict[str, Any]:
        import transfer_queue as tq

        data = tq.kv_batch_get(keys=list(batch.keys), partition_id=batch.partition_id)
        self.updates.append({"keys": list(batch.keys), "tags": [dict(t) for t in batch.tags], "fields": data})
        return {"metrics": {"mfu": [0.0], "pg_loss": [0.0]}}


class CheckpointStandIn:
    """``CheckpointEngineManager``: no weights move; ``update_weights`` tells the server its version, as verl's does."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def update_weights(self, global_steps: Any = None) -> Dict[str, Any]:
        ray.get(self.server.set_global_steps.remote(global_steps))
        return {}

    def __getattr__(self, name: str) -> Any:  # sleep/abort/resume the replicas: nothing to do without a GPU
        return lambda *args, **kwargs: {}


class Rollout:
    """The rollout side of one phase: the stand-in server and verl's managers, built once per trainer mode.

    Starting a Ray actor costs seconds here (each imports torch and verl), so the runs of a phase
    share them: verl's ``RewardLoopManager`` (its workers are named actors, one set per Ray
    instance) and, per trainer mode, the ``LLMServerManager`` pair and each ``AgentLoopManagerTQ``
    class's manager. They read only the config sections in `SHARED`, which every run of a mode
    has equal (checked); TaskRunnerV1 builds the same objects from the same sections once per process.
    """

    SHARED = ("actor_rollout_ref.rollout", "actor_rollout_ref.model", "data", "reward")

    def __init__(self, config: Any, *, fail: bool, server_class: Any = None) -> None:
        from verl.experimental.reward_loop import RewardLoopManager

        self.server = (server_class or TinyTokenServer).remote(config.actor_rollout_ref.model.path, 7, fail)
        self.reward_loop_manager = RewardLoopManager(config=config, rm_resource_pool=None)
        self._built: Dict[Any, Any] = {}
        self._sections: Dict[str, Any] = {}

    def calls(self) -> int:
        return ray.get(self.server.call_count.remote())

    def _once(self, key: Any, config: Any, build: Any) -> Any:
        from omegaconf import OmegaConf

        sections = {name: OmegaConf.to_container(OmegaConf.select(config, name), resolve=True) for name in self.SHARED}
        mode = config.trainer.v1.trainer_mode
        assert self._sections.setdefault(mode, sections) == sections, f"runs of {mode} differ in {self.SHARED}"
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]

    def server_managers(self, trainer: Any) -> Any:
        """(hybrid, standalone) ``LLMServerManager`` for the trainer's mode; standalone is None but in separate_async."""
        manager, config = server_manager_class(), trainer.config

        def build() -> Any:
            if trainer.trainer_mode == "separate_async":
                # The stand-in server is the standalone replica; the hybrid (colocated) pool has none.
                return (manager.create(config=config, worker_group=trainer.actor_rollout_wg),
                        manager.create(config=config, start_rank=0, server=self.server))
            return manager.create(config=config, worker_group=trainer.actor_rollout_wg, server=self.server), None

        return self._once(("servers", trainer.trainer_mode), config, build)

    def agent_loop_manager(self, trainer: Any, cls: Any = None) -> Any:
        """verl's ``AgentLoopManagerTQ`` (or `cls`), created as ``TaskRunnerV1.init_agent_loop_manager`` creates it."""
        from verl.trainer.ppo.v1 import AgentLoopManagerTQ

        cls = cls or AgentLoopManagerTQ
        colocated = trainer.get_reward_handles() is None  # a colocated reward model: no streaming reward
        return self._once(("loop", trainer.trainer_mode, cls, colocated), trainer.config, lambda: cls.create(
            config=trainer.config,
            llm_client=trainer.get_llm_client(),
            teacher_client=trainer.get_teacher_client(),
            reward_loop_worker_handles=trainer.get_reward_handles(),
        ))


def init_on_cpu(trainer: Any, rollout: Rollout) -> None:
    """``PPOTrainer.init()``'s own sequence (``_setup`` then ``on_init_end``) with the GPU steps stood in.

    Run for real: ``_init_tokenizer``, ``_init_dataloader``, ``_init_dump_executor``,
    ``_init_resource_pool_mgr`` (the role and pool mapping), verl's ``RewardLoopManager`` and
    ``LLMServerManager.create`` (its load balancer; the replica is the stand-in server; both shared,
    see `Rollout`), separate_async's ``add_replicas_to_balancer``, ``_load_checkpoint`` and
    ``on_init_end``. Stood in: ``create_resource_pool`` (placement groups with ``use_gpu=True``), the
    worker groups and ``init_model`` (FSDP engines), the vLLM replicas and ``CheckpointEngineManager``.
    """
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer._init_dump_executor()
    trainer._init_resource_pool_mgr()
    trainer.actor_rollout_wg = ActorStandIn()
    trainer.reward_loop_manager = rollout.reward_loop_manager
    trainer.teacher_model_manager = None
    trainer.distillation_config = None
    trainer.llm_server_manager, standalone = rollout.server_managers(trainer)
    trainer.checkpoint_manager = CheckpointStandIn(rollout.server)
    if standalone is not None:
        from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

        trainer.standalone_server_manager = standalone
        trainer.standalone_checkpoint_manager = CheckpointStandIn(rollout.server)
        trainer.current_mode = HybridEngineMode.ROLLOUT
        trainer.add_replicas_to_balancer()
    trainer._load_checkpoint()
    trainer.on_init_end()


def build_trainer(config: Any, mode: str, rollout: Rollout) -> Any:
    """verl's V1 trainer of `mode`, initialised by `init_on_cpu`."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    trainer = get_trainer_cls(mode)(config=config)
    init_on_cpu(trainer, rollout)
    return trainer


def summary(trainer: Any) -> List[Dict[str, Any]]:
    """What each actor update was handed, with uids renamed by first appearance (verl draws fresh uuid4s per run)."""
    out = []
    for update in trainer.actor_rollout_wg.updates:
        fields = update["fields"]
        names: Dict[str, str] = {}
        uids = [names.setdefault(str(k).rsplit("_", 2)[0], f"p{len(names)}") for k in update["keys"]]
        keys = [f"{u}_{str(k).rsplit('_', 2)[1]}_{str(k).rsplit('_', 2)[2]}" for u, k in zip(uids, update["keys"])]
        entry = {"keys": keys, "tags": update["tags"]}
        for name in sorted(fields.keys()):
            value = fields.get(name)
            if name == "uid":
                entry[name] = [names[str(u)] for u in value.tolist()]
            elif isinstance(value, torch.Tensor) and value.is_nested:
                entry[name] = [t.tolist() for t in value.unbind()]
            elif isinstance(value, torch.Tensor):
                entry[name] = value.tolist()
            else:
                entry[name] = json.loads(json.dumps(value.tolist(), default=str))
        out.append(entry)
    return out


def drain(timeout_s: float = 900.0) -> None:
    """Wait until no prompt group is still generating, then clear TransferQueue for the next run.

    The wait ends when generation has (an observed state, however slow the machine); `timeout_s` only
    detects a hang, and raises rather than clearing what is still being written.
    """
    import transfer_queue as tq

    deadline = time.monotonic() + timeout_s
    while True:
        listed = tq.kv_list() or {}
        running = [k for items in listed.values() for k, tag in (items or {}).items()
                   if (tag or {}).get("status") in ("running", "pending")]
        if not running:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(running)} prompt groups still generating after {timeout_s:.0f} s: a hang")
        time.sleep(0.2)
    for partition, items in listed.items():
        if items:
            tq.kv_clear(keys=list(items), partition_id=partition)


def run_phase(root: str, phase: str, out_path: str) -> None:
    """Every run of `passes` in this process, on one local Ray and TransferQueue; what each actor saw, as JSON."""
    import transfer_queue as tq
    from omegaconf import OmegaConf

    from stepjournal.adapters.verl import attach, read_verl_config
    from stepjournal.adapters.verl.v1._hooks import (  # private: a verl adapter internal under test
        make_journaled_agent_loop_manager_tq,
    )

    if __name__ != "__main__":  # imported (not run as a script): Ray workers cannot import tests/ by name
        import sys

        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False, configure_logging=False)
    tq.init(OmegaConf.create(TQ_CONF))
    results: Dict[str, Any] = {}
    runs = passes(root, phase)
    try:
        rollout = Rollout(run_config(root, runs[0]), fail=phase in ("replay", "stages_replay", "tools_replay"),
                          server_class=runs[0].get("server_class"))
        for run in runs:
            config = run_config(root, run)
            trainer = build_trainer(config, run["mode"], rollout)
            if run.get("stages"):
                from verl_v1_stage_standins import with_stage_standins

                with_stage_standins(trainer, rollout, run)
            if run.get("tools"):
                from verl_tool_standins import sessions

                ray.get(rollout.server.configure.remote(phase == "tools_replay", 7, run["changed"]))
                sessions_before = sessions(read_verl_config(config).path)
            before = rollout.calls()
            if run.get("route") == "manager":
                # The no-code route: verl's TaskRunnerV1 loads the class named by agent_loop_manager_class.
                manager = rollout.agent_loop_manager(trainer, make_journaled_agent_loop_manager_tq())  # wraps fit
                trainer.fit(manager)
                journal = trainer.stepjournal
                assert journal.closed
            else:
                journal = attach(trainer) if run["attach"] else None
                try:
                    trainer.fit(rollout.agent_loop_manager(trainer))
                except Exception as exc:
                    if not run.get("expect_error"):
                        raise
                    results.setdefault(run["name"] + ":error", {"type": type(exc).__name__, "step": getattr(exc, "step", None),
                                                               "stage": getattr(exc, "stage", None), "message": str(exc)})
                finally:
                    if journal is not None:
                        journal.close()
            drain()  # the shared agent loop may still finish prompts submitted last: none may reach the next run
            results[run["name"]] = {
                "updates": summary(trainer),
                "actions": [[o.action, o.ctx.step, o.ctx.gen_index, o.ctx.mode,
                             o.source.step if o.source is not None else None]
                            for o in (journal.outcomes if journal is not None else [])],
                "generate_calls": rollout.calls() - before,
                "held": journal.held if journal is not None else 0,
            }
            if run.get("tools"):
                from verl_tool_standins import tool_results

                results[run["name"]].update(tool_results(journal, sessions_before))
            if run.get("stages"):
                from verl_v1_stage_standins import stage_results

                results[run["name"]].update(stage_results(trainer, journal, results.pop(run["name"] + ":error", None)))
                ray.get(rollout.server.configure.remote(phase != "stages_record", 7))  # back to this phase's sampler
    finally:
        tq.close()
        ray.shutdown()
    with open(out_path, "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    import sys

    run_phase(sys.argv[1], sys.argv[2], sys.argv[3])
