"""Running a sweep's jobs (ablation/sweep.py) as child processes: after the plan is written and
before the summary of `exgrpo ablate`. Each job runs in its own session, so that a Ctrl-C reaches
it once (passed on by `wait_for`; the run saves and exits); each run dir is then marked
(`ablate.json`) as finished or not, and the runs that did not finish are returned.
"""

from __future__ import annotations

import signal
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING

from exgrpo_cli.ablation import sweep as sw

if TYPE_CHECKING:  # rich is imported when a command runs
    from rich.console import Console


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def start(argv: list[str], log: IO[str]) -> subprocess.Popen[bytes]:
    # Its own session: a Ctrl-C in the terminal reaches only this process, which passes exactly one
    # signal on (see wait_for); the run would otherwise get two and abort instead of saving.
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(*procs: subprocess.Popen[bytes]) -> list[int]:
    """Wait for runs. SIGINT/SIGTERM are passed on to them (each saves a checkpoint and exits; a
    second signal aborts it), then the sweep stops with KeyboardInterrupt once they have exited."""
    caught: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        codes = [proc.wait() for proc in procs]
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if caught:
        raise KeyboardInterrupt
    return codes


def run_sequential(todo: list[sw.Job], console: Console) -> list[sw.Job]:
    from exgrpo_cli.ablation.summary import read_metrics, run_result

    failed: list[sw.Job] = []
    spent: list[float] = []
    for i, job in enumerate(todo, 1):
        job.run_dir.mkdir(parents=True, exist_ok=True)
        log = job.run_dir / sw.TRAIN_LOG
        argv = sw.train_argv(job)
        console.print(f"[{i}/{len(todo)}] {job.label} -> {job.run_dir}", highlight=False)
        t0 = time.time()
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"$ {sw.shell_command(argv)}\n")
            fh.flush()
            proc = start(argv, fh)
            try:
                (rc,) = wait_for(proc)
            except KeyboardInterrupt:
                sw.write_marker(job, sw.training_finished(job.run_dir), time.time() - t0, None)
                raise
        wall = time.time() - t0
        finished = rc == 0 and sw.training_finished(job.run_dir)
        sw.write_marker(job, finished, wall, rc)
        spent.append(wall)
        if not finished:
            failed.append(job)
            console.print(
                f"  [red]failed[/] (exit {rc}) after {wall:.0f} s; last lines of {log}:\n{_tail(log)}",
                highlight=False,
                markup=False,
            )
            continue
        final = run_result(read_metrics(job.run_dir / "metrics.jsonl")).final
        eta = sum(spent) / len(spent) * (len(todo) - i)
        left = f"{eta:.0f} s" if eta < 90 else f"{eta / 60:.0f} min"
        console.print(
            f"  done in {wall:.0f} s: final val/accuracy {final:.3f}"
            + (f"; about {left} to go" if i < len(todo) else ""),
            highlight=False,
        )
    return failed


# launchers whose jobs queue on a cluster: every variant's jobs are submitted at once
SUBMIT_ALL_AT_ONCE = ("submitit_slurm",)


def run_with_launcher(
    todo: list[sw.Job],
    variants: list[sw.Variant],
    launcher: str,
    launcher_overrides: list[str],
    console: Console,
) -> list[sw.Job]:
    """One `exgrpo train -m` per variant over its seeds, run by the plugin: one after another, or
    all at once for a cluster's queue (SUBMIT_ALL_AT_ONCE)."""
    batches = [(v, [j for j in todo if j.variant == v]) for v in variants]
    batches = [(v, jobs) for v, jobs in batches if jobs]
    codes: list[int] = []
    with ExitStack() as logs:
        started = []
        for v, jobs in batches:
            argv = sw.multirun_argv(jobs, launcher, launcher_overrides)
            vdir = jobs[0].run_dir.parent
            vdir.mkdir(parents=True, exist_ok=True)
            console.print(
                f"{v.name}: seeds {', '.join(str(j.seed) for j in jobs)} via hydra/launcher={launcher}",
                highlight=False,
            )
            fh = logs.enter_context(open(vdir / sw.TRAIN_LOG, "a", encoding="utf-8"))
            fh.write(f"$ {sw.shell_command(argv)}\n")
            fh.flush()
            if launcher in SUBMIT_ALL_AT_ONCE:
                started.append(start(argv, fh))
            else:
                codes += wait_for(start(argv, fh))
        codes += wait_for(*started)
    failed: list[sw.Job] = []
    for (_, jobs), rc in zip(batches, codes):
        for j in jobs:
            finished = sw.training_finished(j.run_dir)
            sw.write_marker(j, finished, sw.wall_from_files(j.run_dir) if finished else None, rc)
            if not finished:
                failed.append(j)
                log = j.run_dir.parent / sw.TRAIN_LOG
                console.print(f"  [red]failed[/]: {j.label} (see {log})", highlight=False)
    return failed
