"""Stopping a run on a signal, and what follows a scheduler's warning: the job requeued.

Where it sits: `StopRequested` is active around the whole of run/training.py's run. Inside the step
loop a signal sets a flag that the ranks all-reduce at the step's end, so every rank finishes the
step in flight, the checkpoint is written once, and the run ends. Before the loop (the lock, the
logger, the data, the model loading) there is no step to finish and no checkpoint to come: a
SIGTERM or SIGINT (`timeout`, scancel, Ctrl-C) ends the start at once (`StartInterrupted`, exit
128 + the signal), even one blocked in a system call; a warning (SIGUSR1/2) is kept for after the
first step, where its checkpoint is written. After that, `requeue_after_stop` (called by the
process that owns the job: the one-process run, torchrun's rank 0, or the parent of
`trainer.nproc` ranks in run/launch.py) puts the job back in the queue when the signal was a
warning of the end (a time limit, a preemption):

- SIGUSR1: what `#SBATCH --signal=USR1@<seconds>` sends before the time limit;
- SIGUSR2: what submitit sends (its default preemption/time-out signal);
- SIGTERM, SIGINT: a scheduler's (or scancel's) stop, Ctrl-C: stop with a checkpoint, no requeue
  (a scancel must not come back; SLURM requeues preempted jobs itself when so configured).

The requeue is submitit's own when the job runs under submitit (its handler, displaced by ours
while the loop runs, is called after the checkpoint: it counts time-outs and requeues), else
`scontrol requeue <job>` when `trainer.slurm_requeue=true` inside a SLURM job, else none: the same
command resumes from the checkpoint. A requeued job finds its run dir again because the default
run dir of a SLURM job is named after the job (exgrpo_cli/host.py, conf/config.yaml).
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from types import FrameType, TracebackType
from typing import Any

from exgrpo_cli.errors import ExgrpoError
from exgrpo_cli.host import slurm_job_id, under_submitit

log = logging.getLogger(__name__)

# the warnings of an end (time limit, preemption) after which the job is requeued
WARNING_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, *WARNING_SIGNALS)

# what the ranks all-reduce (max) at a step's end: the strongest request wins
NO_STOP, STOP, STOP_AND_REQUEUE = 0, 1, 2

# set by run/launch.py for the ranks it starts: their parent requeues the job, not rank 0
PARENT_REQUEUES_ENV = "EXGRPO_PARENT_REQUEUES"


class StartInterrupted(ExgrpoError):
    """A stop signal before the step loop: the start ends at once, nothing was trained."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {_name(signum)} before training started (nothing was trained)")
        self.exit_code = 128 + signum


class StopRequested:
    """Turns the stop signals into a flag checked at step boundaries.

    `defer=False`: until `training()` is called (the step loop starts), SIGTERM and SIGINT raise
    StartInterrupted from the handler instead: Python runs the handler as soon as the system call
    it interrupts returns EINTR, so a start blocked in open() or a sleep ends too.
    A second Ctrl-C aborts (the user insists). Any other repeat is ignored: under SLURM a warning
    can reach a rank twice, directly and forwarded by its launcher, and must not cost the
    checkpoint it asks for."""

    def __init__(self, defer: bool = True) -> None:
        self.defer = defer
        self.signum: int | None = None
        self.received_at: float | None = None  # time.monotonic() of the first signal
        self._old: dict[int, Any] = {}
        self._run_code = NO_STOP
        self._depth = 0

    @property
    def flag(self) -> bool:
        return self.signum is not None or self._run_code != NO_STOP

    def __enter__(self) -> StopRequested:
        self._depth += 1  # re-entered (the run, then its step loop): the handlers go in once
        if self._depth > 1:
            return self
        for sig in STOP_SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def training(self) -> None:
        """The step loop starts: from now on every stop signal waits for the step's end."""
        self.defer = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.defer and signum in (signal.SIGINT, signal.SIGTERM):
            raise StartInterrupted(signum)
        if self.signum is not None:
            if signum == self.signum == signal.SIGINT:
                raise KeyboardInterrupt
            log.warning("signal %s again: ignored, the checkpoint is on its way", _name(signum))
            return
        self.signum = signum
        self.received_at = time.monotonic()
        log.warning("signal %s: saving a checkpoint at the end of this step", _name(signum))

    @property
    def code(self) -> int:
        """This rank's request, for the all-reduce at the step's end."""
        if self.signum is None:
            return NO_STOP
        return STOP_AND_REQUEUE if self.signum in WARNING_SIGNALS else STOP

    def agree(self, run_code: int) -> None:
        """Take the run-wide request (the max over the ranks): a rank the signal missed stops too."""
        self._run_code = max(run_code, self.code)

    @property
    def requeue(self) -> bool:
        """The run stopped for a warning: the job is to be requeued once the checkpoint is written."""
        return self._run_code == STOP_AND_REQUEUE

    def since(self) -> str:
        """For the stop line: which signal, and how long ago (the grace a stop takes)."""
        if self.signum is None or self.received_at is None:
            return ""
        return f" ({_name(self.signum)} came {time.monotonic() - self.received_at:.1f} s ago)"

    def displaced(self) -> dict[int, Any]:
        """The handlers this one displaced (submitit's, under submitit)."""
        return dict(self._old)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._depth -= 1
        if self._depth:
            return
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


# ----------------------------------------------------------------------------- SLURM and submitit


def scontrol_requeue(job_id: str, timeout_s: float = 60.0) -> None:
    """`scontrol requeue <job_id>`: SLURM ends the job and queues it again with the same id."""
    exe = shutil.which("scontrol")
    if exe is None:
        raise ExgrpoError(
            f"trainer.slurm_requeue=true but scontrol is not on PATH; the checkpoint is saved: "
            f"requeue job {job_id} yourself (or resubmit) to resume"
        )
    try:
        res = subprocess.run(
            [exe, "requeue", job_id], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise ExgrpoError(
            f"scontrol requeue {job_id} did not answer within {timeout_s:.0f} s; the checkpoint is saved"
        ) from None
    if res.returncode != 0:
        raise ExgrpoError(
            f"scontrol requeue {job_id} failed (exit {res.returncode}: {res.stderr.strip()}); "
            "the checkpoint is saved: requeue or resubmit the job to resume"
        )
    log.info("requeued SLURM job %s", job_id)


def requeue_after_stop(previous: Mapping[int, Any], slurm_requeue: bool) -> str:
    """After a stop for a warning, its checkpoint written: put the job back in the queue.
    `previous`: the signal handlers exgrpo displaced (submitit's requeue handler under submitit,
    which exits the process). Returns what was done, for the log."""
    if under_submitit():
        for sig in WARNING_SIGNALS:
            handler = previous.get(sig)
            if callable(handler):
                log.info("handing over to submitit's requeue (its %s handler)", _name(sig))
                handler(sig, None)  # submitit: requeues (scontrol, or a local restart), then exits
                return "requeued by submitit"
    job = slurm_job_id()
    if slurm_requeue and job:
        scontrol_requeue(job)
        return f"requeued SLURM job {job}"
    return "no requeue (trainer.slurm_requeue=false or not in a SLURM job): rerun the command to resume"
