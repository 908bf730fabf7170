"""The HF engine: n samples per prompt in prompt order, with the trainer's own log-probs (of
softmax(logits / T) at the sampling temperature T, before top-p), from exgrpo's decode loop
(finished rows dropped mid-call) and from HF `generate`, also when the logits budget cuts a call
into many small `generate` chunks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from exgrpo_cli.rollout.base import SamplingSpec
from exgrpo_cli.rollout.hf import HFEngine

from conftest import tiny_qwen2

if TYPE_CHECKING:
    from transformers import PreTrainedModel

EOS, VOCAB = 2, 256


class Tok:
    eos_token_id, pad_token_id = EOS, 0


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    m = tiny_qwen2(vocab=VOCAB, hidden=64, layers=2, heads=4, kv_heads=2, eos_token_id=EOS, pad_token_id=0)
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(3)  # peakier than the near-uniform init: EOS shows up
    return m


@torch.no_grad()
def _teacher_forced(
    model: PreTrainedModel, prompt: list[int], response: list[int], temperature: float
) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


# own loop (never calls generate) | generate in one chunk | chunks of 3 sequences (3 x 12 steps x
# the vocabulary in fp32) | own loop in chunks of max_batch=2 (the logits budget does not apply)
@pytest.mark.parametrize(
    ("hf_generate", "budget", "max_batch", "chunks"),
    [
        (False, 1 << 30, 256, []),
        (True, 1 << 30, 256, [7]),
        (True, 3 * 12 * VOCAB * 4, 256, [3, 3, 1]),
        (False, 3 * 12 * VOCAB * 4, 2, []),
    ],
)
def test_samples_and_logprobs(
    model: PreTrainedModel,
    hf_generate: bool,
    budget: int,
    max_batch: int,
    chunks: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.set_num_threads(1)
    calls, generate = [], model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: calls.append(len(kw["input_ids"])) or generate(**kw))
    engine = HFEngine(model, Tok(), logits_budget_bytes=budget, max_batch=max_batch, hf_generate=hf_generate)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    spec = SamplingSpec(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=1)
    out = engine.generate(prompts, [3, 0, 4], spec)
    assert calls == chunks
    assert [r.prompt_index for r in out] == [0, 0, 0, 2, 2, 2, 2]
    assert model.training  # the engine restores the mode it found
    for r in out:
        assert 0 < len(r.response_ids) <= 12 and len(r.logprobs) == len(r.response_ids)
        assert r.finished == (r.response_ids[-1] == EOS) and EOS not in r.response_ids[:-1]
        expected = _teacher_forced(model, prompts[r.prompt_index], r.response_ids, 0.7)
        # the log-probs at the sampling temperature (0.7), not renormalised by top-p
        assert torch.allclose(torch.tensor(r.logprobs), expected, atol=1e-4), (r.logprobs, expected)


def test_own_loop_drops_finished_rows_and_is_seeded(model: PreTrainedModel) -> None:
    """Many rows ending at different steps (so the loop compacts its batch several times): every
    response still gets its own tokens and log-probs, and a seed repeats the call exactly."""
    torch.set_num_threads(1)
    engine = HFEngine(model, Tok())
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]
    spec = SamplingSpec(temperature=3.0, top_p=1.0, max_new_tokens=24, seed=3)  # hot: varied lengths
    out = engine.generate(prompts, [12, 12, 12], spec)
    lengths = {len(r.response_ids) for r in out}
    assert len(lengths) > 3 and any(r.finished for r in out) and any(not r.finished for r in out)
    for r in out:
        expected = _teacher_forced(model, prompts[r.prompt_index], r.response_ids, 3.0)
        assert torch.allclose(torch.tensor(r.logprobs), expected, atol=1e-4)
    again = engine.generate(prompts, [12, 12, 12], spec)
    assert [r.response_ids for r in again] == [r.response_ids for r in out]


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    from exgrpo_cli.rollout.sampling import filter_top_p

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.97, 0.01, 0.01, 0.01]]))
    kept = torch.isfinite(filter_top_p(logits, 0.8))
    assert kept.tolist() == [[True, True, False, False], [True, False, False, False]]
    assert torch.equal(filter_top_p(logits, 1.0), logits)


def test_draw_follows_the_distribution_and_skips_filtered_tokens() -> None:
    from exgrpo_cli.rollout.sampling import draw

    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = torch.log(probs).repeat(100_000, 1)
    gen = torch.Generator().manual_seed(0)
    freq = torch.bincount(draw(logits, 1.0, 1.0, gen), minlength=5).float() / len(logits)
    assert torch.allclose(freq, probs, atol=0.006) and freq[4] == 0
    # top-p 0.8 keeps tokens 0 and 1 only, renormalised to 0.625 / 0.375
    freq = torch.bincount(draw(logits, 1.0, 0.8, gen), minlength=5).float() / len(logits)
    assert torch.allclose(freq, torch.tensor([0.625, 0.375, 0, 0, 0]), atol=0.006)


@pytest.mark.parametrize(
    ("device", "layers", "vocab", "new_tokens", "warns"),
    [
        ("cuda", 28, 152064, 8192, True),  # the paper's 7B with 8k-token responses
        ("cuda", 28, 152064, 2048, False),  # short responses
        ("cuda", 2, 32000, 8192, False),  # a small model (0.7B)
        ("cpu", 28, 152064, 8192, False),  # a CPU run: the HF engine is its default
    ],
)
def test_warns_on_large_models_with_long_responses_on_a_gpu(
    device: str,
    layers: int,
    vocab: int,
    new_tokens: int,
    warns: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Qwen2.5-7B-sized config on the meta device (no memory), on a GPU as far as the engine
    can tell: one warning line at construction, only past ~1B parameters and ~2k tokens."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from exgrpo_cli.rollout import hf

    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=layers,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        eos_token_id=EOS,
    )
    with torch.device("meta"):
        big = Qwen2ForCausalLM(cfg)
    monkeypatch.setattr(hf, "module_device", lambda model: torch.device(device))
    with caplog.at_level("WARNING", logger="exgrpo_cli.rollout.hf"):
        HFEngine(big, Tok(), max_new_tokens=new_tokens)
    lines = [r.getMessage() for r in caplog.records if r.name == "exgrpo_cli.rollout.hf"]
    assert len(lines) == int(warns), lines
    if warns:
        assert (
            "\n" not in lines[0]
            and "8192-token" in lines[0]
            and "7.6B" in lines[0]
            and "rollout=vllm" in lines[0]
        )
