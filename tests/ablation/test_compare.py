"""Each variant against its reference (ablation/compare.py): exact differences, standard errors and
verdicts on made-up runs; the files `exgrpo ablate`'s summary writes from them; the stability presets."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from io import StringIO
from pathlib import Path

import pytest
from ablation.test_summary import summarize_cli

from exgrpo_cli.ablation import compare as cp
from exgrpo_cli.ablation import sweep as sw
from exgrpo_cli.ablation.summary import RunResult

from conftest import run_cli


def _run(final: float, start: float = 0.25, rollouts: float = 24.0) -> RunResult:
    """A run validated at steps 0, 2 and 4, drawing rollouts / 2 fresh responses by step 2."""
    mid = (start + final) / 2
    curve = [(0, 0.0, start), (2, rollouts / 2, mid), (4, rollouts, final)]
    return RunResult(final=final, best=max(start, final), rollouts=rollouts, curve=curve)


def test_difference_is_of_seed_means_with_welch_standard_error():
    d = cp.difference([0.5, 0.75], [0.25, 0.25])
    # mean 0.625 - 0.25; sample variance of (0.5, 0.75) is 0.03125, over 2 seeds 0.015625
    assert (d.value, d.se, d.z, d.verdict) == (0.375, 0.125, 3.0, "higher")
    assert cp.difference([0.25, 0.25], [0.5, 0.75]).verdict == "lower"
    within = cp.difference([0.25, 0.5], [0.25, 0.25])
    assert (within.value, within.se, within.z, within.verdict) == (0.125, 0.125, 1.0, "within 2 SE")
    both = cp.difference([0.5, 0.75, 1.0], [0.0, 0.5])  # both sides vary: variances add
    assert both.se == pytest.approx(math.sqrt(0.0625 / 3 + 0.125 / 2))
    one = cp.difference([0.5], [0.25, 0.5])  # one seed: no standard error, no verdict
    assert one.value == 0.125 and math.isnan(one.se) and one.verdict == "-"
    assert cp.difference([0.5, math.nan], [0.25, 0.25]).value == 0.25  # NaN (no value) left out
    assert cp.Estimate(0.1, 0.0).verdict == "higher" and cp.Estimate(0.0, 0.0).verdict == "within 2 SE"


def test_accuracy_at_interpolates_in_fresh_rollouts():
    r = RunResult(
        final=0.75, best=0.75, rollouts=24.0, curve=[(0, 0.0, 0.5), (2, 12.0, 0.25), (4, 24.0, 0.75)]
    )
    assert cp.accuracy_at(r, 6.0) == 0.375
    assert cp.accuracy_at(r, 18.0) == 0.5
    assert cp.accuracy_at(r, 24.0) == 0.75
    assert math.isnan(cp.accuracy_at(r, 30.0))  # past the run's last validation point


def test_compare_pairs_each_variant_with_its_reference():
    groups = [
        ("on-policy lr1", [_run(0.25), _run(0.5)]),
        ("ExGRPO lr1", [_run(0.5, rollouts=20.0), _run(0.75, rollouts=20.0)]),
        ("on-policy lr2", [_run(0.0), _run(0.0)]),
        ("ExGRPO lr2", [_run(0.25), _run(0.25)]),
        ("empty", []),
    ]
    pairs = {"ExGRPO lr1": "on-policy lr1", "ExGRPO lr2": "on-policy lr2"}
    rows = cp.compare(groups, "on-policy lr1", pairs)
    assert [(c.variant, c.reference) for c in rows] == [
        ("ExGRPO lr1", "on-policy lr1"),
        ("on-policy lr2", "on-policy lr1"),  # no compare_to entry: against the baseline
        ("ExGRPO lr2", "on-policy lr2"),
    ]  # the baseline itself and a variant without runs have no row
    ex1 = rows[0]
    assert (ex1.final.value, ex1.final.se) == (0.25, math.sqrt(0.03125 / 2 + 0.03125 / 2))
    # equal fresh rollouts: 20, where the on-policy runs are 2/3 of the way from 12 to 24 rollouts
    assert ex1.at_rollouts == 20.0
    on_at_20 = [0.25, 0.375 + (0.5 - 0.375) * 2 / 3]
    assert ex1.equal_rollouts.value == pytest.approx(0.625 - sum(on_at_20) / 2)
    assert (ex1.gain.value, ex1.reference_gain.value) == (0.375, 0.125)
    assert ex1.gain.se == pytest.approx(0.25 / math.sqrt(2) / math.sqrt(2))
    ex2 = rows[2]
    assert (ex2.final.value, ex2.final.se, ex2.final.verdict) == (0.25, 0.0, "higher")
    assert ex2.reference_gain.value == -0.25


def test_check_compare_to_names_the_bad_entry():
    cp.check_compare_to({"b": "a"}, ["a", "b"])
    with pytest.raises(ValueError, match=r"ablation.compare_to.b='c': allowed one of a, b"):
        cp.check_compare_to({"b": "c"}, ["a", "b"])
    with pytest.raises(ValueError, match=r"compare_to key 'x'"):
        cp.check_compare_to({"x": "a"}, ["a", "b"])


def test_markdown_and_csv_of_the_comparisons(tmp_path: Path):
    rows = cp.compare([("A", [_run(0.25), _run(0.25)]), ("B", [_run(0.5), _run(0.75)])], "A", {})
    md = cp.to_markdown(rows)
    assert "| B | A | +0.375 ± 0.125 (z +3.0) | higher |" in md
    assert cp.to_markdown([]) == ""
    cp.write_csv(rows, tmp_path / "c.csv")
    with open(tmp_path / "c.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert (row["variant"], row["reference"], row["delta_final"], row["delta_final_se"]) == (
        "B",
        "A",
        "0.375",
        "0.125",
    )
    assert row["delta_final_verdict"] == "higher" and row["at_rollouts"] == "24.0"


# ----------------------------------------------------------------------------- through summarize_dir


def _write_run(run: Path, vals: dict[int, float], variant: str, seed: int, replayed: int = 0) -> None:
    run.mkdir(parents=True)
    rows = []
    for step in range(5):
        row: dict[str, float] = {"step": step}
        if step:
            row |= {
                "rollout/responses": 8.0 - replayed,
                "reward/accuracy": 0.25 * step,
                "loss/entropy": 0.5 / step,
                "rollout/response_length": 20.0 + step,
                "reward/fresh_solved_none": 0.5,
                "optim/grad_norm": 0.1,
            }
        if step in vals:
            row["val/accuracy"] = vals[step]
        rows.append(json.dumps({"step": step, **row}))
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (run / sw.MARKER).write_text(
        json.dumps({"variant": variant, "seed": seed, "finished": True, "wall_s": 1.0})
    )


@pytest.fixture
def pair_sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    root.mkdir()
    plan = {
        "name": "pairs",
        "baseline": "on",
        "compare_to": {"ex": "on"},
        "seeds": [0, 1],
        "variants": [{"name": n, "dir": n, "overrides": []} for n in ("on", "ex")],
    }
    (root / sw.PLAN_FILE).write_text(json.dumps(plan))
    for seed, (on, ex) in enumerate([(0.25, 0.5), (0.25, 0.75)]):
        _write_run(root / f"on/seed{seed}", {0: 0.25, 2: 0.25, 4: on}, "on", seed)
        _write_run(root / f"ex/seed{seed}", {0: 0.25, 2: 0.5, 4: ex}, "ex", seed, replayed=2)
    return root


def test_summarize_dir_writes_comparisons_and_dynamics(pair_sweep: Path):
    from rich.console import Console

    from exgrpo_cli.ablation.report import summarize_dir

    out = StringIO()
    summarize_dir(pair_sweep, "", Console(file=out, width=150))
    assert "| ex | on | +0.375 ± 0.125 (z +3.0) | higher |" in out.getvalue()  # also on the console
    with open(pair_sweep / "comparisons.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert (row["variant"], row["reference"], row["delta_final"], row["delta_final_verdict"]) == (
        "ex",
        "on",
        "0.375",
        "higher",
    )
    assert row["at_rollouts"] == "24.0"  # ex drew 6 fresh responses a step, on 8
    md = (pair_sweep / "summary.md").read_text()
    assert "## Each variant against its reference" in md and "| ex | on | +0.375 ± 0.125 (z +3.0) |" in md
    assert (pair_sweep / "dynamics.png").stat().st_size > 20000


@pytest.mark.slow  # CLI subprocesses
def test_summarize_cli_compare_to_wins_over_the_plan_and_is_checked(pair_sweep: Path, tmp_path: Path):
    res = summarize_cli(pair_sweep, "+ablation.compare_to.on=ex", tmp_path / "h")
    assert res.returncode == 0, res.stderr
    with open(pair_sweep / "comparisons.csv", newline="") as fh:
        got = {(r["variant"], r["reference"]) for r in csv.DictReader(fh)}
    assert got == {("on", "ex"), ("ex", "on")}
    bad = summarize_cli(pair_sweep, "+ablation.compare_to.ex=nope", tmp_path / "h2")
    assert bad.returncode == 2 and "ablation.compare_to.ex='nope'" in bad.stderr


@pytest.mark.slow  # CLI subprocesses
def test_stability_presets_plan_their_runs(tmp_path: Path):
    def dry_run(*overrides: str) -> subprocess.CompletedProcess:
        return run_cli(["ablate", *overrides, "ablation.dry_run=true", f"hydra.run.dir={tmp_path}"])

    res = dry_run("ablation=stability")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 30  # 3 learning rates x 2 methods x 5 seeds
    ex = [ln for ln in lines if "/ExGRPO-lr3e-4/seed4" in ln]
    assert len(ex) == 1 and "replay.ratio=0.5 algo.lr=3e-4 trainer.seed=4" in ex[0]
    assert "data.synthetic.max_digits=3" in ex[0] and "replay.start_threshold=0" in ex[0]
    fresh = dry_run("ablation=stability", "trainer.seed=100")
    assert "trainer.seed=104 " in fresh.stdout and "trainer.seed=4 " not in fresh.stdout
    quick = dry_run("ablation=stability-quick")
    assert quick.returncode == 0 and len(quick.stdout.strip().splitlines()) == 4


def test_the_plan_keeps_compare_to_for_a_later_summary(tmp_path: Path):
    vs = sw.parse_variants({"on": ["replay.ratio=0"], "ex": []})
    sw.write_plan(tmp_path, "pairs", vs, [0], "on", [], [], {"ex": "on"})
    assert sw.read_plan(tmp_path)["compare_to"] == {"ex": "on"}
