"""Host memory in the plan (plan/host.py): pinned blocks rounded up to powers of two as torch's
caching host allocator reserves them, vLLM's level-1 sleep backups one per CUDA segment of its
weights, the offloaded state, a row per node, and a refusal past the node's memory."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from exgrpo_cli.config.checks import validate
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.parallel.placement import OFFLOAD_MODES
from exgrpo_cli.plan.arch import Arch
from exgrpo_cli.plan.host import (
    PROCESS_BYTES,
    MiB,
    cuda_segments,
    hf_tensors,
    level1_backup_bytes,
    offload_terms,
    pow2,
    vllm_tensors,
)
from exgrpo_cli.plan.inputs import planned_devices
from exgrpo_cli.plan.memory import GiB, PlanInputs, plan_memory
from exgrpo_cli.plan.report import PlanDoesNotFit, check_memory

from conftest import run_cli

# Qwen2.5-Math-7B (conf/model/qwen2.5-math-7b.yaml)
QWEN7 = Arch(3584, 18944, 28, 28, 4, 152064, False, 16384, attention_bias=True, source="test")
PAPER = ["experiment=paper-qwen2.5-math-7b", "trainer.dry_run=true", "trainer.plan_devices=8x80"]


def test_pinned_blocks_round_up_to_a_power_of_two() -> None:
    assert [pow2(n) for n in (0, 1, 3, 4, 5, 2**30, 2**30 + 1)] == [0, 1, 4, 4, 8, 2**30, 2**31]


def test_cuda_segments_follow_the_caching_allocators_sizes() -> None:
    # a large tensor: its own segment, rounded up to 2 MiB; 1-10 MiB tensors share 20 MiB
    # segments; tensors up to 1 MiB share 2 MiB segments
    assert cuda_segments([11 * MiB + 1]) == [12 * MiB]
    assert cuda_segments([3 * MiB] * 7) == [20 * MiB, 20 * MiB]  # 6 fit one segment
    assert cuda_segments([MiB // 2] * 5) == [2 * MiB] * 2  # 4 fit one segment
    assert cuda_segments([]) == []


def test_the_level1_backup_of_qwen_math_7b_in_bf16_is_26_8_gib_per_rank() -> None:
    """vLLM's fused weights of Qwen2.5-Math-7B in bf16 are 14.2 GiB; backed up one segment at a
    time into pinned blocks rounded up to powers of two (the 259.0 MiB gate_up_proj into 512 MiB,
    each 1,039.5 MiB embedding into 2 GiB), the backups come to 26.75 GiB per rank, 214 per node."""
    raw = sum(vllm_tensors(QWEN7)) * 2
    assert raw / GiB == pytest.approx(14.19, abs=0.01)
    per_rank = level1_backup_bytes(QWEN7, 2)
    assert per_rank / GiB == pytest.approx(26.8, abs=0.06)
    assert 8 * per_rank / GiB == pytest.approx(214.0, abs=0.1)


def test_offloaded_state_on_the_host() -> None:
    # offload=optimizer: one pinned buffer of both fp32 moments
    (adamw,) = offload_terms(QWEN7, 1, 4, OFFLOAD_MODES["optimizer"])
    assert adamw.per_rank == pow2(8 * QWEN7.params) == 64 * GiB
    pinned, moments = offload_terms(QWEN7, 1, 4, OFFLOAD_MODES["all"])  # every shard pinned on its own
    assert moments.per_rank == 8 * QWEN7.params  # pageable: not rounded
    assert (pinned.per_rank + moments.per_rank) / GiB > 160  # over a 128 GiB host
    assert offload_terms(QWEN7, 8, 4, OFFLOAD_MODES["none"]) == []


def _cfg(**changes: object) -> ExgrpoConfig:
    cfg = ExgrpoConfig()
    cfg.model.path = "test"
    cfg.rollout.engine = "vllm"
    cfg.model.dtype = "float32"
    cfg.trainer.fsdp_mixed_precision = "bf16"
    cfg.model.gradient_checkpointing = True
    cfg.model.max_prompt_tokens, cfg.model.max_response_tokens = 1024, 8192
    cfg.algo.questions_per_step = 128
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return cfg


def test_a_node_with_too_little_host_memory_is_refused_with_the_figures() -> None:
    shown: list[str] = []
    cfg = _cfg(rollout__validation_sleep_level=1)
    devices = planned_devices("8x80", host_gib=128)
    with pytest.raises(PlanDoesNotFit) as err:
        check_memory(cfg, QWEN7, devices, echo=shown.append)
    message = str(err.value)
    assert "host memory: a node of 8 ranks needs 246.02 GiB after the first validation" in message
    assert "over 115.20 GiB (90% of its 128 GiB)" in message
    assert "rollout.validation_sleep_level=2" in message  # the fix, planned again
    assert "vLLM level-1 sleep backups (pinned)         26.75          -     214.02" in shown[0]
    # level 2 (the default) keeps no backups: the same node fits
    plan = check_memory(_cfg(), QWEN7, devices, echo=shown.append)
    assert plan.fits and plan.host is not None and plan.host.peak == 8 * PROCESS_BYTES + 4 * QWEN7.params
    assert "level 1 would keep 26.75 GiB per rank (214.02 GiB per node)" in shown[-1]


def test_ranks_per_node_for_planned_devices() -> None:
    assert (planned_devices("16x80").per_node, planned_devices("2x80").per_node) == (8, 2)
    x = planned_devices("16x80", per_node=4)
    plan = plan_memory(QWEN7, dataclasses.replace(_inputs(), ranks=16, ranks_per_node=x.per_node))
    assert plan.host is not None and (plan.host.ranks_per_node, plan.host.nodes) == (4, 4)


def _inputs() -> PlanInputs:
    from exgrpo_cli.plan.inputs import inputs_from_config

    return inputs_from_config(_cfg(), planned_devices("8x80"))


def test_the_host_settings_are_checked() -> None:
    for changes, says in (
        ({"rollout__validation_sleep_level": 3}, "rollout.validation_sleep_level"),
        ({"trainer__plan_host_gib": 128.0}, "only with trainer.dry_run=true"),
        ({"trainer__plan_ranks_per_node": -1}, "trainer.plan_ranks_per_node"),
        ({"trainer__dry_run": True, "trainer__plan_ranks_per_node": 4}, "only with trainer.plan_devices"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            validate(_cfg(**changes), "train")


def test_validation_sleeps_at_the_configured_level(monkeypatch: pytest.MonkeyPatch) -> None:
    from exgrpo_cli.run import training as run

    levels: list[bool] = []
    engine = SimpleNamespace(release=lambda keep_weights=False: levels.append(keep_weights))
    graded = SimpleNamespace(accuracy=0.5, pass_at_n=1.0, questions=[], correct=[])
    monkeypatch.setattr(run, "sample_and_grade", lambda *a, **k: graded)
    cfg = ExgrpoConfig()
    trainer = SimpleNamespace(
        cfg=cfg, engine=engine, tokenizer=None, template=None, scorer=None, parallel=None
    )
    run.validate(trainer, [])  # type: ignore[arg-type]
    cfg.rollout.validation_sleep_level = 1
    run.validate(trainer, [])  # type: ignore[arg-type]
    assert levels == [False, True]  # level 2 by default, level 1 keeps the weights


def test_the_paper_run_shows_a_host_row_per_node(tmp_path: Path) -> None:
    out = run_cli(["train", *PAPER, "trainer.plan_host_gib=1024", f"hydra.run.dir={tmp_path}"], timeout=120)
    assert out.returncode == 0, out.stderr
    assert "host GiB (8 ranks a node)" in out.stdout and "limit (90% of 1024 GiB)" in out.stdout
    refused = run_cli(
        ["train", *PAPER, "trainer.plan_host_gib=128", "rollout.validation_sleep_level=1"]
        + [f"hydra.run.dir={tmp_path / 'r'}"],
        timeout=120,
    )
    assert refused.returncode == 2
    assert "a node of 8 ranks needs 246.02 GiB after the first validation" in refused.stderr


@pytest.mark.parametrize("offload", ["optimizer", "all"])
def test_lora_offloads_the_adapters_state_not_the_full_models(offload: str) -> None:
    """With LoRA the optimizer holds the adapter only (rank 64 on the seven projections of the 7B:
    161.5M parameters): HostAdamW pins 8 x 161.5M bytes, rounded up (2 GiB), not the full model's
    64 GiB; offload=all pins the frozen base in bf16 and the adapter in fp32, each shard rounded."""
    from exgrpo_cli.plan.lora import adapter_params, adapter_tensors

    cfg = _cfg(trainer__offload=offload)
    cfg.model.lora.rank = 64
    seven = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert tuple(cfg.model.lora.target_modules) == seven
    adapter = adapter_params(QWEN7, 64, seven)
    assert sum(adapter_tensors(QWEN7, 64, seven)) == adapter == 161_480_704
    shown: list[str] = []
    plan = check_memory(cfg, QWEN7, planned_devices("1x80", host_gib=128), echo=shown.append)
    assert plan.host is not None
    rows = {t.name: t.per_rank for t in plan.host.terms}
    if offload == "optimizer":
        assert rows["HostAdamW adapter moments (one pinned buffer)"] == pow2(8 * adapter) == 2 * GiB
    else:
        pinned = rows["frozen base + adapter, its gradients (pinned shards)"]
        base = sum(pow2(2 * n) for n in hf_tensors(QWEN7))
        assert base < pinned < base + 2 * pow2(4 * 18944 * 64) * 28 * 7  # the adapter's shards, rounded
        assert rows["adapter AdamW moments (pageable)"] == 8 * adapter
    assert not any("HostAdamW moments (one pinned buffer)" == n for n in rows)  # the full model's
