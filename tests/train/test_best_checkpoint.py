"""trainer.keep_best end to end: a real run keeps its best validation checkpoint through pruning,
names it at the end, and `exgrpo eval` reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SMALL_RUN, run_cli


@pytest.mark.slow
def test_keep_best_keeps_the_best_validation_checkpoint_for_eval(tiny_model: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["trainer.steps=4", "trainer.eval_every=1", "trainer.keep_checkpoints=1", "trainer.keep_best=true"]
    res = run_cli(["train", f"hydra.run.dir={run}", *SMALL_RUN, *args], timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    scores = {r["step"]: r["val/accuracy"] for r in rows if r["step"] >= 1 and "val/accuracy" in r}
    assert sorted(scores) == [1, 2, 3, 4]
    best_step = max(scores, key=lambda s: (scores[s], -s))  # the first step with the top score
    best = run / "checkpoints" / "best"
    record = json.loads((best / "BEST.json").read_text())
    assert record == {"step": best_step, "score": scores[best_step], "metric": "val/accuracy"}
    assert json.loads((best / "COMPLETE").read_text())["step"] == best_step
    kept = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert kept == ["step_4"]  # the rotation kept one; the best is beside it
    assert f"best checkpoint: {best} (step {best_step}" in res.stdout + res.stderr
    assert f"exgrpo eval model.path={best / 'model'}" in res.stdout + res.stderr
    ev = run_cli(
        ["eval", f"hydra.run.dir={tmp_path / 'eval'}", f"model.path={best / 'model'}",
         "eval.limit=4", "eval.n=1", "trainer.threads=1", "logger.wandb.mode=disabled"],
        timeout=600,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stdout[-3000:] + ev.stderr[-3000:]
    assert (tmp_path / "eval" / "results.json").is_file()
