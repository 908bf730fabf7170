"""`trainer.nproc`: one `exgrpo train` starts the whole node's ranks itself.

Where it sits: in `commands/train.py`, after the config is validated and the memory plan has run
once (in this parent process), before any model loads. `auto` (the default) starts one rank per
visible GPU, and one process on a CPU; a number starts that many ranks (gloo on a CPU). The ranks
are started through torch's elastic launcher, the code path `torchrun` uses: each gets RANK,
LOCAL_RANK, WORLD_SIZE and MASTER_* and runs `run_training` on the same, already resolved config
(so they share one run directory). Under torchrun nothing more is spawned. The parent never
initialises CUDA: it counts the GPUs with torch (`visible_gpus`: NVML or the driver, no context),
and the memory plan asks nvidia-smi or a throwaway subprocess for their size; it exits with the
worst rank's exit code. Ctrl-C reaches every rank (the terminal signals the whole process group):
each finishes its step, the checkpoint is written once, and the ranks exit. A scheduler's stop or
warning (SIGTERM, SIGUSR1, SIGUSR2) sent to this process is passed on to the ranks, which do the
same; after a warning this process requeues the job (run/preempt.py). A rank that dies is said
in one line (run/rank_failure.py); torch's report goes to the log file.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import ExgrpoError, SaidElsewhere
from exgrpo_cli.run import preempt
from exgrpo_cli.run.log_files import open_log
from exgrpo_cli.run.rank_failure import rank_log

log = logging.getLogger(__name__)

# how long the ranks may take to finish a step and save after a stop, before they are killed
SHUTDOWN_TIMEOUT_S = 1800
# how long a rank that crashed waits before it exits: torch's launcher looks every 0.5 s
# (`monitor_interval`) and, of the ranks it finds dead in one look, reports the lowest only. A rank
# whose collective failed because a peer died (SIGKILL from the OOM killer) must not be found dead
# in the same look as that peer, or the line names it instead of the peer (the interpreter's
# teardown used to give that time by chance; ranks now skip it: parallel/process_end.py).
PEER_FIRST_S = 2.0


def under_launcher() -> bool:
    """True inside a torchrun (or our own) rank: its environment names its rank."""
    return "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ


def launched_rank() -> int:
    """This process's rank when torchrun or `launch` started it (RANK), else 0. The one place the
    commands learn it: rank 0 says errors and reports, the other ranks leave that to it."""
    return int(os.environ.get("RANK", "0"))


def visible_gpus() -> int:
    """How many GPUs this node shows. torch answers without creating a CUDA context (it asks
    NVML or the driver), so the process that starts the ranks holds none."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_nproc(cfg: ExgrpoConfig) -> int:
    """The number of ranks `exgrpo train` starts (1: train in this process)."""
    value = cfg.trainer.nproc
    if under_launcher():
        return 1
    if value == "auto":
        if cfg.trainer.device == "cpu":
            return 1
        return max(visible_gpus(), 1)
    return int(value)  # config_checks.validate admitted only auto or a number >= 1


def rank_logging(out: Path) -> None:
    """The rank's log file in the run dir, as Hydra sets it up for a one-process run."""
    handler = open_log(rank_log(out, launched_rank()))  # a FIFO or link there: one line, exit 2
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def rank_crashed() -> SaidElsewhere:
    """The error that ends a launched rank after an unexpected exception (already logged with its
    traceback; exit code 1), returned after `PEER_FIRST_S`, so that the launcher has seen a rank
    that died before this one did."""
    time.sleep(PEER_FIRST_S)
    return SaidElsewhere(1)


class RanksFailed(ExgrpoError):
    """A rank of `launch` failed (which, how, how to resume); the exit code is the worst rank's."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def launch(cfg: ExgrpoConfig, nproc: int, target: Callable[[ExgrpoConfig], Any]) -> Any:
    """Start `nproc` ranks on this node running `target(cfg)` (the command's rank entry: it turns
    its errors into exit codes), wait for all of them; rank 0's result. Raises RanksFailed when any
    failed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from exgrpo_cli.parallel.fsdp import free_port
    from exgrpo_cli.parallel.process_end import call_then_end

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"exgrpo-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=0,
        monitor_interval=0.5,
        start_method="spawn",
        # Ctrl-C reaches the ranks from the terminal. A scheduler's stop (SIGTERM) or warning
        # (USR1: sbatch --signal, USR2: submitit) this process passes on itself (_Forward): the
        # agent's own handling ends in a shutdown in which the ranks, done with their checkpoint,
        # wait for a result collection that never comes, until shutdown_timeout kills them
        signals_to_handle="SIGHUP,SIGQUIT",
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    log.info("starting %d ranks (trainer.nproc=%s)", nproc, cfg.trainer.nproc)
    # the parent only waits on Ctrl-C (the ranks stop themselves, see above)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ[preempt.PARENT_REQUEUES_ENV] = "1"  # the ranks inherit it: this process requeues
    try:
        with _Forward() as forward, _TorchLogToFile():
            # each rank ends without the interpreter's teardown (parallel/process_end.py)
            results: dict[int, Any] = elastic_launch(config, call_then_end)(target, cfg)
    except ChildFailedError as err:
        raise _failure(cfg, nproc, err) from None
    finally:
        os.environ.pop(preempt.PARENT_REQUEUES_ENV, None)
        signal.signal(signal.SIGINT, previous)
    if forward.signum in preempt.WARNING_SIGNALS:  # the ranks stopped and saved: requeue the job
        log.info(preempt.requeue_after_stop(forward.displaced, cfg.trainer.slurm_requeue))
    return results.get(0)


class _Forward:
    """While the ranks run: SIGTERM, SIGUSR1 and SIGUSR2 sent to this process go on to each rank
    (a rank that also had it directly ignores the repeat); the first one is remembered. The
    handlers it displaces (submitit's requeue handler, under submitit) come back afterwards."""

    SIGNALS = (signal.SIGTERM, *preempt.WARNING_SIGNALS)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.displaced: dict[int, Any] = {}

    def __enter__(self) -> _Forward:
        self.displaced = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        ranks = rank_pids()
        log.warning("signal %s: passed on to the ranks (pids %s)", signum, ranks)
        for pid in ranks:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:  # it has just exited
                pass

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.displaced.items():
            signal.signal(s, handler)


class _TorchLogToFile:
    """While the ranks run: torch's own log (the elastic agent's reports, a failed rank's traceback)
    goes to the run's log file, not the console, where one line says what failed. torch gives
    its loggers ("torch", "torch.distributed", ...) console handlers and keeps them from
    propagating; Hydra's root logger writes the run's log file."""

    def __enter__(self) -> _TorchLogToFile:
        self.saved: dict[str, tuple[list[logging.Handler], bool]] = {}
        for name, logger in list(logging.root.manager.loggerDict.items()):
            if not (isinstance(logger, logging.Logger) and (name + ".").startswith("torch.")):
                continue
            console = [h for h in logger.handlers if type(h) is logging.StreamHandler]
            if console:
                self.saved[name] = (list(logger.handlers), logger.propagate)
                for h in console:
                    logger.removeHandler(h)
                logger.propagate = True
        return self

    def __exit__(self, *exc: object) -> None:
        for name, (handlers, propagate) in self.saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate


def rank_pids(parent: int | None = None) -> list[int]:
    """The ranks `parent` (default: this process) started: its children that run
    multiprocessing's spawn entry point (not its resource tracker), read from /proc (the elastic
    agent does not expose them)."""
    me, found = parent or os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after the command name, which may hold spaces
            if ppid == me and b"spawn_main" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    return sorted(found)


def _failure(cfg: ExgrpoConfig, nproc: int, err: Any) -> RanksFailed:
    """The error that says in one line which rank failed first (torch's report goes to the log),
    with the worst rank's exit code (1 for a rank killed by a signal)."""
    from exgrpo_cli.run.rank_failure import dead_rank_line

    log.error("%s", err)
    rank, first = err.get_first_failure()
    codes = [f.exitcode for f in err.failures.values()]
    worst = max(codes, key=lambda c: abs(c))
    return RanksFailed(dead_rank_line(cfg, rank, first.pid, first.exitcode, nproc), worst if worst > 0 else 1)
