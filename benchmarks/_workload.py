"""The benchmark workload: one GRPO-shaped rollout batch, as a plain dict and as a verl `DataProto`.

Shapes follow verl's rollout output: left-padded prompts, right-padded responses, `input_ids` the two
joined, int64 masks, `position_ids` from the attention mask, fp32 log-probs (zero on padding), a uid
string per prompt group (``n`` samples share one prompt) and a reward-model dict per sample. Token ids
are drawn uniformly from a 32 000-token vocabulary: real text repeats more, so compression ratios
here are conservative.
"""

from __future__ import annotations

import uuid
from typing import Any, Dict, List

import attrs
import numpy as np
import torch

__all__ = ["Workload", "make_batch", "tensor_items", "tensor_nbytes", "to_dataproto", "mark"]

VOCAB = 32_000
PAD = 0


@attrs.frozen
class Workload:
    """The size of the rollout batch to benchmark."""

    samples: int = 512
    prompt_len: int = 1024
    response_len: int = 3072
    group: int = 8  # rollout.n: samples per prompt

    @classmethod
    def quick(cls) -> "Workload":
        return cls(samples=16, prompt_len=32, response_len=96, group=4)


def make_batch(w: Workload, *, seed: int = 0) -> Dict[str, Any]:
    """Build the batch: tensors first (in verl's order), then the non-tensor columns as object arrays."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    groups = max(1, w.samples // w.group)
    per_group = torch.randint(w.prompt_len // 4, w.prompt_len + 1, (groups,), generator=g)
    prompt_lens = per_group.repeat_interleave(w.group)[: w.samples]
    response_lens = torch.randint(max(1, w.response_len // 8), w.response_len + 1, (w.samples,), generator=g)

    group_prompts = torch.randint(3, VOCAB, (groups, w.prompt_len), generator=g)
    prompts = group_prompts.repeat_interleave(w.group, dim=0)[: w.samples]
    cols = torch.arange(w.prompt_len)
    prompt_mask = cols.unsqueeze(0) >= (w.prompt_len - prompt_lens).unsqueeze(1)  # left padding
    prompts = torch.where(prompt_mask, prompts, torch.full_like(prompts, PAD))

    responses = torch.randint(3, VOCAB, (w.samples, w.response_len), generator=g)
    response_mask = torch.arange(w.response_len).unsqueeze(0) < response_lens.unsqueeze(1)  # right padding
    responses = torch.where(response_mask, responses, torch.full_like(responses, PAD))

    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).to(torch.int64)
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=1) - 1, min=0)
    log_probs = -torch.empty(w.samples, w.response_len).exponential_(2.0, generator=g)
    log_probs = torch.where(response_mask, log_probs, torch.zeros_like(log_probs)).to(torch.float32)

    uids = [str(uuid.UUID(int=int(rng.integers(0, 2**63)) << 64 | int(rng.integers(0, 2**63)))) for _ in range(groups)]
    uid = np.empty(w.samples, dtype=object)
    reward_model = np.empty(w.samples, dtype=object)
    for i in range(w.samples):
        uid[i] = uids[min(i // w.group, groups - 1)]
        reward_model[i] = {"ground_truth": str(int(rng.integers(0, 10_000))), "style": "rule"}
    return {
        "prompts": prompts.contiguous(),
        "responses": responses.contiguous(),
        "input_ids": input_ids.contiguous(),
        "attention_mask": attention_mask.contiguous(),
        "position_ids": position_ids.contiguous(),
        "response_mask": response_mask.to(torch.int64).contiguous(),
        "old_log_probs": log_probs.contiguous(),
        "uid": uid,
        "reward_model": reward_model,
    }


def tensor_items(batch: Dict[str, Any]) -> List[torch.Tensor]:
    """The batch's tensors, in order."""
    return [v for v in batch.values() if isinstance(v, torch.Tensor)]


def tensor_nbytes(batch: Dict[str, Any]) -> int:
    """Bytes held by the batch's tensors: the "payload size" every ratio is relative to."""
    return sum(t.numel() * t.element_size() for t in tensor_items(batch))


def to_dataproto(batch: Dict[str, Any]):
    """The same batch as a verl `DataProto` (sharing the tensors), or None when verl is not installed."""
    try:
        from verl.protocol import DataProto
    except ImportError:
        return None
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    non_tensors = {k: v for k, v in batch.items() if not isinstance(v, torch.Tensor)}
    return DataProto.from_dict(
        tensors=tensors, non_tensors=non_tensors, meta_info={"temperature": 1.0, "eos_token_id": 2}
    )


def mark(batch: Dict[str, Any], value: float) -> None:
    """Change one log-prob in place, so each recorded repetition is a new payload (not deduplicated)."""
    batch["old_log_probs"][0, 0] = value
