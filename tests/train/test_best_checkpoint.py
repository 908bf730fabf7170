"""trainer.keep_best end to end: a real run keeps its best validation checkpoint through pruning,
names it at the end, and `exgrpo eval` reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SMALL_RUN, metrics, run_cli, train_ok


@pytest.mark.slow
def test_keep_best_keeps_the_best_validation_checkpoint_for_eval(tiny_model: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["trainer.steps=4", "trainer.eval_every=1", "trainer.keep_checkpoints=1", "trainer.keep_best=true"]
    res = train_ok(run, *SMALL_RUN, *args)
    scores = {r["step"]: r["val/accuracy"] for r in metrics(run) if r["step"] >= 1 and "val/accuracy" in r}
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


def _published(root: Path, step: int) -> Path:
    from exgrpo_cli.checkpoint import store as ckpt

    def write(tmp: Path) -> None:
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))

    folder = ckpt.save_checkpoint(root, step, write, keep=5)
    assert folder is not None
    return folder


def test_the_best_score_comes_from_the_resumed_state_not_from_an_abandoned_future(tmp_path: Path) -> None:
    """A run rolled back to step 2 compares with the best of the history it continues (step 1's
    0.2), not with checkpoints/best left by the abandoned steps (0.9)."""
    from types import SimpleNamespace

    from exgrpo_cli.checkpoint import best_copy
    from exgrpo_cli.parallel.sharding import DataParallel
    from exgrpo_cli.run.best import BestCheckpoint as _Best

    root = tmp_path / "checkpoints"
    best_copy.keep_best(root, _published(root, 5), 5, 0.9, "val/accuracy")  # the abandoned future's best
    state = SimpleNamespace(step=2, best={"step": 1, "score": 0.2})
    best = _Best(root, state, DataParallel(), "val/accuracy")  # type: ignore[arg-type]
    assert best.improved(0.3) and not best.improved(0.2)
    best.record(3, 0.3)
    assert state.best == {"step": 3, "score": 0.3, "metric": "val/accuracy"}


def test_a_stop_between_the_save_and_the_best_link_is_finished_at_resume(tmp_path: Path) -> None:
    """The run published step 3 (its state names step 3 as the best) and died before linking it
    as checkpoints/best: the resumed run links it."""
    from types import SimpleNamespace

    from exgrpo_cli.checkpoint import best_copy
    from exgrpo_cli.checkpoint import store as ckpt
    from exgrpo_cli.parallel.sharding import DataParallel
    from exgrpo_cli.run.best import BestCheckpoint as _Best

    root = tmp_path / "checkpoints"
    best_copy.keep_best(root, _published(root, 1), 1, 0.2, "val/accuracy")
    _published(root, 3)
    _Best(root, SimpleNamespace(step=3, best={"step": 3, "score": 0.5}), DataParallel(), "val/accuracy")  # type: ignore[arg-type]
    assert best_copy.best_record(root) == {"step": 3, "score": 0.5, "metric": "val/accuracy"}
    assert ckpt.verify(root / ckpt.BEST) is None


@pytest.mark.slow
def test_the_best_is_kept_by_the_official_criterion_when_asked(tiny_model: Path, tmp_path: Path) -> None:
    """trainer.best_metric=val/source_mean_no_minerva (the paper recipes'): validation logs each
    data_source's accuracy and their Minerva-free mean, and checkpoints/best is the step where
    that mean peaked, not where the pooled val/accuracy did."""
    from exgrpo_cli.data.synthetic import generate

    qs = generate(96, max_digits=2, ops=["+", "-", "*"], seed=5, prefix="s")
    train, val = qs[:64], qs[64:]
    sources = ["aime"] * 20 + ["math"] * 4 + ["minerva"] * 8  # many rows of one source, as AIME's repeats

    def write(path: Path, rows: list, tags: list[str] | None = None) -> None:
        lines = []
        for i, q in enumerate(rows):
            row = {"id": q.uid, "prompt": q.question, "ground_truth": q.answer}
            if tags:
                row["data_source"] = tags[i]
            lines.append(json.dumps(row))
        path.write_text("\n".join(lines) + "\n")

    write(tmp_path / "train.jsonl", train)
    write(tmp_path / "val.jsonl", val, sources)
    run = tmp_path / "run"
    args = [
        "data=local",
        f"data.path={tmp_path / 'train.jsonl'}",
        f"data.val_path={tmp_path / 'val.jsonl'}",
        "trainer.steps=4",
        "trainer.eval_every=1",
        "trainer.val_questions=0",
        "trainer.keep_best=true",
        "trainer.best_metric=val/source_mean_no_minerva",
    ]
    train_ok(run, *SMALL_RUN, *args)
    vals = {r["step"]: r for r in metrics(run) if r["step"] >= 1 and "val/accuracy" in r}
    assert sorted(vals) == [1, 2, 3, 4]
    for r in vals.values():
        per = [r["val/accuracy/aime"], r["val/accuracy/math"]]
        assert r["val/source_mean_no_minerva"] == pytest.approx(sum(per) / 2)
        assert "val/accuracy/minerva" in r
    official = {s: r["val/source_mean_no_minerva"] for s, r in vals.items()}
    best_step = max(official, key=lambda s: (official[s], -s))
    record = json.loads((run / "checkpoints" / "best" / "BEST.json").read_text())
    assert record == {"step": best_step, "score": official[best_step], "metric": "val/source_mean_no_minerva"}
