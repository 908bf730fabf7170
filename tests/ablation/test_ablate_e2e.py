"""`exgrpo ablate` end to end through the real CLI: a user-defined sweep (one YAML file on Hydra's
search path) of two tiny variants x 1 seed x 2 steps, its summary, and a restart that reruns nothing."""

from __future__ import annotations

import csv
import json
import subprocess
import time
from pathlib import Path

import pytest

from exgrpo_cli.ablation import sweep as sw

from conftest import run_cli, toy_sweep

TOY = {"on-policy": ["replay.ratio=0"], "w/o shaping": ["replay.ratio=0.5", "replay.shaping=false"]}

pytestmark = pytest.mark.slow  # two training runs (~20 s)


def _ablate(conf: Path, sweep: Path, hydra_dir: Path) -> subprocess.CompletedProcess:
    return run_cli(
        [
            "ablate",
            f"hydra.searchpath=[file://{conf}]",
            "ablation=toy",
            f"ablation.sweep_dir={sweep}",
            "trainer.val_questions=6",
            f"hydra.run.dir={hydra_dir}",
        ],
        timeout=900,
    )


@pytest.mark.long  # make test-all only (docs/testing.md)
def test_ablate_two_variants_then_restart(tiny_model: Path, tmp_path: Path):
    conf = toy_sweep(tmp_path, TOY)
    sweep = tmp_path / "sweep"
    res = _ablate(conf, sweep, tmp_path / "h1")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "2 runs (0 finished already)" in res.stdout

    plan = json.loads((sweep / sw.PLAN_FILE).read_text())
    assert [v["dir"] for v in plan["variants"]] == ["on-policy", "wo-shaping"]
    for d in ("on-policy", "wo-shaping"):
        run = sweep / d / "seed0"
        marker = json.loads((run / sw.MARKER).read_text())
        assert marker["finished"] and marker["attempts"] == 1 and marker["wall_s"] > 0
        # the ablate command line's own override reached every run, after the preset's base
        assert "trainer.val_questions=6" in marker["overrides"]
        assert "trainer.val_questions=8" not in marker["overrides"]
        assert (run / "checkpoints" / "latest").read_text() == "step_2"
        steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert steps == [0, 1, 2]

    with open(sweep / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["variant"] for r in rows] == ["on-policy", "w/o shaping"]
    assert all(r["runs"] == "1" and 0.0 <= float(r["final_mean"]) <= 1.0 for r in rows)
    assert rows[0]["baseline"] == "1" and float(rows[0]["delta_final"]) == 0.0
    assert float(rows[0]["rollouts_mean"]) == 2 * 4 * 4  # 2 steps x 4 questions x 4 responses, no replay
    md = (sweep / "summary.md").read_text()
    assert "| on-policy (baseline) | 1 |" in md and "| w/o shaping | 1 |" in md
    assert (sweep / "curves.png").stat().st_size > 5000
    assert "final val acc" in res.stdout  # the rich table

    logged = (sweep / "on-policy" / "seed0" / "metrics.jsonl").stat().st_mtime
    t0 = time.perf_counter()
    again = _ablate(conf, sweep, tmp_path / "h2")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "2 runs (2 finished already)" in again.stdout
    assert (sweep / "on-policy" / "seed0" / "metrics.jsonl").stat().st_mtime == logged
    assert json.loads((sweep / "wo-shaping" / "seed0" / sw.MARKER).read_text())["attempts"] == 1
    assert time.perf_counter() - t0 < 60  # no training: start-up and the summary only


@pytest.mark.parametrize(
    "override, key",
    [
        ("replay.trajectory_selection=lowest_entrpy", "replay.trajectory_selection"),
        ("algo.loss=grpoo", "algo.loss"),
    ],
)
def test_ablate_refuses_an_unknown_variant_name_before_any_run(override: str, key: str, tmp_path: Path):
    conf = toy_sweep(tmp_path, {**TOY, "w/o shaping": ["replay.ratio=0.5", override]})
    sweep = tmp_path / "sweep"
    res = _ablate(conf, sweep, tmp_path / "hydra")
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "w/o shaping" in res.stderr and key in res.stderr
    assert not list(sweep.glob("*/seed*/metrics.jsonl"))  # no variant ran, not even the valid one
