"""Exact resume: a run SIGKILLed at any point and resumed equals an uninterrupted run, bit for bit.

The kills are real (a subprocess killed from outside between steps, and one that kills itself in
the middle of writing a checkpoint), not simulated by calling functions.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import checkpoint_tensors, metrics, run_cli, same_tensors, shared_train_run, sigkill_mid_run

ARGS = [
    "algo.questions_per_step=6",
    "rollout.n=4",
    "trainer.val_questions=4",
    "trainer.val_samples=1",
    "logger.wandb.mode=disabled",
    "trainer.threads=1",
    "trainer.steps=4",
    "trainer.save_every=1",
    "replay.start_threshold=0",
    "trainer.seed=7",
]

# Every test here shares a 4-step reference run (built once per test run), and two rerun it with kills.
pytestmark = pytest.mark.slow


def _train(out: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli(["train", f"hydra.run.dir={out}", *ARGS], env_extra=env_extra)


@pytest.fixture(scope="module")
def reference(request: pytest.FixtureRequest) -> dict:
    # once per test run, also when pytest-xdist gives this file's tests to several workers
    out = shared_train_run(request, "resume-reference", ARGS).dir
    index = json.loads((out / "checkpoints/step_4/replay/index.json").read_text())
    return {"state": checkpoint_tensors(out / "checkpoints/step_4"), "index": index, "out": out}


def test_reference_run_has_a_buffer(reference: dict):
    assert reference["index"]["questions"], "the scenario must exercise the replay buffer"


def test_sigkill_between_steps_then_resume_is_identical(reference: dict, tmp_path: Path):
    out = tmp_path / "run"
    sigkill_mid_run(out, ARGS)
    res = _train(out)  # the same command again: resume=auto
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in res.stderr + res.stdout
    assert same_tensors(checkpoint_tensors(out / "checkpoints/step_4"), reference["state"])
    assert json.loads((out / "checkpoints/step_4/replay/index.json").read_text()) == reference["index"]
    steps = [r["step"] for r in metrics(out)]
    assert steps == [0, 1, 2, 3, 4], "each step is logged once, also across the kill"


def test_kill_during_checkpoint_write_never_resumes_a_torn_checkpoint(reference: dict, tmp_path: Path):
    out = tmp_path / "run"
    res = _train(out, {"EXGRPO_FAULT_KILL_IN_CHECKPOINT": "3"})
    assert res.returncode == -signal.SIGKILL
    root = out / "checkpoints"
    assert (root / ".tmp-step_3").is_dir() and not (root / "step_3").exists()
    assert (root / "latest").read_text() == "step_2"
    res = _train(out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert same_tensors(checkpoint_tensors(out / "checkpoints/step_4"), reference["state"])
    assert not (root / ".tmp-step_3").exists()


def test_resume_never_refuses_a_used_dir(reference: dict, tmp_path: Path):
    res = run_cli(["train", f"hydra.run.dir={reference['out']}", *ARGS, "trainer.resume=never"])
    assert res.returncode != 0 and "trainer.resume=never" in res.stderr
