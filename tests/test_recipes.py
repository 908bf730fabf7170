"""The paper's recipes (conf/recipe/, conf/experiment/): every overlay composes to the official
settings, transcribed below from the official script, and a GPU backbone's preset brings them."""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest

from exgrpo_cli.config.checks import validate
from exgrpo_cli.config.paths import config_dir

from conftest import compose_train

CONF = Path(config_dir())

# Transcribed from ExGRPO/exp_scripts/run_exgrpo.sh of github.com/ElliottYan/LUFFY at commit
# 01f4ae066249e6965ce0d5512ccdf99a12895c74: official key=value -> (our key, our value).
OFFICIAL_SCRIPT = {
    "data.train_batch_size=128": ("algo.questions_per_step", 128),
    "data.max_prompt_length=1024": ("model.max_prompt_tokens", 1024),
    "data.max_response_length=8192": ("model.max_response_tokens", 8192),
    "actor.optim.lr=1e-6": ("algo.lr", 1e-6),
    "actor.ppo_mini_batch_size=64 (128 / 64 = 2 updates)": ("algo.updates_per_step", 2),
    "actor.ppo_mini_batch_size=64": ("algo.official_batch.ppo_mini_batch_size", 64),
    "actor.ppo_micro_batch_size=64": ("algo.official_batch.ppo_micro_batch_size", 64),
    "actor.ppo_max_token_len_per_gpu=32768": ("algo.official_batch.ppo_max_token_len_per_gpu", 32768),
    "actor.loss_remove_token_mean=True": ("algo.aggregation", "official"),
    "actor.loss_remove_clip=True": ("algo.clip_after_start", False),
    "actor.entropy_coeff=0.001": ("algo.entropy_coef", 0.001),
    "actor.kl_loss_coef=0.00, use_kl_loss=False": ("algo.loss", "exgrpo"),  # no KL term in ours
    "+actor.skip_grad_bound=500": ("algo.skip_grad_norm_above", 500.0),
    "algorithm.grpo_use_std=False": ("algo.scale_by_std", False),
    "model.enable_gradient_checkpointing=True": ("model.gradient_checkpointing", True),
    "rollout.temperature=1.0": ("rollout.temperature", 1.0),
    "rollout.n=8": ("rollout.n", 8),
    "rollout.val_temperature=0.6": ("trainer.val_temperature", 0.6),
    "rollout.n_val=1": ("trainer.val_samples", 1),
    "rollout.name=vllm_exp": ("rollout.engine", "vllm"),
    "trainer.experience_ratio=0.5": ("replay.ratio", 0.5),
    "trainer.experience_start_sratio=0.35": ("replay.start_threshold", 0.35),
    "trainer.exp_metric=ent, exp_select_mode=argmin": ("replay.trajectory_selection", "lowest_entropy"),
    "trainer.exp_bucket_manager=normal": ("replay.question_selection", "gaussian"),
    "trainer.exp_is_correct=True": ("replay.importance_correction", True),
    "trainer.experience_lbound=0": ("replay.experience_lbound", 0),
    "trainer.experience_rbound=7": ("replay.experience_rbound", 7),
    "actor.off_policy_reshape=p_div_p_0.1": ("replay.beta", 0.1),
    "trainer.save_freq=50": ("trainer.save_every", 50),
    "trainer.test_freq=10": ("trainer.eval_every", 10),
    "trainer.max_optim_to_keep=2": ("trainer.keep_checkpoints", 2),
    "data.train_files=openr1.parquet": ("data.path", "Elliott/Openr1-Math-46k-8192"),
    "data.val_files=valid.parquet": ("data.val_path", "/benchmarks/valid.parquet"),
    "trainer.total_training_steps=701 (steps 1..700)": ("trainer.steps", 700),
}
# The paper's settings that are not in the script: AdamW weight decay 0.01, grad-norm clip 1.0,
# fp32 master weights with bf16 compute, 500 steps for the backbones other than Qwen2.5-Math-7B,
# no delayed start for Llama-3.1-8B base, and Qwen2.5-Math-1.5B's 4096-token context.
PAPER = {
    "algo.weight_decay": 0.01,
    "algo.grad_clip": 1.0,
    "model.dtype": "float32",
    "trainer.fsdp_mixed_precision": "bf16",
    "rollout.top_p": 1.0,
    "replay.shaping": True,
    # the official trainer's data schedule: its DataLoader yields 128 rows a step and
    # experience_collate_fn drops those replay displaces (about two passes over the 46k in 700 steps)
    "data.draw": "batch",
    "trainer.keep_best": True,  # the official trainer keeps its best validation checkpoint
    # by its criterion: the unweighted mean of the per-source scores, Minerva left out
    "trainer.best_metric": "val/source_mean_no_minerva",
}
PER_BACKBONE: dict[str, dict[str, Any]] = {
    "paper-qwen2.5-math-7b": {"model.path": "Elliott/Qwen2.5-Math-7B-16k-think", "model.template": "think"},
    "paper-qwen2.5-math-1.5b": {
        "trainer.steps": 500,
        "model.max_response_tokens": 3072,
        "model.path": "Qwen/Qwen2.5-Math-1.5B",
    },
    "paper-qwen2.5-7b-instruct": {"trainer.steps": 500, "model.path": "Qwen/Qwen2.5-7B-Instruct"},
    "paper-llama3.1-8b": {
        "trainer.steps": 500,
        "replay.start_threshold": 0.0,
        "model.template": "llama_base",
        "model.path": "meta-llama/Llama-3.1-8B",
    },
    "paper-llama3.1-8b-instruct": {"trainer.steps": 500, "model.path": "meta-llama/Llama-3.1-8B-Instruct"},
    "paper-qwen2.5-7b": {"trainer.steps": 500, "model.path": "Qwen/Qwen2.5-7B"},
    "paper-continual-luffy-7b": {"trainer.steps": 500, "model.path": "Elliott/LUFFY-Qwen-Math-7B-Zero"},
}


# overlays of another paper's setting, compared in the ExGRPO paper (not an official ExGRPO run):
# tested with their own source's values in tests/ablation/test_paper_table6_repo.py
OTHER_SETTINGS = ("paper-table6-repo",)


def test_every_overlay_has_a_row() -> None:
    stems = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
    assert stems == sorted([*PER_BACKBONE, *OTHER_SETTINGS])


@pytest.mark.parametrize("overlay", sorted(PER_BACKBONE))
def test_overlay_carries_the_official_settings(overlay: str) -> None:
    cfg = compose_train([f"experiment={overlay}", "eval.data_dir=/benchmarks"])
    expected = {key: value for key, value in OFFICIAL_SCRIPT.values()} | PAPER | PER_BACKBONE[overlay]
    wrong = {k: (attrgetter(k)(cfg), v) for k, v in expected.items() if attrgetter(k)(cfg) != v}
    assert not wrong, f"{overlay}: (composed, official) {wrong}"
    validate(cfg)


def test_design_card_command_trains_with_the_paper_recipe_not_the_cpu_demo() -> None:
    cfg = compose_train(["model=qwen2.5-7b", "replay.ratio=0.5"])
    assert (cfg.algo.lr, cfg.algo.questions_per_step, cfg.model.dtype) == (1e-6, 128, "float32")
    assert cfg.rollout.engine == "vllm" and cfg.data.source == "hf"
    tiny = compose_train([])
    assert (tiny.algo.lr, tiny.algo.questions_per_step, tiny.rollout.engine) == (3e-5, 16, "hf")
    assert (cfg.data.draw, tiny.data.draw) == ("batch", "needed")  # the official schedule: recipes only


def test_chosen_presets_and_keys_win_over_the_recipe() -> None:
    cfg = compose_train(["model=qwen2.5-7b", "replay=none", "rollout=hf", "algo.lr=2e-6"])
    assert (cfg.replay.ratio, cfg.rollout.engine, cfg.algo.lr) == (0.0, "hf", 2e-6)
