"""`exgrpo eval` never truncates a training run's files (issue 30, item 3): with W&B on and
eval.output_dir pointing at a run dir, the run's metrics.jsonl is kept and eval's row goes to
eval_metrics.jsonl."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.evaluation import report
from exgrpo_cli.metrics.logger import MetricLogger


def test_eval_with_wandb_keeps_a_runs_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = "".join(f'{{"step": {i}, "reward/accuracy": 0.5}}\n' for i in range(1, 11))
    (tmp_path / "metrics.jsonl").write_text(rows)
    monkeypatch.setattr(MetricLogger, "_start_wandb", lambda self, *a, **k: None)  # no tracker here
    cfg = ExgrpoConfig()
    wandb = dataclasses.replace(cfg.logger.wandb, mode="offline")
    cfg = dataclasses.replace(cfg, logger=dataclasses.replace(cfg.logger, wandb=wandb))
    result = report.ModelResult("m", "builtin:tiny", [])
    report._log_wandb(cfg, tmp_path, [result])
    assert (tmp_path / "metrics.jsonl").read_text() == rows
    assert (tmp_path / "eval_metrics.jsonl").is_file()


def test_skipped_benchmark_rows_are_counted_for_the_console(tmp_path: Path) -> None:
    """The count was only in the log; the runner prints `LoadedBenchmark.skipped` on stderr."""
    from exgrpo_cli.config.schema import DataConfig
    from exgrpo_cli.evaluation.benchmarks import load_custom

    rows = [{"prompt": "1+1?", "ground_truth": "2"}, {"prompt": "", "ground_truth": "3"}, {"prompt": "2+2?"}]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    [lb] = load_custom(str(tmp_path / "b.jsonl"), DataConfig())
    assert (len(lb.questions), lb.skipped) == (1, 2)
