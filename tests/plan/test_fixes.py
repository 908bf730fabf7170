"""The overrides a refused plan suggests: each fits when planned again, none is padded with
settings that add nothing, and the report names them in the refusal."""

from __future__ import annotations

import dataclasses

import pytest
from plan.test_memory import X

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.parallel.placement import OFFLOAD_MODES
from exgrpo_cli.plan.arch import Arch
from exgrpo_cli.plan.fixes import knobs, more_devices, runtime_fixes
from exgrpo_cli.plan.inputs import Devices, inputs_from_config, planned_devices
from exgrpo_cli.plan.memory import GiB, PlanInputs, plan_memory
from exgrpo_cli.plan.report import PlanDoesNotFit, check_memory, format_plan

QWEN7 = Arch(3584, 18944, 28, 28, 4, 152064, False, 131072, attention_bias=True, source="test")
# test_memory's inputs (flash attention, checkpointing, vLLM at half the memory, no offload) on one
# 80 GiB GPU, at the paper's sizes
ONE_GPU = dataclasses.replace(
    X,
    ranks=1,
    device_bytes=80 * GiB,
    token_budget=16384,
    seq_tokens=9216,
    vllm_max_len=9216,
    rollout_sequences=1024,
)


def _apply(x: PlanInputs, overrides: tuple[str, ...]) -> PlanInputs:
    """What each override does to the inputs, written out independently of fixes.py."""
    fields = {
        "rollout.sleep_mode": ("vllm_sleep", lambda v: v == "true"),
        "model.gradient_checkpointing": ("checkpointing", lambda v: v == "true"),
        "algo.micro_batch_tokens": ("token_budget", int),
        "trainer.offload": ("offload", OFFLOAD_MODES.__getitem__),
        "rollout.gpu_memory_utilization": ("vllm_share", float),
    }
    for o in overrides:
        key, value = o.split("=")
        name, parse = fields[key]
        x = dataclasses.replace(x, **{name: parse(value)})
    return x


def test_the_knobs_stop_at_one_sequence_per_micro_batch() -> None:
    options = [o.override for opts in knobs(ONE_GPU) for o in opts]
    assert "algo.micro_batch_tokens=9216" in options
    assert not any(o.startswith("algo.micro_batch_tokens=8192") for o in options)
    assert "model.gradient_checkpointing=true" not in options  # already on


def test_each_runtime_fix_fits_and_none_of_its_parts_alone_does() -> None:
    assert not plan_memory(QWEN7, ONE_GPU).fits
    fixes = runtime_fixes(QWEN7, ONE_GPU)
    assert fixes and fixes[0].overrides == ("trainer.offload=all",)
    for fix in fixes:
        assert plan_memory(QWEN7, _apply(ONE_GPU, fix.overrides)).fits
        for dropped in fix.overrides:
            rest = tuple(o for o in fix.overrides if o != dropped)
            assert not rest or not plan_memory(QWEN7, _apply(ONE_GPU, rest)).fits


def test_more_devices_come_with_a_cheap_setting_before_many_devices() -> None:
    fix = more_devices(QWEN7, ONE_GPU, questions_per_step=128, gib_each=80)
    assert fix is not None
    assert fix.overrides == ("trainer.plan_devices=4x80", "rollout.sleep_mode=true")
    assert fix.plan.inputs.ranks == 4 and fix.plan.fits and fix.plan.inputs.rollout_sequences == 256


def _paper_config() -> ExgrpoConfig:
    cfg = ExgrpoConfig()
    cfg.model.path, cfg.model.gradient_checkpointing = "Qwen/Qwen2.5-7B", True
    cfg.model.max_prompt_tokens, cfg.model.max_response_tokens = 1024, 8192
    cfg.trainer.fsdp_mixed_precision, cfg.rollout.engine = "bf16", "vllm"
    cfg.algo.questions_per_step = 128
    return cfg


def test_the_refusal_carries_the_numbers_and_the_fixes() -> None:
    cfg = _paper_config()
    shown: list[str] = []
    with pytest.raises(PlanDoesNotFit) as err:
        check_memory(cfg, QWEN7, planned_devices("1x80"), echo=shown.append)
    msg = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in msg
    assert "over 72.00 GiB (90% of 80 GiB)" in msg and "(1) trainer.offload=all" in msg
    assert "trainer.plan_devices=4x80" in msg  # vLLM already sleeps during the update (the default)
    assert "overrides that fit" in shown[0] and "total" in shown[0]


def test_a_plan_that_fits_is_shown_and_returned() -> None:
    cfg = _paper_config()
    shown: list[str] = []
    plan = check_memory(cfg, QWEN7, planned_devices("8x80"), echo=shown.append)
    assert plan.fits and max(plan.totals) <= 72 * GiB
    assert shown[0].rstrip().endswith(f"needs {max(plan.totals) / GiB:.2f} GiB")


def test_the_table_has_a_column_per_phase_and_a_total_row() -> None:
    cfg = _paper_config()
    devices = Devices(8, 80 * GiB, "cuda", "8 x 80 GiB GPUs", planned=True)
    plan = plan_memory(QWEN7, inputs_from_config(cfg, devices))
    table = format_plan(plan, devices, cfg.model.path)
    header = next(line for line in table.splitlines() if "GiB per GPU" in line)
    assert header.split()[-5:] == ["rollout", "backward", "bwd", "end", "step"]
    total = next(line for line in table.splitlines() if line.strip().startswith("total"))
    assert [float(v) for v in total.split()[1:]] == [round(t / GiB, 2) for t in plan.totals]
