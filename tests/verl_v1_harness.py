"""A verl V1 trainer on CPU: verl's own trainer classes, ReplayBuffer, config and TransferQueue.

Only what needs a GPU is a stand-in: the actor worker group (log-probs and the update, which here
records the batch it is handed), the weight-sync managers, and the LLM behind the agent loop (a tiny
seeded sampler that writes trajectories into TransferQueue with the fields, dtypes and tags verl's
``AgentLoopWorkerTQ`` writes, scored by verl's own gsm8k reward function).

`run_mode(mode, ...)` builds a trainer from verl's ``ppo_trainer.yaml`` (composed by Hydra), skips
only ``init()`` (it starts GPU workers) and runs the trainer's own ``fit()``.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any, Dict, List

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
    """The runs of one process: name, mode, overrides, whether stepjournal attaches, whether the sampler fails."""
    modes = ("sync", "colocate_async", "separate_async")
    if phase == "record":
        out = [dict(name=m, mode=m, extra=journal_overrides(root), attach=True, fail=False) for m in modes]
        # verl's own RolloutTqSkip writes tq_batch.pt dumps (torch.save), for import-verl to migrate.
        out += [dict(name=f"verl_{m}", mode=m, extra=verl_skip_overrides(root), attach=False, fail=False)
                for m in ("sync", "separate_async")]
        return out
    out = [dict(name=m, mode=m, extra=journal_overrides(root), attach=True, fail=True) for m in modes]
    # The no-code route: the agent loop manager is marked as JournaledAgentLoopManager's V1 form is,
    # and the trainer's own (wrapped) fit attaches the journal.
    out[1]["route"] = "manager"
    # Steps 4 and 5 were never recorded: `nearest` serves step 3's batch under their own prompts.
    out.append(dict(name="sync_nearest", mode="sync", extra=journal_overrides(root, "nearest@1-5;passthrough"),
                    attach=True, fail=True, steps=5))
    # The imported verl dumps, replayed by stepjournal reading verl's own skip.rollout_tq section.
    out += [dict(name=f"verl_{m}", mode=m, extra=verl_skip_overrides(root), attach=True, fail=True)
            for m in ("sync", "separate_async")]
    return out


def run_config(root: str, run: Dict[str, Any]) -> Any:
    return compose(mode_overrides(run["mode"], root, steps=run.get("steps", 3), extra=run["extra"]))


# -- stand-ins for what needs a GPU ---------------------------------------------------------------------


class FailingSampler(RuntimeError):
    """Raised by the stand-in LLM when a run that must replay tries to generate."""


class TinyAgentLoop:
    """The agent loop and its LLM: writes each prompt's ``n`` trajectories into TransferQueue.

    Fields, dtypes and tags follow ``AgentLoopWorkerTQ._agent_loop_postprocess``; the reward is verl's
    gsm8k ``compute_score``; the responses come from a seeded sampler (``fail=True``: it raises).
    """

    _stepjournal_v1 = False

    def __init__(self, config: Any, tokenizer: Any, *, seed: int, fail: bool = False) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self.fail = fail
        self.calls = 0

    def _sample(self, ground_truth: str) -> List[int]:
        if self.fail:
            raise FailingSampler("the replay run tried to generate")
        answer = ground_truth if self.rng.random() < 0.5 else str(self.rng.randint(0, 9))
        ids = self.tokenizer.encode(f"#### {answer}", add_special_tokens=False)
        length = self.config.data.max_response_length
        return (ids + [self.tokenizer.eos_token_id])[:length]

    def generate_sequences(self, batch: Any) -> None:
        import transfer_queue as tq
        from verl.experimental.agent_loop import AgentLoopOutput
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics
        from verl.utils.reward_score import default_compute_score
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict
        from tensordict import NonTensorData, NonTensorStack

        self.calls += 1
        validate = bool(batch["validate"]) if "validate" in batch.keys() else False
        partition = "val" if validate else "train"
        n = self.config.actor_rollout_ref.rollout.n
        for i in range(len(batch)):
            prompt: Dict[str, Any] = {}
            for key, value in batch.items():
                if key == "validate":
                    continue
                if isinstance(value, torch.Tensor):
                    prompt[key] = value[i]
                elif isinstance(value, NonTensorStack):
                    prompt[key] = value[i].data
                elif isinstance(value, NonTensorData):
                    prompt[key] = value.data
            uid, step = prompt["uid"], prompt["global_steps"]
            text = self.tokenizer.apply_chat_template(prompt["raw_prompt"], add_generation_prompt=True, tokenize=False)
            prompt_ids = self.tokenizer.encode(text, add_special_tokens=False)
            truth = prompt["reward_model"]["ground_truth"]
            keys, fields, tags = [], [], []
            for session in range(n):
                response = self._sample(truth)
                text = self.tokenizer.decode(response, skip_special_tokens=True)
                score = float(default_compute_score(prompt["data_source"], text, truth))
                logprobs = [round(-self.rng.random(), 4) for _ in response]
                output = AgentLoopOutput(
                    prompt_ids=prompt_ids, response_ids=response, response_mask=[1] * len(response),
                    response_logprobs=logprobs, reward_score=score, num_turns=2, metrics=AgentLoopMetrics(),
                    extra_fields={"reward_extra_info": {"acc": score}, "min_global_steps": step, "max_global_steps": step},
                )
                field = output.as_dict()
                field.update(prompt)
                field["session_id"] = session
                field.pop("multi_modal_data", None)
                field["loss_mask"] = field["response_mask"]
                field["input_ids"] = torch.cat([field["prompts"], field["responses"]])
                field["position_ids"] = torch.arange(field["input_ids"].numel())
                field["multi_modal_inputs"] = {}
                fields.append(field)
                keys.append(f"{uid}_{session}_0")
                plen, rlen = field["prompts"].numel(), field["responses"].numel()
                tags.append({"status": "success", "prompt_len": plen, "response_len": rlen, "seq_len": plen + rlen,
                             "global_steps": step, "min_global_steps": step, "max_global_steps": step})
            tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id=partition)
            tq.kv_put(key=uid, partition_id=partition, tag={"status": "finished"})


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


class _NoOp:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: {}


class _Pools:
    def get_n_gpus(self) -> int:
        return 1


class _Rewards:
    reward_loop_worker_handles = ["agent-loop-rewards"]  # rewards are computed in the agent loop


def build_trainer(config: Any, mode: str) -> Any:
    """verl's V1 trainer of `mode`, set up as ``init()`` would, minus the GPU workers."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    trainer = get_trainer_cls(mode)(config=config)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer._init_dump_executor()
    trainer.actor_rollout_wg = ActorStandIn()
    trainer.checkpoint_manager = _NoOp()
    trainer.resource_pool_manager = _Pools()
    trainer.reward_loop_manager = _Rewards()
    trainer.llm_server_manager = None
    if mode == "separate_async":
        from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

        trainer.standalone_checkpoint_manager = _NoOp()
        trainer.standalone_server_manager = None
        trainer.current_mode = HybridEngineMode.TRAINER
    trainer._load_checkpoint()
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


def run_phase(root: str, phase: str, out_path: str) -> None:
    """Every run of `passes` in this process, on one local Ray and TransferQueue; what each actor saw, as JSON."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    from stepjournal.adapters.verl import attach
    from stepjournal.adapters.verl._v1_hooks import make_journaled_agent_loop_manager_tq

    ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False, configure_logging=False)
    tq.init(OmegaConf.create(TQ_CONF))
    results: Dict[str, Any] = {}
    try:
        for run in passes(root, phase):
            config = run_config(root, run)
            trainer = build_trainer(config, run["mode"])
            loop = TinyAgentLoop(config, trainer.tokenizer, seed=7, fail=run["fail"])
            if run.get("route") == "manager":
                make_journaled_agent_loop_manager_tq()  # wraps PPOTrainer.fit, as the manager class does
                loop._stepjournal_v1 = True
                trainer.fit(loop)
                journal = trainer.stepjournal
                assert journal.closed
            else:
                journal = attach(trainer) if run["attach"] else None
                try:
                    trainer.fit(loop)
                finally:
                    if journal is not None:
                        journal.close()
            leftover = tq.kv_list() or {}
            for partition, items in leftover.items():
                if items:
                    tq.kv_clear(keys=list(items), partition_id=partition)
            results[run["name"]] = {
                "updates": summary(trainer),
                "actions": [[o.action, o.ctx.step, o.ctx.gen_index, o.ctx.mode,
                             o.source.step if o.source is not None else None]
                            for o in (journal.outcomes if journal is not None else [])],
                "generate_calls": loop.calls,
                "held": journal.held if journal is not None else 0,
            }
    finally:
        tq.close()
        ray.shutdown()
    with open(out_path, "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    import sys

    run_phase(sys.argv[1], sys.argv[2], sys.argv[3])
