"""model.fp32_head on the trainer's side (policy/head.py, algo/logprobs.py) and its vLLM half
(rollout/vllm_engine.py, against the stand-in `vllm`).

Proves: with a bf16 model the chunked projection and the model's own head both compute the logits
from fp32 copies (equal to an fp32 reference, and measurably unlike the bf16 logits they replace);
nothing changes without it (bit-identical log-probs and gradients); the parameters and state dict
stay the model's; a head that is not a Linear layer is refused; the vLLM engine is asked for an fp32
head through hf_overrides and refused when the platform falls back to the model's dtype.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

from exgrpo_cli.algo.logprobs import chunked_token_logprobs, token_logprobs
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.policy.forward import forward_logprobs, pack
from exgrpo_cli.policy.head import FP32OutputHead, head_compute_dtype, use_fp32_head
from exgrpo_cli.policy.model import load_model

from conftest import tiny_qwen2


def _bf16_head_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(24, 64, generator=g).bfloat16()
    weight = (torch.randn(500, 64, generator=g) * 0.5).bfloat16()
    targets = torch.randint(0, 500, (24,), generator=g)
    return hidden, weight, targets


def test_chunked_projection_in_fp32_equals_the_fp32_reference() -> None:
    hidden, weight, targets = _bf16_head_inputs()
    reference = token_logprobs((hidden.float() @ weight.float().t())[None], targets[None])[0]
    fp32, _ = chunked_token_logprobs(hidden, weight, targets, chunk_tokens=7, compute_dtype=torch.float32)
    bf16, _ = chunked_token_logprobs(hidden, weight, targets, chunk_tokens=7)
    assert torch.allclose(fp32, reference, atol=1e-5, rtol=0)
    # the bf16 logits it replaces are measurably off: the flag changes what is computed
    assert (bf16 - reference).abs().max() > 1e-3


def test_fp32_head_gradients_match_autograd_on_the_fp32_logits() -> None:
    hidden, weight, targets = _bf16_head_inputs()
    h, w = hidden.float().requires_grad_(), weight.float().requires_grad_()
    token_logprobs((h @ w.t())[None], targets[None])[0].sum().backward()
    hb, wb = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, _ = chunked_token_logprobs(hb, wb, targets, chunk_tokens=5, compute_dtype=torch.float32)
    lp.sum().backward()
    assert hb.grad is not None and wb.grad is not None
    assert hb.grad.dtype == torch.bfloat16 and wb.grad.dtype == torch.bfloat16  # the weight's dtype
    # the gradients' matmuls stay in bf16 (as without an fp32 head): bf16 tolerance
    assert torch.allclose(hb.grad.float(), h.grad, atol=0.05, rtol=0.02)  # type: ignore[arg-type]
    assert torch.allclose(wb.grad.float(), w.grad, atol=0.05, rtol=0.02)  # type: ignore[arg-type]


def test_without_the_flag_nothing_changes_bit_for_bit() -> None:
    hidden, weight, targets = _bf16_head_inputs()
    out = []
    for dtype in (None, torch.bfloat16):
        hb, wb = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        lp, ent = chunked_token_logprobs(
            hb, wb, targets, chunk_tokens=7, with_entropy=True, compute_dtype=dtype
        )
        assert ent is not None
        (lp.sum() + ent.sum()).backward()
        out.append((lp, ent, hb.grad, wb.grad))
    for a, b in zip(*out, strict=True):
        assert torch.equal(a, b)


def _bf16_model() -> torch.nn.Module:
    return tiny_qwen2(vocab=300, hidden=32, layers=2, heads=4, kv_heads=2).bfloat16()


def test_model_head_becomes_fp32_and_keeps_its_parameters() -> None:
    model = _bf16_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    use_fp32_head(model)
    head = model.get_output_embeddings()
    assert isinstance(head, FP32OutputHead) and head_compute_dtype(head) == torch.float32
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) and before[k].dtype == after[k].dtype for k in before)
    ids = torch.tensor([[5, 6, 7, 8]])
    assert model(input_ids=ids).logits.dtype == torch.float32  # what HF generation samples from


def test_forward_logprobs_with_an_fp32_head_projects_the_bf16_hidden_states_in_fp32() -> None:
    model = _bf16_model()
    batch = pack([[5, 6, 7], [9, 10]], [[11, 12, 13, 14], [15, 16]], [0, 1], 0, torch.device("cpu"))
    plain, _ = forward_logprobs(model, batch)
    use_fp32_head(model)
    fp32, _ = forward_logprobs(model, batch)
    # reference: the model's final hidden states (bf16), projected with the fp32 weight
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        output_hidden_states=True,
    )
    R = batch.response_mask.shape[1]
    hidden = out.hidden_states[-1][:, -R - 1 : -1]
    logits = hidden.float() @ model.get_output_embeddings().weight.float().t()
    reference = token_logprobs(logits, batch.targets) * batch.response_mask
    assert torch.allclose(fp32, reference, atol=1e-5, rtol=0)
    assert (plain - reference).abs().max() > 1e-4  # bf16 logits, as before the flag


def test_a_head_that_is_not_linear_is_refused() -> None:
    class Odd(torch.nn.Module):
        def get_output_embeddings(self) -> torch.nn.Module:
            return torch.nn.Embedding(4, 4)

    with pytest.raises(UsageError, match="model.fp32_head=true needs a Linear output head"):
        use_fp32_head(Odd())


def test_load_model_applies_the_flag() -> None:
    cfg = ExgrpoConfig().model
    cfg.fp32_head = True
    assert isinstance(load_model(cfg, torch.device("cpu")).get_output_embeddings(), FP32OutputHead)
    cfg.fp32_head = False
    assert type(load_model(cfg, torch.device("cpu")).get_output_embeddings()) is torch.nn.Linear


# ------------------------------------------------------------------------------ the vLLM half
class Tok:
    eos_token_id = 2
    pad_token_id = 0


def _engine(fp32_head: bool) -> Any:
    from exgrpo_cli.rollout.vllm_engine import VLLMEngine

    cfg = ExgrpoConfig()
    cfg.model.fp32_head = fp32_head
    cfg.model.dtype = "bfloat16"
    return VLLMEngine.from_config(cfg, Tok())


def test_vllm_is_asked_for_an_fp32_head_only_with_the_flag(vllm: ModuleType) -> None:
    engine = _engine(True)
    assert engine.llm.kwargs["hf_overrides"] == {"head_dtype": "float32"}
    assert engine.llm.llm_engine.model_config.head_dtype == torch.float32
    engine.close()
    engine = _engine(False)
    assert "hf_overrides" not in engine.llm.kwargs
    assert engine.llm.llm_engine.model_config.head_dtype == torch.bfloat16
    engine.close()


def test_a_platform_that_falls_back_to_the_model_dtype_is_refused(
    vllm: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm, "FALLBACK_HEAD_DTYPE", True)
    with pytest.raises(RuntimeError, match="vLLM's head computes in torch.bfloat16"):
        _engine(True)
