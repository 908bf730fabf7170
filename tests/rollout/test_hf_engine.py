"""The HF engine: n samples per prompt in prompt order, with the trainer's own log-probs (T=1 raw
logits), also when the logits budget cuts a call into many small `generate` chunks."""

from __future__ import annotations

import pytest
import torch

from exgrpo_cli.rollout.base import SamplingSpec
from exgrpo_cli.rollout.hf import HFEngine

EOS, VOCAB = 2, 256


class Tok:
    eos_token_id, pad_token_id = EOS, 0


@pytest.fixture(scope="module")
def model():  # noqa: ANN201
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True, eos_token_id=EOS, pad_token_id=0)
    m = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(3)  # peakier than the near-uniform init: EOS shows up
    return m


@torch.no_grad()
def _teacher_forced(model, prompt: list[int], response: list[int]) -> torch.Tensor:  # noqa: ANN001
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


# one chunk | chunks of 3 sequences (3 x 12 steps x the vocabulary in fp32)
@pytest.mark.parametrize(("budget", "chunks"), [(1 << 30, [7]), (3 * 12 * VOCAB * 4, [3, 3, 1])])
def test_samples_and_logprobs(model, budget: int, chunks: list[int], monkeypatch) -> None:  # noqa: ANN001
    torch.set_num_threads(1)
    calls, generate = [], model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: calls.append(len(kw["input_ids"])) or generate(**kw))
    engine = HFEngine(model, Tok(), logits_budget_bytes=budget)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    spec = SamplingSpec(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=1)
    out = engine.generate(prompts, [3, 0, 4], spec)
    assert calls == chunks
    assert [r.prompt_index for r in out] == [0, 0, 0, 2, 2, 2, 2]
    assert model.training  # the engine restores the mode it found
    for r in out:
        assert 0 < len(r.response_ids) <= 12 and len(r.logprobs) == len(r.response_ids)
        assert r.finished == (r.response_ids[-1] == EOS) and EOS not in r.response_ids[:-1]
        expected = _teacher_forced(model, prompts[r.prompt_index], r.response_ids)
        # raw T=1 log-probs although sampling used T=0.7 and top-p
        assert torch.allclose(torch.tensor(r.logprobs), expected, atol=1e-4), (r.logprobs, expected)
