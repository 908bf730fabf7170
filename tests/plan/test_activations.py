"""The plan's activation formulas against what autograd really keeps, measured on a CPU.

The trainer's own forward (`policy.forward.forward_logprobs`: the model's forward, then the
chunked log-prob head) runs on a transformers Qwen2 with a small body, with a hook counting every
tensor saved for backward (storages counted once, parameters left out). A layer's share is the
difference between a two-layer and a one-layer model; the rest is the top. Exact equality, in
fp32 and bf16, for the kernels the plan knows: sdpa on unpadded rows (grouped-query attention
natively, as flash-attention-2), sdpa on padded rows (K/V repeated, a mask row per layer), eager;
and with gradient checkpointing, one hidden state per layer.
"""

from __future__ import annotations

import pytest
import torch

from exgrpo_cli.plan.activations import layer_activation_bytes, top_activation_bytes
from exgrpo_cli.plan.arch import arch_from_config_json
from exgrpo_cli.policy.forward import forward_logprobs, pack

CONFIG = dict(
    model_type="qwen2",
    hidden_size=64,
    intermediate_size=160,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    tie_word_embeddings=False,
    max_position_embeddings=256,
)
P, R, ROWS = 4, 28, 2  # prompt and response tokens per row


def saved_bytes(
    layers: int, dtype: torch.dtype, attention: str, padded: bool = False, checkpointing: bool = False
) -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(**{k: v for k, v in CONFIG.items() if k != "model_type"}, num_hidden_layers=layers)
    cfg._attn_implementation = attention
    model = Qwen2ForCausalLM(cfg).to(dtype)
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    short = 2 if padded else 0  # the second row's prompt is shorter: left padding, a mask
    prompts = [list(range(1, P + 1)), list(range(1, P + 1 - short))]
    responses = [list(range(5, 5 + R))] * ROWS
    batch = pack(prompts, responses, list(range(ROWS)), 0, torch.device("cpu"))
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        forward_logprobs(model, batch)
    return sum(storages.values())


ARCH = arch_from_config_json({**CONFIG, "num_hidden_layers": 1}, "test")
TOKENS = ROWS * (P + R)
DTYPES = [(torch.float32, 4), (torch.bfloat16, 2)]


@pytest.mark.parametrize(("dtype", "c"), DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("attention", "padded", "kind"),
    [("sdpa", False, "flash"), ("sdpa", True, "sdpa"), ("eager", False, "eager")],
    ids=["unpadded", "padded-sdpa", "eager"],
)
def test_a_layer_keeps_what_the_plan_says(
    dtype: torch.dtype, c: int, attention: str, padded: bool, kind: str
) -> None:
    layer = saved_bytes(2, dtype, attention, padded) - saved_bytes(1, dtype, attention, padded)
    assert layer == TOKENS * layer_activation_bytes(ARCH, c, kind, seq=P + R)


@pytest.mark.parametrize(("dtype", "c"), DTYPES, ids=["fp32", "bf16"])
def test_checkpointing_keeps_one_hidden_state_per_layer(dtype: torch.dtype, c: int) -> None:
    two, one = (saved_bytes(n, dtype, "sdpa", checkpointing=True) for n in (2, 1))
    layer = two - one
    assert layer == TOKENS * c * ARCH.hidden_size


@pytest.mark.parametrize(("dtype", "c"), DTYPES, ids=["fp32", "bf16"])
def test_the_top_keeps_what_the_plan_says(dtype: torch.dtype, c: int) -> None:
    one_layer = saved_bytes(1, dtype, "sdpa")
    top = one_layer - TOKENS * layer_activation_bytes(ARCH, c)
    per_response_token = c * ARCH.hidden_size + 8 + 1  # the head's hidden copy, targets, mask
    # the plan counts every token as a response token: exact but for the prompt's share
    assert top == TOKENS * top_activation_bytes(ARCH, c) - ROWS * P * per_response_token
