"""`trainer.nproc`: one `exgrpo train` starts its ranks itself (torch's elastic launcher), one
run dir, resumable, Ctrl-C stops every rank with one checkpoint (issue #12 point 5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exgrpo_cli.config.checks import validate
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig
from exgrpo_cli.run.launch import resolve_nproc

from conftest import REPO, SMALL_RUN, cli_env, metrics, run_cli

# SMALL_RUN's sizes: 4 questions x 4 responses a step, i.e. two questions on each of the two ranks
ARGS = SMALL_RUN


def test_nproc_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    cfg = ExgrpoConfig()
    cfg.trainer.device = "cpu"
    assert resolve_nproc(cfg) == 1  # auto on a CPU: this process
    cfg.trainer.nproc = "3"
    assert resolve_nproc(cfg) == 3
    monkeypatch.setenv("LOCAL_RANK", "0")  # under torchrun: nothing more is started
    assert resolve_nproc(cfg) == 1
    for bad in ("0", "two", "-1"):
        cfg.trainer.nproc = bad
        with pytest.raises(ConfigError, match="trainer.nproc"):
            validate(cfg)


def _steps(out: Path) -> list[int]:
    return [r["step"] for r in metrics(out)]


@pytest.mark.slow
@pytest.mark.long  # make test-all only (docs/testing.md)
def test_two_ranks_from_one_command_one_run_dir_and_resume(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "np2"
    cmd = ["train", "trainer.nproc=2", "trainer.steps=2", f"trainer.output_dir={out}", *ARGS]
    first = run_cli([*cmd, f"hydra.run.dir={tmp_path / 'h1'}"])
    assert first.returncode == 0, first.stderr[-3000:]
    assert (out / "train.log").is_file() and (out / "train.rank1.log").is_file()
    assert "rank 1/2 joined the gloo process group" in (out / "train.rank1.log").read_text()
    assert _steps(out) == [0, 1, 2] and (out / "checkpoints" / "step_2").is_dir()
    again = run_cli([*cmd[:2], "trainer.steps=3", *cmd[3:], f"hydra.run.dir={tmp_path / 'h2'}"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / 'step_2'} (step 2)" in (out / "train.log").read_text()
    assert _steps(out) == [0, 1, 2, 3]
    bad = run_cli(["train", "trainer.nproc=2", "trainer.steps=1", "data.source=jsonl", "data.path=/x.jsonl"])
    assert bad.returncode == 2  # refused in the parent, before any rank starts


@pytest.mark.slow
@pytest.mark.long  # make test-all only (docs/testing.md)
def test_ctrl_c_stops_every_rank_with_one_checkpoint(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "exgrpo_cli", "train", "trainer.nproc=2", "trainer.steps=200",
           f"trainer.output_dir={out}", f"hydra.run.dir={tmp_path / 'h'}", *ARGS]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=cli_env(), start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline and not (out / "metrics.jsonl").is_file():
        time.sleep(0.2)
    while time.time() < deadline and len(_steps(out)) < 3:  # step 0 (validation) and two steps
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    steps = _steps(out)
    stopped = steps[-1]
    assert stopped < 200 and f"stopped at step {stopped}" in err
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == [f"step_{stopped}"]
    assert "Traceback" not in err
