"""Stale but intact weights after a sync (step/divergence.check_synced_weights): a reload that
leaves the engine's previous weights in place samples from the policy one update old, a log-prob
gap far below `rollout.max_logprob_diff`; the checksum of two synced tensors as the engine holds
them catches it. With the stand-in vLLM (tests/rollout/fake_vllm) built on the tiny model, on a CPU,
where sleep mode is off (the `rollout.sleep_mode=false` fallback's situation): its reload after
`EXGRPO_STANDIN_STALE_SYNC` returns as usual and changes nothing."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from train.test_divergence import ARGS  # the same short vLLM stand-in run

from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.rollout.base import SamplingSpec
from exgrpo_cli.rollout.vllm_ext import CHECKSUM_MOD, bits_checksum
from exgrpo_cli.step.divergence import EngineDivergence, check_synced_weights, checksum_names

from conftest import FAKE_VLLM_ENV, metrics, run_cli

STALE = "EXGRPO_STANDIN_STALE_SYNC"


def test_the_checksum_is_exact_and_independent_of_sharding() -> None:
    t = torch.randn(64, 48, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    full = bits_checksum(t)
    assert sum(bits_checksum(part) for part in t.chunk(3)) % CHECKSUM_MOD == full  # FSDP2 rows
    assert sum(bits_checksum(part) for part in t.chunk(2, dim=1)) % CHECKSUM_MOD == full  # TP columns
    nudged = t.clone()
    nudged.view(torch.int16)[5, 7] += 1  # one value one bf16 step away: one bit
    assert bits_checksum(nudged) == (full + 1) % CHECKSUM_MOD
    assert bits_checksum(t.float()) != full  # another dtype: other bits


def test_the_checked_tensors_are_one_o_proj_and_one_down_proj() -> None:
    names = [
        f"model.layers.{i}.{p}" for i in range(3) for p in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
    ]
    assert checksum_names(names) == [
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.2.mlp.down_proj.weight",
    ]
    assert checksum_names(["lm_head.weight"]) == []


def _trainer_gap(model: torch.nn.Module, engine: object, prompt: list[int]) -> float:
    """Mean |trainer - engine| log-prob per sampled token (what the step's check measures)."""
    outs = engine.generate([prompt], [2], SamplingSpec(1.0, 1.0, 6, seed=1))  # type: ignore[attr-defined]
    diffs = []
    with torch.no_grad():
        for r in outs:
            ids = torch.tensor([prompt + r.response_ids])
            logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1)
            mine = logp.gather(1, torch.tensor(r.response_ids)[:, None])[:, 0]
            diffs.append((mine - torch.tensor(r.logprobs)).abs())
    return float(torch.cat(diffs).mean())


def test_a_stale_but_intact_sync_is_caught(
    vllm: ModuleType, monkeypatch: pytest.MonkeyPatch, tiny_model: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from exgrpo_cli.rollout.vllm_engine import VLLMEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    engine = VLLMEngine(str(tiny_model), [2], load_format="dummy", dtype="float32")
    engine.sync_weights(model)
    assert check_synced_weights(engine, model, step=1, parallel=DataParallel()) == 2  # both compared, equal
    with torch.no_grad():  # one small update, as lr 1e-6 makes it
        for p in model.parameters():
            p.add_(1e-5 * torch.sign(torch.randn_like(p)))
    monkeypatch.setenv(STALE, "1")
    engine.sync_weights(model)  # returns as usual; the engine keeps the old weights
    assert _trainer_gap(model, engine, [5, 6, 7, 8]) < 0.01  # far below rollout.max_logprob_diff=0.5
    with pytest.raises(EngineDivergence, match="step 2: after the weight sync the engine's model.layers.0"):
        check_synced_weights(engine, model, step=2, parallel=DataParallel())
    engine.close()


def test_an_engine_without_its_own_copy_is_not_compared() -> None:
    class HFLike:
        dtype = torch.float32  # samples from the trainer's module: no weights of its own

    model = torch.nn.Linear(2, 2)
    assert check_synced_weights(HFLike(), model, step=1, parallel=DataParallel()) == 0


@pytest.mark.slow
def test_a_stale_sync_stops_the_run_after_the_update_before_its_checkpoint(
    tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    res = run_cli(["train", *ARGS, f"hydra.run.dir={out}"], env_extra=FAKE_VLLM_ENV | {STALE: "1"})
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-3000:]
    assert "step 1: after the weight sync the engine's" in res.stderr
    assert [r["step"] for r in metrics(out)] == [0]
    assert not (out / "checkpoints").exists()
