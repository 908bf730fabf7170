"""The memory plan with LoRA (plan/lora.py, model.lora.rank > 0): exact adapter counts (against a
real peft model), the toy's terms by hand, the issue's 1x80 7B dry run, the fix search's labelled
`model.lora.rank=<r>`, and the paper recipes' dry runs byte for byte as they were before LoRA
(tests/plan/paper_plans/, saved from main before this change).

Toy (test_memory.TOY): H=8, q=8, kv=4, I=16, L=2, V=32. Rank 2 on the seven projections, per layer:
q 2(8+8)=32, k 2(8+4)=24, v 24, o 32, gate 2(8+16)=48, up 48, down 48 = 256; A = 2 x 256 = 512.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from plan.test_memory import TOY, X

from exgrpo_cli.config.checks import validate
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig
from exgrpo_cli.plan.arch import Arch
from exgrpo_cli.plan.fixes import LORA_NOTE, lora_fixes
from exgrpo_cli.plan.lora import adapter_params, largest_adapter_param, vllm_lora_buffer_bytes
from exgrpo_cli.plan.memory import GiB, plan_memory

from conftest import run_cli, tiny_qwen2

SEVEN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA = dataclasses.replace(X, lora_rank=2, lora_targets=SEVEN)
PLANS = Path(__file__).parent / "paper_plans"
QWEN7B = Arch(3584, 18944, 28, 28, 4, 152064, False, 32768, attention_bias=True)


def _terms(x: object) -> dict[str, tuple[int, ...]]:
    return {t.name.split(" (")[0]: t.bytes for t in plan_memory(TOY, x).terms}  # type: ignore[arg-type]


def test_adapter_counts_are_peft_s() -> None:
    peft = pytest.importorskip("peft")
    assert adapter_params(TOY, 2, SEVEN) == 512 and largest_adapter_param(TOY, 2, SEVEN) == 32
    model = tiny_qwen2(vocab=32, hidden=8, layers=2, heads=2, kv_heads=1)  # TOY's shapes
    for rank, targets in ((2, SEVEN), (4, ("q_proj", "v_proj")), (3, ("down_proj", "lm_head"))):
        adapted = peft.get_peft_model(model, peft.LoraConfig(r=rank, target_modules=list(targets)))
        trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
        assert adapter_params(TOY, rank, targets) == trainable, targets
        model = adapted.unload()
    # the figure: rank 64 on the seven projections of a 7B is ~161M parameters
    assert adapter_params(QWEN7B, 64, SEVEN) == 161_480_704


def test_toy_terms_with_lora() -> None:
    """N=2, w=4, c=2 (bf16 compute), r=4 (fp32 reduce), T=64, checkpointing, vLLM awake."""
    t = _terms(LORA)
    assert t["frozen base"] == (1736,) * 4  # c P/N: 2 x 868
    assert t["adapter weights"] == (1024,) * 4  # w A/N
    assert t["adapter gradients"] == (0, 1024, 1024, 1024)
    assert t["adapter AdamW moments"] == (2048,) * 4
    assert t["AdamW step temporaries"] == (0, 0, 0, 1024)
    assert t["root unit gathered"] == (0, 1040, 1040, 0)  # c P_r, no adapter on the root
    assert t["layers in flight"] == (0, 2 * 2 * (608 + 256), 0, 0)
    assert t["layer gradient reduce"] == (0, 256 * (2 + 4), 0, 0)  # the adapter's gradients only
    assert "root gradient reduce" not in t and "head gradient" not in t  # frozen root and head
    # per token: c (in + r) over the seven modules of one recomputed layer: 2 (6 x 10 + 18) = 156
    assert t["adapter activations"] == (0, 64 * 156, 0, 0)
    full = _terms(X)
    assert full["activations"] == t["activations"] and full["log-prob chunks"] == t["log-prob chunks"]


def test_vllm_lora_buffers_and_the_merged_sync() -> None:
    # vLLM sizes its buffers for rank 8 (no rank 2), in its dtype (2 bytes): 2 x A(rank 8)
    assert vllm_lora_buffer_bytes(TOY, 2, SEVEN, 2) == 2 * adapter_params(TOY, 8, SEVEN) == 4096
    assert vllm_lora_buffer_bytes(TOY, 600, SEVEN, 2) == 0  # refused before (config_checks)
    adapter = plan_memory(TOY, dataclasses.replace(LORA, device_bytes=64 * GiB))
    merged = plan_memory(TOY, dataclasses.replace(LORA, device_bytes=64 * GiB, lora_sync="merged"))
    assert "LoRA buffers 0.0 GiB" in adapter.notes[0] and "LoRA buffers" not in merged.notes[0]
    sync = {
        p.inputs.lora_sync: next(t for t in p.terms if t.name.startswith("weight sync"))
        for p in (adapter, merged)
    }
    # adapter: one gathered weight in vLLM's dtype (2 x 256); merged: (2 x 2 + 8) x the largest
    # adapted weight (the MLP's 8 x 16)
    assert sync["adapter"].bytes[0] == 512 and sync["merged"].bytes[0] == 12 * 128


def test_lora_is_offered_as_a_change_of_method_when_nothing_else_fits(tmp_path: Path) -> None:
    """One 80 GiB GPU, a 48 GiB host (no offload fits), 3 questions a step (no more GPUs divide it)."""
    args = [
        "experiment=paper-qwen2.5-math-7b",
        "trainer.dry_run=true",
        "trainer.plan_devices=1x80",
        "trainer.plan_host_gib=48",
        "algo.questions_per_step=3",
    ]
    out = run_cli(["train", *args, f"hydra.run.dir={tmp_path}"], timeout=300)
    assert out.returncode == 2
    refusal = out.stderr.strip().splitlines()[-1]
    assert refusal.startswith("exgrpo train: the memory plan does not fit")
    assert f"(1) model.lora.rank=64  (peak: rollout 58.01 GiB; {LORA_NOTE})" in refusal
    # not for a run that already trains an adapter, and not before a runtime setting
    assert lora_fixes(TOY, LORA) == []


def test_the_1x80_7b_dry_run_with_lora_fits(tmp_path: Path) -> None:
    args = ["experiment=paper-qwen2.5-math-7b", "model.lora.rank=64", "trainer.dry_run=true"]
    out = run_cli(["train", *args, "trainer.plan_devices=1x80", f"hydra.run.dir={tmp_path}"], timeout=300)
    assert out.returncode == 0, out.stderr
    assert (
        "LoRA rank 64 on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj (161M parameters)"
        in out.stdout
    )
    total = next(line for line in out.stdout.splitlines() if line.strip().startswith("total"))
    peak = max(float(v) for v in total.split()[1:])
    assert 50 < peak <= 72.0, total  # the estimate: ~59 of 72 GiB
    assert "fits: every phase within 72.00 GiB" in out.stdout and "rollout.lora_sync=merged" in out.stdout
    assert "LoRA buffers" not in out.stdout and "not the paper's full fine-tuning" in out.stdout
    # the adapter sync: vLLM's LoRA buffers (rank 64, bf16: 0.3 GiB) come out of its KV cache
    args = [*args, "rollout.lora_sync=adapter", "trainer.plan_devices=1x80"]
    adapter = run_cli(["train", *args, f"hydra.run.dir={tmp_path / 'adapter'}"], timeout=300)
    assert adapter.returncode == 0, adapter.stderr
    assert "LoRA buffers 0.3 GiB, KV cache ~22.5 GiB = 45 sequences" in adapter.stdout
    assert "KV cache ~22.8 GiB = 46 sequences" in out.stdout


def _paper_dry_run(name: str, tmp_path: Path) -> str:
    experiment, devices = name.rsplit("-", 1)
    # eval.data_dir fixed: the recipes read data.val_path from it, and its default is the user cache
    fixed = ["eval.data_dir=/benchmarks"]
    args = [f"experiment={experiment}", "trainer.dry_run=true", f"trainer.plan_devices={devices}", *fixed]
    out = run_cli(["train", *args, f"hydra.run.dir={tmp_path}"], timeout=300)
    refusals = [line for line in out.stderr.splitlines() if line.startswith("exgrpo train:")]
    return "\n".join(
        [f"rc={out.returncode}", out.stdout.rstrip("\n"), "--- stderr, refusal lines ---", *refusals]
    )


def test_the_main_paper_run_on_one_gpu_prints_what_it_printed_before_lora(tmp_path: Path) -> None:
    name = "paper-qwen2.5-math-7b-1x80"
    assert _paper_dry_run(name, tmp_path) == (PLANS / f"{name}.txt").read_text().rstrip("\n")


@pytest.mark.slow  # 14 CLI dry runs, ~10 s each
@pytest.mark.parametrize("name", sorted(p.stem for p in PLANS.glob("*.txt")))
def test_every_paper_recipe_prints_what_it_printed_before_lora(name: str, tmp_path: Path) -> None:
    assert _paper_dry_run(name, tmp_path) == (PLANS / f"{name}.txt").read_text().rstrip("\n")


def test_a_rank_vllm_cannot_load_is_refused_before_anything_loads() -> None:
    cfg = ExgrpoConfig()
    cfg.model.lora.rank, cfg.rollout.engine, cfg.rollout.lora_sync = 600, "vllm", "adapter"
    with pytest.raises(ConfigError, match=r"model.lora.rank=600 .* rank <= 512 only"):
        validate(cfg)
    cfg.rollout.lora_sync = "merged"  # any rank merges
    validate(cfg)
    cfg.rollout.lora_sync = "both"
    with pytest.raises(ConfigError, match="invalid rollout.lora_sync='both'"):
        validate(cfg)


def test_vllm_lora_ranks_are_rounded_up() -> None:
    torch = pytest.importorskip("torch")  # rollout.vllm_lora imports it (vLLM itself is not needed)
    del torch
    from exgrpo_cli.rollout.vllm_lora import engine_kwargs

    ranks = {r: engine_kwargs(r, "adapter").get("max_lora_rank") for r in (1, 4, 8, 64, 300, 512)}
    assert ranks == {1: 1, 4: 8, 8: 8, 64: 64, 300: 320, 512: 512}
    assert engine_kwargs(8, "merged") == {} and engine_kwargs(0, "adapter") == {}
