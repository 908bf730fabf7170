"""What a LoRA sync hands to vLLM (rollout/vllm_lora.LoraSync), without vLLM: the merged weights
equal peft's own merge under the plain model's names, and the adapter sync sends the frozen base
only when the engine lacks it (at start, and after a sleep that dropped its weights, which on CUDA
is every step's level-2 sleep)."""

from __future__ import annotations

import copy

import pytest
import torch

from exgrpo_cli.config.schema import LoraConfig
from exgrpo_cli.policy.lora import apply_lora

from conftest import tiny_qwen2

peft = pytest.importorskip("peft")


def lora_model() -> torch.nn.Module:
    model = apply_lora(tiny_qwen2(vocab=64, hidden=16, layers=2, heads=2, kv_heads=1), LoraConfig(rank=4))
    with torch.no_grad():  # B starts at zero: give the adapter something to merge
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.1)
    return model


def test_merged_weights_are_peft_s_merge_under_plain_names() -> None:
    from peft.tuners.lora import LoraLayer

    from exgrpo_cli.rollout.vllm_lora import LoraSync

    model = lora_model()
    sent = dict(LoraSync("merged").weights(model, torch.float32, dropped=False) or {})
    merged = copy.deepcopy(model)
    for m in merged.modules():
        if isinstance(m, LoraLayer):
            m.merge()
    state = merged.state_dict().items()
    expected = {n.replace(".base_layer.", "."): t for n, t in state if ".lora_" not in n}
    assert sorted(sent) == sorted(expected)
    assert "model.layers.0.self_attn.q_proj.weight" in sent and not any(".lora_" in n for n in sent)
    for name, t in expected.items():
        torch.testing.assert_close(sent[name], t, rtol=0, atol=1e-6, msg=name)
    base = dict(model.state_dict())["model.layers.0.mlp.down_proj.base_layer.weight"]
    assert (sent["model.layers.0.mlp.down_proj.weight"] - base).abs().max() > 1e-3  # the adapter is in


def test_the_adapter_sync_sends_the_base_only_when_the_engine_lacks_it() -> None:
    from exgrpo_cli.rollout.vllm_lora import LoraSync

    model = lora_model()
    sync = LoraSync("adapter")
    first = dict(sync.weights(model, torch.bfloat16, dropped=False) or {})  # a dummy-weight engine
    plain = tiny_qwen2(vocab=64, hidden=16, layers=2, heads=2, kv_heads=1).state_dict()
    assert sorted(first) == sorted(plain)  # the frozen base, under the plain model's names
    assert all(t.dtype == torch.bfloat16 for t in first.values())
    sync.load_adapter(None, {})  # a caller's dict: nothing to load, the base counts as sent
    assert sync.base_loaded and sync.weights(model, None, dropped=False) is None
    assert sync.weights(model, None, dropped=True) is not None  # a level-2 sleep dropped it
    with pytest.raises(ValueError, match="one of adapter, merged"):
        LoraSync("both")
