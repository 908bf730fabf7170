"""The ablation summary's maths on synthetic run dirs (exact values), and the sweep's planning."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from pathlib import Path

import pytest

from exgrpo_cli.ablation import summary as sm
from exgrpo_cli.ablation import sweep as sw

from conftest import run_cli


def _metrics(run: Path, vals: dict[int, float], responses: dict[int, float], extra: str = "") -> None:
    run.mkdir(parents=True)
    rows = []
    for step in sorted(set(vals) | set(responses)):
        row = {"step": step}
        if step in responses:
            row["rollout/responses"] = responses[step]
        if step in vals:
            row["val/accuracy"] = vals[step]
        rows.append(json.dumps(row))
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n" + extra)


def summarize_cli(sweep: Path, override: str, hydra_dir: Path) -> subprocess.CompletedProcess:
    """`exgrpo ablate ablation.summarize=<sweep> <override>`, Hydra's own files in `hydra_dir`."""
    return run_cli(["ablate", f"ablation.summarize={sweep}", override, f"hydra.run.dir={hydra_dir}"])


def _finished(run: Path, variant: str, seed: int, wall: float | None) -> None:
    (run / sw.MARKER).write_text(
        json.dumps({"variant": variant, "seed": seed, "finished": True, "wall_s": wall, "overrides": []})
    )


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    """Two variants: 'A' (the baseline) with seeds 0 and 1, 'w/o B' with seed 0 only finished."""
    root = tmp_path / "sweep"
    root.mkdir()
    plan = {
        "name": "toy",
        "baseline": "A",
        "seeds": [0, 1],
        "base": ["trainer.steps=4"],
        "inherited": [],
        "variants": [
            {"name": "A", "dir": "A", "overrides": []},
            {"name": "w/o B", "dir": "wo-B", "overrides": ["replay.shaping=false"]},
        ],
    }
    (root / sw.PLAN_FILE).write_text(json.dumps(plan))
    # A seed 0: val 0.5 -> 0.75 -> 0.625, 8 fresh responses a step
    _metrics(root / "A/seed0", {0: 0.5, 2: 0.75, 4: 0.625}, {1: 8, 2: 8, 3: 8, 4: 8})
    _finished(root / "A/seed0", "A", 0, 100.0)
    # A seed 1: replay made it draw 6; a repeated step 4 (a resumed run) keeps its last row;
    # a torn last line (a kill mid-write) is ignored
    _metrics(
        root / "A/seed1",
        {0: 0.5, 2: 0.25, 4: 0.0},
        {1: 6, 2: 6, 3: 6, 4: 6},
        extra=json.dumps({"step": 4, "rollout/responses": 6, "val/accuracy": 0.75}) + '\n{"step": 5, "v',
    )
    _finished(root / "A/seed1", "A", 1, 140.0)
    _metrics(root / "wo-B/seed0", {0: 0.5, 4: 0.25}, {1: 8, 2: 8, 3: 8, 4: 8})
    _finished(root / "wo-B/seed0", "w/o B", 0, None)
    # seed 1 of 'w/o B' stopped early: no marker, no final checkpoint -> left out
    _metrics(root / "wo-B/seed1", {0: 0.5}, {1: 8})
    return root


def test_run_result_reads_final_best_rollouts_and_curve(sweep_dir: Path):
    r = sm.run_result(sm.read_metrics(sweep_dir / "A/seed1/metrics.jsonl"), wall_s=140.0)
    assert (r.final, r.best, r.rollouts, r.wall_s) == (0.75, 0.75, 24.0, 140.0)
    assert r.curve == [(0, 0.0, 0.5), (2, 12.0, 0.25), (4, 24.0, 0.75)]
    with pytest.raises(ValueError, match="val/accuracy"):
        sm.run_result([{"step": 1, "rollout/responses": 8}])


def test_summary_rows_exact(sweep_dir: Path):
    a0 = sm.run_result(sm.read_metrics(sweep_dir / "A/seed0/metrics.jsonl"), 100.0)
    a1 = sm.run_result(sm.read_metrics(sweep_dir / "A/seed1/metrics.jsonl"), 140.0)
    b0 = sm.run_result(sm.read_metrics(sweep_dir / "wo-B/seed0/metrics.jsonl"))
    rows = sm.summarize([("A", [a0, a1]), ("w/o B", [b0]), ("empty", [])], baseline="A")
    a, b, e = rows
    assert (a.variant, a.runs, a.final_mean, a.best_mean, a.best_std, a.rollouts_mean, a.wall_mean) == (
        "A",
        2,
        0.6875,
        0.75,
        0.0,
        28.0,
        120.0,
    )
    assert a.final_std == math.sqrt(2 * 0.0625**2)  # sample std (ddof=1) of 0.625 and 0.75
    assert a.baseline and a.delta_final == 0.0
    assert (b.final_mean, b.best_mean, b.rollouts_mean, b.delta_final) == (0.25, 0.5, 32.0, 0.25 - 0.6875)
    assert math.isnan(b.final_std) and math.isnan(b.wall_mean) and not b.baseline  # one seed, no wall
    assert e.runs == 0 and math.isnan(e.final_mean) and math.isnan(e.delta_final)


def test_mean_curve_uses_common_validation_steps(sweep_dir: Path):
    a0 = sm.run_result(sm.read_metrics(sweep_dir / "A/seed0/metrics.jsonl"))
    a1 = sm.run_result(sm.read_metrics(sweep_dir / "A/seed1/metrics.jsonl"))
    b0 = sm.run_result(sm.read_metrics(sweep_dir / "wo-B/seed0/metrics.jsonl"))
    xs, ys, sds = sm.mean_curve([a0, a1])
    assert xs == [0.0, 14.0, 28.0] and ys == [0.5, 0.5, 0.6875]
    assert sds == [0.0, math.sqrt(2 * 0.25**2), math.sqrt(2 * 0.0625**2)]
    assert sm.mean_curve([a0, b0])[0] == [0.0, 32.0]  # step 2 is not validated by both
    assert sm.mean_curve([b0])[2] == [0.0, 0.0]  # one seed: no band


def test_summarize_dir_writes_table_csv_markdown_and_plot(sweep_dir: Path):
    from io import StringIO

    from rich.console import Console

    from exgrpo_cli.ablation.report import summarize_dir

    out = StringIO()
    summarize_dir(sweep_dir, "", Console(file=out, width=150))
    with open(sweep_dir / "summary.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == list(sm.CSV_COLUMNS)
    assert rows[1] == [
        "A",
        "2",
        "0.6875",
        repr(math.sqrt(2 * 0.0625**2)),
        "0.75",
        "0.0",
        "28.0",
        "120.0",
        "0.0",
        "1",
    ]
    assert rows[2] == ["w/o B", "1", "0.25", "", "0.5", "", "32.0", "", "-0.4375", "0"]
    md = (sweep_dir / "summary.md").read_text()
    assert "| A (baseline) | 2 | 0.688 ± 0.088 | 0.750 ± 0.000 | 28 | 120 s |  |" in md
    assert "| w/o B | 1 | 0.250 | 0.500 | 32 | - | -0.438 |" in md
    assert "w/o B: seed1 not finished, left out" in md and "w/o B: replay.shaping=false" in md
    assert (sweep_dir / "curves.png").stat().st_size > 5000
    assert "0.688 ± 0.088" in out.getvalue() and "Δ final vs A" in out.getvalue()


def test_summarize_through_the_cli_with_another_baseline(sweep_dir: Path, tmp_path: Path):
    res = summarize_cli(sweep_dir, "ablation.baseline=w/o B", tmp_path / "h")
    assert res.returncode == 0, res.stderr
    with open(sweep_dir / "summary.csv", newline="") as fh:
        rows = {r["variant"]: r for r in csv.DictReader(fh)}
    assert rows["A"]["delta_final"] == "0.4375" and rows["w/o B"]["baseline"] == "1"
    bad = summarize_cli(sweep_dir, "ablation.baseline=C", tmp_path / "h2")
    assert bad.returncode == 2 and "ablation.baseline" in bad.stderr


# ----------------------------------------------------------------------------- the plan


def test_variants_slugs_and_override_merging(tmp_path: Path):
    vs = sw.parse_variants(
        {"on-policy": ["replay.ratio=0"], "ExGRPO": [], "w/o shaping": "replay.shaping=false"}
    )
    assert [(v.slug, v.overrides) for v in vs] == [
        ("on-policy", ("replay.ratio=0",)),
        ("ExGRPO", ()),
        ("wo-shaping", ("replay.shaping=false",)),
    ]
    with pytest.raises(sw.SweepError, match="share the folder"):
        sw.parse_variants({"w/o-x": [], "wo-x": []})
    with pytest.raises(sw.SweepError, match="key=value"):
        sw.parse_variants({"a": ["replay.ratio"]})
    inherited = sw.passthrough(
        [
            "ablation=paper-table6",
            "ablation.seeds=1",
            "trainer.steps=5",
            "+ablation.variants.x=[]",
            "trainer.threads=1",
        ]
    )
    assert inherited == ["trainer.steps=5", "trainer.threads=1"]
    jobs = sw.plan_jobs(vs[:2], [3, 4], tmp_path, ["trainer.steps=24", "replay.ratio=0.5"], inherited)
    assert [(j.variant.name, j.seed, j.run_dir.relative_to(tmp_path).as_posix()) for j in jobs] == [
        ("on-policy", 3, "on-policy/seed3"),
        ("on-policy", 4, "on-policy/seed4"),
        ("ExGRPO", 3, "ExGRPO/seed3"),
        ("ExGRPO", 4, "ExGRPO/seed4"),
    ]
    # base < command line < variant < seed; one override per key
    assert jobs[0].overrides == ("trainer.steps=5", "trainer.threads=1", "replay.ratio=0", "trainer.seed=3")
    assert jobs[2].overrides == ("replay.ratio=0.5", "trainer.steps=5", "trainer.threads=1", "trainer.seed=3")
    argv = sw.multirun_argv(jobs[2:], "joblib", ["hydra.launcher.n_jobs=2"], python="py")
    assert argv[:7] == [
        "py",
        "-m",
        "exgrpo_cli",
        "train",
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
    ]
    assert "trainer.seed=3,4" in argv and argv[-1] == "hydra.sweep.subdir=seed${trainer.seed}"
    assert sw.shell_command(sw.train_argv(jobs[0])).startswith("exgrpo train trainer.steps=5 ")
