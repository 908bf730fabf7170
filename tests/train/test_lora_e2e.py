"""`exgrpo train model.lora.rank=8` end to end on the tiny model: bad input refused with exit 2,
the checkpoint's adapter, a SIGKILLed run resumed equal to an uninterrupted one, two ranks under
torchrun (FSDP2 on gloo) and their resumption."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train.test_resume import ARGS as RESUME_ARGS

from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.checkpoint.optimizer_files import read_optimizer_tensors

from conftest import (
    SMALL_RUN,
    checkpoint_tensors,
    metrics,
    run_cli,
    same_tensors,
    shared_train_run,
    sigkill_mid_run,
    torchrun_ok,
)

pytestmark = pytest.mark.slow

ARGS = [
    "model.lora.rank=8",
    "algo.lr=3e-4",
    *RESUME_ARGS,  # test_resume's 4-step run, checkpointed every step
    "algo.aggregation=official",  # the paper's aggregation and its two updates per step, with LoRA
    "algo.updates_per_step=2",
]


def _final_state(out: Path, step: int = 4) -> dict[str, torch.Tensor]:
    return checkpoint_tensors(out / "checkpoints" / f"step_{step}", "adapter/adapter_model.safetensors")


def _metrics(out: Path) -> dict[int, dict]:
    """metrics.jsonl by step, without the timings and memory peaks (they differ run to run)."""
    return {
        r["step"]: {k: v for k, v in r.items() if not k.startswith(("timing/", "memory/"))}
        for r in metrics(out)
    }


def _train(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_cli(["train", f"hydra.run.dir={out}", *ARGS, *extra])


@pytest.fixture(scope="module")
def reference(request: pytest.FixtureRequest) -> Path:
    return shared_train_run(request, "lora-reference", ARGS).dir


def test_the_checkpoint_holds_the_adapter_and_only_its_optimizer_state(reference: Path) -> None:
    ck = reference / "checkpoints" / "step_4"
    # checksums of every file, the optimizer metadata read as data (checkpoint/metadata_guard.py)
    assert ckpt.verify(ck) is None
    adapter = load_file(str(ck / "adapter" / "adapter_model.safetensors"))
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    assert (ck / "model" / "model.safetensors").is_file(), "the last step's merged model"
    assert not (reference / "checkpoints" / "step_3" / "model").exists(), "only the last holds model/"
    moments = {k for k in read_optimizer_tensors(ck / "optimizer") if "exp_avg" in k}
    assert moments and all("lora_" in k for k in moments), sorted(moments)[:4]
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert any(v.abs().max() > 0 for v in lora_b), "the adapters did not train"
    # the HF engine samples the adapted model and pi_old is taken through the adapters: their
    # log-probs agree also once the adapters have moved (steps 2-4)
    rows = _metrics(reference)
    assert all(rows[s]["rollout/logprob_diff_mean"] < 1e-3 for s in (2, 3, 4)), rows[4]


@pytest.mark.long  # ~28 s: make test-long
def test_sigkill_then_resume_equals_the_uninterrupted_run(reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    sigkill_mid_run(out, ARGS)
    res = _train(out)  # the same command: resume=auto
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in res.stderr + res.stdout
    assert same_tensors(_final_state(out), _final_state(reference))
    assert _metrics(out) == _metrics(reference)


def test_resume_with_other_lora_settings_is_refused(reference: Path, tmp_path: Path) -> None:
    resume = f"trainer.resume={reference / 'checkpoints' / 'step_4'}"
    res = _train(tmp_path / "x", resume, "model.lora.rank=4")
    assert res.returncode == 2, res.stderr[-2000:]
    assert "model.lora.rank: 8 -> 4" in res.stderr  # the resume's changed keys, named (#46)
    # confirmed (trainer.resume_changes=true), the adapter itself still cannot take another rank
    res = _train(tmp_path / "y", resume, "model.lora.rank=4", "trainer.resume_changes=true")
    assert res.returncode == 2, res.stderr[-2000:]
    assert "was trained with" in res.stderr


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.lora.rank=65", "larger than the dimension of model.layers.0.self_attn.k_proj"),
        ("model.lora.target_modules=[q_proj,c_attn]", "['c_attn'] match no linear layer"),
    ],
)
def test_bad_lora_input_exits_2_before_training(tmp_path: Path, override: str, message: str) -> None:
    out = tmp_path / "run"
    res = run_cli(["train", f"hydra.run.dir={out}", *SMALL_RUN, "model.lora.rank=8", override])
    assert res.returncode == 2, res.stderr[-2000:]
    assert message in res.stderr and "Traceback" not in res.stderr
    assert not (out / "checkpoints").exists()
    assert "step 1" not in (out / "train.log").read_text()


TWO_RANKS = [
    "model.lora.rank=8",
    "algo.lr=3e-4",
    *SMALL_RUN,
    "trainer.val_questions=4",
    "logger.console=false",
    "trainer.seed=3",
    "replay.ratio=0.5",
    "replay.start_threshold=0",
    "trainer.offload=optimizer",  # HostAdamW: the adapters' moments in host memory
]


def _torchrun(out: Path, *overrides: str) -> None:
    torchrun_ok("-m", "exgrpo_cli", "train", f"hydra.run.dir={out}", *TWO_RANKS, *overrides)


@pytest.mark.long  # make test-all only (docs/testing.md)
def test_two_ranks_train_lora_and_resume_like_one_run(tiny_model: Path, tmp_path: Path) -> None:
    first, whole = tmp_path / "first", tmp_path / "whole"
    _torchrun(first, "trainer.steps=2")
    _torchrun(first, "trainer.steps=3")  # resume=auto from step_2
    _torchrun(whole, "trainer.steps=3")
    resumed, straight = _metrics(first), _metrics(whole)
    assert sorted(resumed) == [0, 1, 2, 3]
    for row in (resumed[2], straight[2]):  # the 2-step launch validated at its last step
        for key in [k for k in row if k.startswith("val/")]:
            del row[key]
    assert resumed == straight
    assert same_tensors(_final_state(first, 3), _final_state(whole, 3))
    shards = sorted(p.name for p in (whole / "checkpoints/step_3/optimizer").glob("*.distcp"))
    assert len(shards) == 2, shards


def test_inspect_buffer_shows_a_lora_checkpoint_and_scores_only_the_merged_one(reference: Path) -> None:
    ck = reference / "checkpoints"
    index = json.loads((ck / "step_3" / "replay" / "index.json").read_text())
    questions = index["questions"]
    uid = questions[0] if isinstance(questions, list) else next(iter(questions))
    res = run_cli(["inspect-buffer", str(ck / "step_3"), f"inspect.show={uid}"])
    assert res.returncode == 0 and "behaviour log-prob" in res.stdout, res.stderr[-2000:]
    res = run_cli(["inspect-buffer", str(ck / "step_3"), f"inspect.show={uid}", "inspect.score=true"])
    assert res.returncode == 2 and "no merged model/" in res.stderr, res.stderr[-2000:]
    last = json.loads((ck / "step_4" / "replay" / "index.json").read_text())["questions"]
    uid = last[0] if isinstance(last, list) else next(iter(last))
    res = run_cli(["inspect-buffer", str(ck / "step_4"), f"inspect.show={uid}", "inspect.score=true"])
    assert res.returncode == 0 and "entropy" in res.stdout, res.stderr[-2000:]
