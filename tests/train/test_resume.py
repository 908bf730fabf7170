"""Exact resume: a run SIGKILLed at any point and resumed equals an uninterrupted run, bit for bit.

The kills are real (a subprocess killed from outside between steps, and one that kills itself in
the middle of writing a checkpoint), not simulated by calling functions.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from exgrpo_cli.policy.distributed import read_optimizer_tensors

from conftest import REPO, cli_env, run_cli
from shared_artefacts import build_once, session_root

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


def _final_state(out: Path) -> dict[str, torch.Tensor]:
    ck = out / "checkpoints" / "step_4"
    state = load_file(str(ck / "model" / "model.safetensors"))
    replay = load_file(str(ck / "replay" / "experiences.safetensors"))
    state.update({f"replay.{k}": v for k, v in replay.items()})
    state.update({f"opt.{k}": v for k, v in read_optimizer_tensors(ck / "optimizer").items()})
    return state


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _train(out: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = cli_env() | (env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "exgrpo_cli", "train", f"hydra.run.dir={out}", *ARGS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict:
    if not (REPO / "exgrpo_cli/assets/tiny/config.json").is_file():
        pytest.skip("the tiny model is not built")

    def build(out: Path) -> None:
        res = _train(out)
        assert res.returncode == 0, res.stderr[-3000:]

    # once per test run, also when pytest-xdist gives this file's tests to several workers
    out = build_once(session_root(request), "resume-reference", build)
    index = json.loads((out / "checkpoints/step_4/replay/index.json").read_text())
    return {"state": _final_state(out), "index": index, "out": out}


def test_reference_run_has_a_buffer(reference: dict):
    assert reference["index"]["questions"], "the scenario must exercise the replay buffer"


def test_sigkill_between_steps_then_resume_is_identical(reference: dict, tmp_path: Path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "exgrpo_cli", "train", f"hydra.run.dir={out}", *ARGS],
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latest = out / "checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if latest.is_file() and latest.read_text().strip() in ("step_2", "step_3"):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = _train(out)  # the same command again: resume=auto
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in res.stderr + res.stdout
    assert _same(_final_state(out), reference["state"])
    assert json.loads((out / "checkpoints/step_4/replay/index.json").read_text()) == reference["index"]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
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
    assert _same(_final_state(out), reference["state"])
    assert not (root / ".tmp-step_3").exists()


def test_resume_never_refuses_a_used_dir(reference: dict, tmp_path: Path):
    res = run_cli(["train", f"hydra.run.dir={reference['out']}", *ARGS, "trainer.resume=never"])
    assert res.returncode != 0 and "trainer.resume=never" in res.stderr
