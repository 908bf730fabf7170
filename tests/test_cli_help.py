"""The command line a newcomer meets first: each command's --help, the closed schema, one-line
mistakes (exit 2, no run folder left behind), and the generated config reference page."""

from __future__ import annotations

from pathlib import Path

import pytest

from exgrpo_cli.cli.overrides import check
from exgrpo_cli.config import keys as schema_keys
from exgrpo_cli.config.paths import config_dir
from exgrpo_cli.config.reference import PAGE, render
from exgrpo_cli.errors import UsageError

from conftest import run_cli


def test_every_key_and_section_has_a_meaning():
    assert schema_keys.missing_help() == []
    assert len(schema_keys.keys()) > 100  # the walk reaches the nested sections too


def test_config_reference_page_is_current():
    assert PAGE.read_text() == render(), "stale: python -m exgrpo_cli.config.reference --write"
    for k in schema_keys.keys():
        assert f"| `{k.name}` |" in PAGE.read_text()


def test_train_help_is_short_and_explains_replay_ratio(tmp_path: Path):
    res = run_cli(["train", "--help"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) <= 120
    assert lines[0].startswith("usage: exgrpo train ")
    ratio = next(line for line in lines if line.strip().startswith("replay.ratio="))
    assert "share of the step's questions drawn from the buffer" in ratio
    assert "tiny*" in res.stdout and "paper-qwen2.5-math-7b" in res.stdout  # groups and presets
    assert "Config groups" in res.stdout and "replay: " in res.stdout and "model: " in res.stdout
    assert not (tmp_path / "outputs").exists()


def test_help_values_follow_the_overrides(tmp_path: Path):
    res = run_cli(["train", "model=qwen2.5-math-7b", "replay.ratio=0.25", "--help"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "replay.ratio=0.25 " in res.stdout and "qwen2.5-math-7b*" in res.stdout


def test_inspect_buffer_help_shows_its_path_and_json(tmp_path: Path):
    res = run_cli(["inspect-buffer", "--help"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: exgrpo inspect-buffer <path> [--json]")
    assert "exgrpo inspect_buffer" not in res.stdout  # the command as typed, not Hydra's job name
    assert "  <path> " in res.stdout and "  --json " in res.stdout


def test_eval_help_lists_the_suites(tmp_path: Path):
    res = run_cli(["eval", "--help"], cwd=tmp_path)
    assert res.returncode == 0 and len(res.stdout.splitlines()) <= 120
    paper = next(line for line in res.stdout.splitlines() if line.startswith("  paper "))
    assert "aime24" in paper and "mmlu_pro" in paper


def test_help_all_lists_every_key(tmp_path: Path):
    res = run_cli(["ablate", "--help-all"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    shown = {line.split("=", 1)[0].strip() for line in res.stdout.splitlines() if "=" in line}
    assert {k.name for k in schema_keys.keys()} <= shown


@pytest.mark.parametrize(
    "args,says",
    [
        (["replay.ration=0.5"], "did you mean replay.ratio?"),
        (["+replay.ration=0.5"], "did you mean replay.ratio?"),
        (["++trainer.stpes=3"], "did you mean trainer.steps"),
        (["~replay.ration"], "did you mean replay.ratio?"),
        (["replay.ratio=abc"], "invalid replay.ratio=abc: replay.ratio is float"),
        (["trainer.steps=[1,2]"], "trainer.steps is int"),
        (["rollout=vlm"], "the rollout presets are hf, vllm"),
        (["experiment=paper-qwen-7b"], "paper-qwen2.5-math-7b"),
        (["+replay.ratio=0.3"], "set it with replay.ratio=0.3"),
        (["-m", "replay.ratio=0,abc"], "invalid replay.ratio=0,abc"),
        (["-m", "replay.ratio=0,1", "--cfg", "job"], "only one of"),
        (["replay.ratio=["], "cannot read the override 'replay.ratio=['"),
        (["--cfg"], "--cfg"),
    ],
)
def test_mistakes_are_one_usage_error(args: list[str], says: str):
    with pytest.raises(UsageError, match=None) as err:
        check("train", args, config_dir())
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "args",
    [
        ["replay.ratio=0.25", "model=qwen2.5-math-7b", "experiment=null"],
        ["+ablation.compare_to.ratio-0=ratio-0.5", "ablation.variants={}"],  # free dicts by design
        ["hydra.run.dir=/tmp/x", "hydra/launcher=basic", "++hydra.job.chdir=false"],
        ["-m", "replay.ratio=0,0.5", "trainer.seed=range(0,3)"],
        ["replay.ratio=${algo.lr}"],
    ],
)
def test_what_the_schema_declares_passes(args: list[str]):
    check("train", args, config_dir())


def test_a_custom_sweep_dir_adds_its_presets(tmp_path: Path):
    (tmp_path / "ablation").mkdir()
    (tmp_path / "ablation" / "mine.yaml").write_text("name: mine\nvariants:\n  a: [replay.ratio=0]\n")
    with pytest.raises(UsageError, match="ablation presets"):
        check("ablate", ["ablation=mine"], config_dir())
    check("ablate", ["--config-dir", str(tmp_path), "ablation=mine"], config_dir())


@pytest.mark.parametrize(
    "args,says",
    [
        (["replay.ration=0.5"], "did you mean replay.ratio?"),
        (["+replay.ration=0.5"], "did you mean replay.ratio?"),
        (["rollout=vlm"], "hf, vllm"),
        (["replay.ratio=2"], "replay.ratio"),  # refused inside the app, after Hydra made its folder
    ],
)
def test_refused_commands_say_one_line_and_leave_no_folder(tmp_path: Path, args: list[str], says: str):
    res = run_cli(["train", *args], cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and says in res.stderr, res.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_leaves_no_folder(tmp_path: Path):
    res = run_cli(["train", "trainer.dry_run=true"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "fits" in res.stdout and list(tmp_path.iterdir()) == []
