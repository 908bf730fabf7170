"""`model.path` of another model under the default (tiny) preset's settings is refused with the
preset to add; the tiny model and checkpoints of tiny-model runs keep working."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exgrpo_cli.commands.model_preset import check_model_preset, problem
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig

from conftest import run_cli


def _fake_run(root: Path, preset: str) -> Path:
    """The files an exgrpo run leaves that this check reads: Hydra's record, a checkpoint."""
    (root / ".hydra").mkdir(parents=True)
    (root / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  runtime:\n    choices:\n      model: {preset}\n")
    ckpt = root / "checkpoints" / "step_2"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    return ckpt / "model"


def _cfg(path: str, preset: str = "tiny") -> ExgrpoConfig:
    cfg = ExgrpoConfig()
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=path, preset=preset))


def test_a_foreign_path_under_the_tiny_preset_is_refused():
    with pytest.raises(ConfigError, match="add model=<preset>") as err:
        check_model_preset(_cfg("Qwen/Qwen2.5-Math-7B"), "eval", chosen_explicitly=False)
    assert "think_short" in str(err.value) and "\n" not in str(err.value)
    check_model_preset(_cfg("Qwen/Qwen2.5-Math-7B"), "eval", chosen_explicitly=True)  # model=tiny given
    check_model_preset(_cfg("Qwen/Qwen2.5-Math-7B", "qwen2.5-math-7b"), "train", chosen_explicitly=False)
    check_model_preset(_cfg("Qwen/Qwen2.5-Math-7B"), "inspect-buffer", chosen_explicitly=False)


def test_exgrpo_checkpoints_name_their_preset(tmp_path: Path):
    assert problem("builtin:tiny") is None
    tiny = _fake_run(tmp_path / "tiny-run", "tiny")
    assert problem(str(tiny)) is None and problem(str(tiny.parent)) is None
    assert problem(str(tiny.parent.parent.parent)) is None  # the run dir
    big = _fake_run(tmp_path / "big-run", "qwen2.5-math-7b")
    assert problem(str(big)) == "it is a checkpoint of a model=qwen2.5-math-7b run: add model=qwen2.5-math-7b"


@pytest.mark.slow  # the CLI, ~10 s
def test_the_cli_refuses_in_one_line_before_loading(tmp_path: Path):
    res = run_cli(["eval", "model.path=Qwen/Qwen2.5-Math-7B"], cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "add model=<preset>" in res.stderr
    assert list(tmp_path.iterdir()) == []
