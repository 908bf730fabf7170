"""An fp32 LM head on the trainer's side (`model.fp32_head`, docs/off-policy.md).

Where it sits in the step: in every forward of the trainer's model. Under bf16 the logits of the
output projection are rounded to bf16 before the softmax; the engine (vLLM) and the trainer then
round differently, and the gap between the engine's log-probs and pi_old grows. With
`model.fp32_head` both sides project in fp32: vLLM through its `head_dtype` (rollout/vllm_engine.py
passes `hf_overrides={"head_dtype": "float32"}`), the trainer through this module:
- the model's own head becomes an `FP32OutputHead` (same parameters, same state-dict names), so
  every path that calls it (HF generation in rollout/hf.py, the full-logits path of
  policy/forward.py) gets fp32 logits;
- the chunked log-prob projection (algo/logprobs.py), which reads the head's weight and never
  calls its forward, asks `head_compute_dtype` and casts the weight to fp32 once per pass: an fp32
  copy of the head, V x H x 4 bytes (2.2 GB for Qwen2.5-7B), which the memory plan counts.
Never on one side only: the switch is one config key read by both engines' builders.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from exgrpo_cli.errors import UsageError


class FP32OutputHead(torch.nn.Linear):
    """A Linear whose output is computed in fp32 from fp32 copies of its input and weight. Only
    its class changes (see `use_fp32_head`): parameters, dtype and state dict stay the model's."""

    def forward(self, x: Tensor) -> Tensor:
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias)


def use_fp32_head(model: torch.nn.Module) -> None:
    """Make `model`'s output projection compute in fp32 (in place, before FSDP2 shards it). A
    model whose output embedding is not a Linear layer is refused: its logits could not be made
    fp32 here, and an fp32 head on the engine's side only would widen the gap it is meant to close."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, torch.nn.Linear):
        raise UsageError(
            f"model.fp32_head=true needs a Linear output head; {type(model).__name__}'s is "
            f"{type(head).__name__}: leave model.fp32_head=false for this model"
        )
    head.__class__ = FP32OutputHead


def head_compute_dtype(head: torch.nn.Linear) -> torch.dtype:
    """The dtype the chunked projection computes the logits in: fp32 for an `FP32OutputHead`,
    else the head weight's own dtype (bf16 under mixed precision), as its forward would."""
    return torch.float32 if isinstance(head, FP32OutputHead) else head.weight.dtype
