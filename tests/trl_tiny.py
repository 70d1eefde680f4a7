"""A tiny, offline TRL setup for tests and their child processes: a BPE tokenizer trained in-process,
a one-layer Qwen2 built from a config with fixed seeds, a cheap reward, and GRPO arguments for the CPU."""

from __future__ import annotations

from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PROMPTS = ["count one", "the cat", "hello", "sat on", "two three", "the mat", "world", "one two"]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        PROMPTS * 4,
        trainer=trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<|pad|>", "<|eos|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|pad|>", eos_token="<|eos|>", padding_side="left")


def tiny_model(tokenizer, max_positions: int = 64) -> Qwen2ForCausalLM:
    torch.manual_seed(0)  # the same initial weights in every run
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=max_positions, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
    )
    return Qwen2ForCausalLM(config)


def length_reward(completions, **kwargs) -> list[float]:
    return [float(len(c) % 5) for c in completions]


def grpo_args(out: Path, max_steps: int) -> dict:
    return dict(
        output_dir=str(out), per_device_train_batch_size=4, num_generations=4, steps_per_generation=2,
        max_completion_length=8, max_steps=max_steps, logging_steps=1, learning_rate=1e-2,
        lr_scheduler_type="constant", beta=0.0, bf16=False, use_cpu=True, report_to=[], save_strategy="no", seed=7,
        disable_tqdm=True,
    )


def prompts_dataset(prompts=PROMPTS) -> Dataset:
    return Dataset.from_dict({"prompt": list(prompts)})


def logged(trainer) -> list[dict]:
    """Every logged value per step, floats as exact hex (NaN equals NaN), timings left out."""

    def timing(key: str) -> bool:
        return "time" in key or "runtime" in key or "per_second" in key

    return [
        {k: (v.hex() if isinstance(v, float) else v) for k, v in entry.items() if not timing(k)}
        for entry in trainer.state.log_history
    ]
