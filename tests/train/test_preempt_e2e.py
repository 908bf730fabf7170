"""A real run sent a scheduler's warning (issue #23 points 2 and 4): it ends at that step's end
with a verified checkpoint, requeues its SLURM job (a stub `scontrol` on PATH), and the same
command, in the same job, resumes in the same run dir; under trainer.nproc=2 the parent passes
the warning on and requeues once; a rank killed mid-run is said in one line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_stub import stub_scontrol

from exgrpo_cli.checkpoint.store import verify
from exgrpo_cli.run.launch import rank_pids

from conftest import SMALL_RUN, cli_env, metrics

JOB = "4242"


def _env(tmp_path: Path) -> dict[str, str]:
    env = cli_env()
    for var in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SUBMITIT_FOLDER"):
        env.pop(var, None)
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"
    env["SLURM_JOB_ID"] = JOB
    return env


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """`exgrpo train` as a SLURM job's script would start it: no run dir given, cwd = the job's."""
    cmd = [sys.executable, "-m", "exgrpo_cli", "train", "trainer.slurm_requeue=true", *SMALL_RUN, *args]
    return subprocess.Popen(cmd, cwd=tmp_path, env=_env(tmp_path), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _steps(out: Path) -> list[int]:
    return [r["step"] for r in metrics(out)] if (out / "metrics.jsonl").is_file() else []


def _wait_for_step(proc: subprocess.Popen[str], out: Path, step: int, limit_s: float = 400) -> None:
    deadline = time.time() + limit_s
    while time.time() < deadline and proc.poll() is None and (not _steps(out) or _steps(out)[-1] < step):
        time.sleep(0.2)
    assert proc.poll() is None, f"the run ended before step {step}: {proc.communicate()[1][-2000:]}"


def _stopped_step(err: str) -> int:
    found = re.search(r"stopped at step (\d+)", err)
    assert found, err[-3000:]
    return int(found.group(1))


@pytest.mark.slow
@pytest.mark.long  # make test-all only (docs/testing.md)
def test_sigusr1_checkpoints_requeues_and_the_same_command_resumes(tiny_model: Path, tmp_path: Path) -> None:
    calls = stub_scontrol(tmp_path / "bin")
    out = tmp_path / "outputs" / "train" / f"slurm-{JOB}"  # the default run dir in a SLURM job
    proc = _start(tmp_path, "trainer.steps=8")
    _wait_for_step(proc, out, 2)
    proc.send_signal(signal.SIGUSR1)
    t0 = time.time()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert time.time() - t0 < 60
    k = _stopped_step(err)
    assert 2 <= k < 8 and "SIGUSR1 came" in err
    assert verify(out / "checkpoints" / f"step_{k}") is None
    assert calls.read_text() == f"requeue {JOB}\n"
    again = _start(tmp_path, "trainer.steps=8")  # the requeued job: the same command, the same id
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-3000:]
    assert f"resumed from {out / 'checkpoints' / f'step_{k}'} (step {k})" in (out / "train.log").read_text()
    assert _steps(out) == list(range(9))
    assert calls.read_text() == f"requeue {JOB}\n"  # a finished run requeues nothing


@pytest.mark.slow
@pytest.mark.long  # make test-all only (docs/testing.md)
def test_two_ranks_warning_then_a_dead_rank_in_one_line(tiny_model: Path, tmp_path: Path) -> None:
    calls = stub_scontrol(tmp_path / "bin")
    out = tmp_path / "outputs" / "train" / f"slurm-{JOB}"
    args = ("trainer.nproc=2", "trainer.steps=40", "trainer.save_every=1")
    proc = _start(tmp_path, *args)
    _wait_for_step(proc, out, 1)
    proc.send_signal(signal.SIGUSR2)  # submitit's signal, to the parent only: it passes it on
    t0 = time.time()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    k = _stopped_step(err)
    assert "SIGUSR2 came" in err and time.time() - t0 < 120
    assert verify(out / "checkpoints" / f"step_{k}") is None
    assert calls.read_text() == f"requeue {JOB}\n"  # the parent requeued, once; the ranks did not
    again = _start(tmp_path, *args)
    _wait_for_step(again, out, k + 1)
    ranks = rank_pids(again.pid)
    assert len(ranks) == 2
    os.kill(ranks[-1], signal.SIGKILL)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 1
    line = next(x for x in err.splitlines() if "of 2 (pid" in x)
    assert re.search(
        rf"\(pid {ranks[-1]}\) was killed by SIGKILL (during step \d+|while writing step \d+'s checkpoint);",
        line,
    )
    newest = max(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*"))
    assert f"newest verified checkpoint: {out / 'checkpoints' / f'step_{newest}'};" in line
    assert "resume with: exgrpo train trainer.slurm_requeue=true" in line
    assert line.endswith(f"hydra.run.dir={out}")
    assert "Traceback" not in err, err[-3000:]
