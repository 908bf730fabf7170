"""Sweeps keep what the user asked for: a paper recipe chosen on the ablate command line is the
runs' scale (the preset's tiny-model base is not applied), the SLURM sweep of docs/scaling-up.md
composes runs of the recipe's model, steps and batch, and a custom sweep file is found where the
docs say (DIR/ablation/<name>.yaml)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from doc_checks import compose_command, sweep_points

from conftest import REPO, run_cli

pytestmark = pytest.mark.slow  # each test runs `exgrpo ablate` dry runs and composes their runs (~15 s)

RECIPE = "experiment=paper-qwen2.5-math-7b"


def _train_overrides(line: str) -> list[str]:
    """The overrides of one printed `exgrpo train` command, less Hydra's own and -m."""
    argv = shlex.split(line)
    argv = argv[argv.index("train") + 1 :]
    return [a for a in argv if not a.startswith(("hydra", "-"))]


def _assert_recipe_scale(overrides: list[str]) -> None:
    cfg = compose_command("train", sweep_points(overrides)[0])
    assert cfg.model.path == "Elliott/Qwen2.5-Math-7B-16k-think"
    assert (cfg.trainer.steps, cfg.algo.questions_per_step, cfg.rollout.n) == (700, 128, 8)
    assert cfg.trainer.threads == 0 and cfg.logger.wandb.mode == "auto"  # not the toy base's 1 / disabled


def test_a_recipe_on_the_ablate_command_line_sets_the_scale(tmp_path: Path):
    res = run_cli(["ablate", "ablation=replay-ratio", RECIPE, "ablation.dry_run=true"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    said = res.stderr.strip().splitlines()
    assert len(said) == 1 and "trainer.steps=50" in said[0] and "not applied" in said[0]
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 4 * 3  # 4 ratios x 3 seeds
    for line in lines[:1] + lines[-1:]:
        _assert_recipe_scale(_train_overrides(line))
    assert "replay.ratio=0.75" in lines[-1]  # the variant's own override is kept
    assert list(tmp_path.iterdir()) == []  # a dry run leaves no run folder


def test_an_explicit_override_wins_over_the_base(tmp_path: Path):
    argv = ["ablate", "ablation=replay-ratio", "trainer.steps=7", "ablation.dry_run=true"]
    res = run_cli(argv, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    first = _train_overrides(res.stdout.splitlines()[0])
    assert compose_command("train", first).trainer.steps == 7
    assert compose_command("train", first).algo.questions_per_step == 8  # the rest of the base holds


def test_the_documented_slurm_sweep_runs_at_the_recipe_scale(tmp_path: Path):
    page = (REPO / "docs" / "scaling-up.md").read_text()
    start = page.index("exgrpo ablate ablation=replay-ratio " + RECIPE)
    text = page[start : page.index("\n", page.index("max_num_timeout", start))].replace("\\\n", " ")
    argv = shlex.split(text.replace("<partition>", "p").replace("<account>", "a"))[2:]
    res = run_cli(["ablate", *argv, "ablation.dry_run=true"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 4 and all("hydra/launcher=submitit_slurm" in line for line in lines)
    for line in lines:  # one `exgrpo train -m` per variant, over its seeds
        _assert_recipe_scale(_train_overrides(line))


def test_a_custom_sweep_file_is_found_as_the_docs_say(tmp_path: Path):
    page = (REPO / "docs" / "ablations-and-results.md").read_text()
    yaml = page[page.index("# DIR/ablation/<name>.yaml") : page.index("```", page.index("# DIR/ablation/"))]
    (tmp_path / "DIR" / "ablation").mkdir(parents=True)
    (tmp_path / "DIR" / "ablation" / "my-sweep.yaml").write_text(yaml)
    argv = ["ablate", "--config-dir", str(tmp_path / "DIR"), "ablation=my-sweep", "ablation.dry_run=true"]
    res = run_cli(argv, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 2 * 2 and "replay.ratio=0 " in lines[0] and "trainer.steps=20" in lines[0]
    (tmp_path / "DIR" / "my-sweep.yaml").write_text(yaml)  # beside the folder, not in it: refused
    res = run_cli(["ablate", "--config-dir", str(tmp_path / "DIR"), "ablation=other"], cwd=tmp_path)
    assert res.returncode == 2 and "the ablation presets are" in res.stderr and "my-sweep" in res.stderr
