"""Shared test helpers: the repo root, ../shared/data, the shipped tiny model, CLI subprocesses,
torchrun launches and a tiny random Qwen2 model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from transformers import Qwen2ForCausalLM

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
TINY = REPO / "exgrpo_cli" / "assets" / "tiny"

# a short CPU training run of the tiny model through the CLI: 4 questions x 4 responses a step,
# 8 validation questions answered once, one thread, no wandb
SMALL_RUN = [
    "algo.questions_per_step=4",
    "rollout.n=4",
    "trainer.val_questions=8",
    "trainer.val_samples=1",
    "logger.wandb.mode=disabled",
    "trainer.threads=1",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED_DATA


@pytest.fixture
def tiny_model() -> Path:
    if not (TINY / "config.json").is_file():
        pytest.skip("the tiny model is not built (make tiny-model)")
    return TINY


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        WANDB_MODE="disabled",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def run_cli(
    args: list[str], cwd: Path | None = None, timeout: float = 600, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "exgrpo_cli", *args],
        cwd=cwd or REPO,
        env=cli_env() | (env_extra or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def torchrun(*args: str, nproc: int = 2) -> list[str]:
    """`python -m torch.distributed.run` with `nproc` ranks meeting on a free local port, then
    `args` (a script and its arguments, or `-m module ...`)."""
    from exgrpo_cli.policy.distributed import free_port

    launch = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    return [sys.executable, *launch, "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]


def worker_env(*pythonpath: Path) -> dict[str, str]:
    """The environment of worker scripts under torchrun: one thread, offline, `pythonpath` first
    on PYTHONPATH."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), env.get("PYTHONPATH", "")])
    return env


def tiny_qwen2(
    *, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, positions: int = 128, **config: Any
) -> Qwen2ForCausalLM:
    """A random float32 Qwen2ForCausalLM with tied embeddings and an intermediate size of twice
    `hidden`, its weights drawn after torch.manual_seed(0); `config`: more Qwen2Config fields."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        tie_word_embeddings=True,
        **config,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).float()
