"""The command line as a user meets it: help, subcommands, Hydra features, exit codes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import run_cli


def test_top_level_help_is_fast_and_lists_commands():
    t0 = time.perf_counter()
    res = run_cli(["--help"])
    elapsed = time.perf_counter() - t0
    assert res.returncode == 0
    for cmd in ("train", "eval", "ablate", "inspect-buffer"):
        assert f"  {cmd} " in res.stdout
    assert elapsed < 2.0, f"exgrpo --help took {elapsed:.2f}s"


def test_unknown_command_exits_2():
    res = run_cli(["trian"])
    assert res.returncode == 2 and "unknown command" in res.stderr


def test_cfg_job_with_overrides(tmp_path: Path):
    res = run_cli(["train", "replay.ratio=0.25", "model=qwen2.5-math-7b", "--cfg", "job"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "ratio: 0.25" in res.stdout and "Elliott/Qwen2.5-Math-7B-16k-think" in res.stdout


@pytest.mark.parametrize(
    "override,key",
    [("replay.ratio=1.5", "replay.ratio"), ("replay.bucket_edges=[0.7,0.2]", "replay.bucket_edges")],
)
def test_invalid_value_exit_code_2_before_loading(tmp_path: Path, override: str, key: str):
    t0 = time.perf_counter()
    res = run_cli(["train", override, f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert res.returncode == 2
    assert key in res.stderr and "allowed" in res.stderr
    assert time.perf_counter() - t0 < 20  # refused before any model load
    assert not (tmp_path / "checkpoints").exists()


def test_a_multirun_stops_at_its_first_refused_job_with_exit_2(tmp_path: Path):
    res = run_cli(["train", "-m", "replay.ratio=1.5,2.0", f"hydra.sweep.dir={tmp_path}"], cwd=tmp_path)
    # both jobs would be refused by validation: Hydra runs them in turn and the first one's exit
    # stops the sweep, so the second is never started
    assert res.returncode == 2
    assert "invalid replay.ratio=1.5" in res.stderr and "replay.ratio=2.0" not in res.stderr
    assert (tmp_path / "multirun.yaml").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["0"]


@pytest.mark.parametrize("command", ["train", "eval"])
def test_cuda_without_a_gpu_is_a_usage_error(tmp_path: Path, command: str):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    res = run_cli([command, "trainer.device=cuda", f"hydra.run.dir={tmp_path}", "logger.wandb.mode=disabled"])
    assert res.returncode == 2, res.stderr[-2000:]
    assert "invalid trainer.device=cuda: no CUDA device is visible" in res.stderr
    assert "Traceback" not in res.stderr
