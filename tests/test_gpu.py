"""GPU checks (marker `gpu`, skipped without CUDA): bf16 training, flash-attn, vLLM weight sync.

A random-weight model of a real architecture (Qwen2 layout, small sizes) so nothing downloads.
Run on a GPU node with `pytest -m gpu`.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.gpu


def _qwen2(tmp_path, attn: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=4096, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.bfloat16,
                                                attn_implementation=attn).cuda()


def _train_steps(model) -> list[float]:  # noqa: ANN001
    from exgrpo_cli.algo import exgrpo_policy_loss
    from exgrpo_cli.policy.forward import forward_logprobs, pack

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 4000, (16,), generator=g).tolist() for _ in range(8)]
    responses = [torch.randint(10, 4000, (48,), generator=g).tolist() for _ in range(8)]
    sb = pack(prompts, responses, list(range(8)), 0, torch.device("cuda"))
    adv = torch.tensor([1.0, -1.0] * 4, device="cuda")
    losses = []
    for _ in range(3):
        logp, _ = forward_logprobs(model, sb)
        loss = exgrpo_policy_loss(logp, logp.detach(), adv, sb.response_mask, torch.zeros(8, dtype=torch.bool,
                                  device="cuda"), clip_eps=0.2, beta=0.1, normalizer=8 * 48.0)
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(float(loss))
    return losses


def test_bf16_sdpa_train_step(tmp_path):
    assert all(map(lambda x: x == x, _train_steps(_qwen2(tmp_path, "sdpa"))))


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="flash-attn is not installed")
def test_bf16_flash_attention_matches_sdpa(tmp_path):
    from exgrpo_cli.policy.forward import forward_logprobs, pack

    fa, sd = _qwen2(tmp_path, "flash_attention_2"), _qwen2(tmp_path, "sdpa")
    sb = pack([[5, 6, 7, 8]] * 2, [[9, 10, 11], [12, 13, 14]], [0, 1], 0, torch.device("cuda"))
    with torch.no_grad():
        a, _ = forward_logprobs(fa, sb)
        b, _ = forward_logprobs(sd, sb)
    assert ((a - b).abs() * sb.response_mask).max() < 0.1  # bf16 kernels differ in rounding only


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_sync_on_gpu(tmp_path):
    from exgrpo_cli.config import ExgrpoConfig
    from exgrpo_cli.policy.forward import forward_logprobs, pack
    from exgrpo_cli.rollout.base import SamplingSpec
    from exgrpo_cli.rollout.vllm_engine import VLLMEngine

    model = _qwen2(tmp_path, "sdpa")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1}, "<pad>"))
    tok = PreTrainedTokenizerFast(tokenizer_object=vocab, pad_token="<pad>", eos_token="<eos>")
    cfg = ExgrpoConfig()
    cfg.model.path, cfg.model.dtype = str(tmp_path / "m"), "bfloat16"
    cfg.model.max_prompt_tokens, cfg.model.max_response_tokens = 64, 32
    cfg.rollout.gpu_memory_utilization = 0.3
    engine = VLLMEngine.from_config(cfg, tok, model=model)
    try:
        _train_steps(model)  # new weights
        engine.sync_weights(model)
        out = engine.generate([[5, 6, 7, 8]], [4], SamplingSpec(1.0, 1.0, 32, seed=0))
        sb = pack([[5, 6, 7, 8]] * 4, [o.response_ids for o in out], list(range(4)), 0, torch.device("cuda"))
        with torch.no_grad():
            lp, _ = forward_logprobs(model, sb)
        diffs = []
        for r, o in enumerate(out):
            trainer = lp[r, 3:3 + len(o.response_ids)].float().cpu()
            diffs.append((trainer - torch.tensor(o.logprobs)).abs().mean().item())
        assert sum(diffs) / len(diffs) < 0.05, diffs  # bf16 on both sides
    finally:
        engine.close()
