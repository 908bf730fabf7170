"""Sweeps as jobs through Hydra's submitit launcher (issue #23 point 1; the `slurm` extra, which
`make install` installs): `exgrpo ablate` with hydra/launcher=submitit_local runs each run as a
submitit job and writes its summary; a job sent submitit's warning (SIGUSR2) checkpoints, is
requeued by submitit and resumes; the job script submitit_slurm would submit is checked with a
stand-in `sbatch`."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, SMALL_RUN, cli_env, run_cli, toy_sweep

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra is not installed")

TOY = {"on-policy": ["replay.ratio=0"], "exgrpo": ["replay.ratio=0.5"]}


@pytest.mark.slow
@pytest.mark.long  # make test-all only (docs/testing.md)
def test_ablate_through_submitit_local_writes_its_summary(tiny_model: Path, tmp_path: Path) -> None:
    conf = toy_sweep(tmp_path, TOY)
    sweep = tmp_path / "sweep"
    res = run_cli(
        ["ablate", f"hydra.searchpath=[file://{conf}]", "ablation=toy", "hydra/launcher=submitit_local",
         f"ablation.sweep_dir={sweep}", f"hydra.run.dir={tmp_path / 'h'}"],
        timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "via hydra/launcher=submitit_local" in res.stdout
    for d in ("on-policy", "exgrpo"):
        run = sweep / d / "seed0"
        assert json.loads((run / "ablate.json").read_text())["finished"]
        assert (run / "checkpoints" / "latest").read_text() == "step_2"
        assert list((sweep / d / ".submitit").glob("*/*_result.pkl"))  # it ran as a submitit job
    with open(sweep / "summary.csv", newline="") as fh:
        assert [r["variant"] for r in csv.DictReader(fh)] == ["on-policy", "exgrpo"]


def _submitit_task(under: Path) -> int | None:
    """The pid of the submitit job process working for this test (its folder is under `under`)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"submitit.core._submit" in cmd and str(under).encode() in cmd:
            return int(entry.name)
    return None


def _steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    return [json.loads(x)["step"] for x in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.slow
def test_submitits_warning_checkpoints_requeues_and_resumes(tiny_model: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "multirun"
    cmd = [sys.executable, "-m", "exgrpo_cli", "train", "-m", "hydra/launcher=submitit_local",
           *SMALL_RUN, "trainer.steps=8", "trainer.seed=0", f"hydra.sweep.dir={sweep}",
           "hydra.sweep.subdir=run"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=cli_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    run = sweep / "run"
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None and (not _steps(run) or _steps(run)[-1] < 2):
        time.sleep(0.2)
    task = _submitit_task(sweep)
    assert proc.poll() is None and task is not None, "the job ended before it could be warned"
    os.kill(task, signal.SIGUSR2)  # what submitit_local (and SLURM, for submitit_slurm) sends
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    log = (run / "train.log").read_text()
    stopped = int(log.split("stopped at step ")[1].split()[0])
    assert stopped < 8 and "SIGUSR2 came" in log
    assert f"resumed from {run / 'checkpoints' / f'step_{stopped}'} (step {stopped})" in log
    assert _steps(run) == list(range(9))  # every step once, across the requeue
    logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_log.out"))
    assert "Requeued job" in logs  # submitit's own requeue ran


def test_submitit_slurm_job_script(tmp_path: Path) -> None:
    """What `exgrpo train -m hydra/launcher=submitit_slurm` (the command `exgrpo ablate` composes
    for each variant) submits: the job script recorded by a stand-in sbatch that then refuses."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/sh\ncp "$1" "{tmp_path}/job.sh"\necho "no cluster here" >&2\nexit 1\n')
    sbatch.chmod(0o755)
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit looks for it; never run here
    (bin_dir / "srun").chmod(0o755)
    res = run_cli(
        ["train", "-m", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu",
         "hydra.launcher.account=proj", "hydra.launcher.gpus_per_node=8", "hydra.launcher.timeout_min=720",
         "hydra.launcher.signal_delay_s=600", "hydra.launcher.max_num_timeout=5", "trainer.seed=0,1",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        env_extra={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
        timeout=300,
    )  # fmt: skip
    assert res.returncode != 0 and "no cluster here" in res.stdout + res.stderr
    job = (tmp_path / "job.sh").read_text()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --time=720", "#SBATCH --signal=USR2@600",
                 "#SBATCH --array=0-1"):  # fmt: skip
        assert line in job, job
    assert "submitit.core._submit" in job and "srun" in job


def test_a_cluster_queue_gets_every_variant_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from exgrpo_cli.ablation import runs
    from exgrpo_cli.ablation import sweep as sw

    variants = sw.parse_variants({"a": ["replay.ratio=0"], "b": ["replay.ratio=0.5"]})
    jobs = sw.plan_jobs(variants, [0, 1], tmp_path, [], [])
    events: list[str] = []
    wait = runs.wait_for

    def start(argv: list[str], log: object) -> subprocess.Popen[bytes]:
        events.append("start")
        return subprocess.Popen(["true"])

    def waiting(*procs: subprocess.Popen[bytes]) -> list[int]:
        events.append(f"wait {len(procs)}")
        return wait(*procs)

    monkeypatch.setattr(runs, "start", start)
    monkeypatch.setattr(runs, "wait_for", waiting)
    quiet = Console(quiet=True)
    failed = runs.run_with_launcher(jobs, variants, "submitit_slurm", [], quiet)
    assert events == ["start", "start", "wait 2"]
    assert len(failed) == 4  # nothing trained here
    events.clear()
    runs.run_with_launcher(jobs, variants, "submitit_local", [], quiet)
    assert events == ["start", "wait 1", "start", "wait 1", "wait 0"]
