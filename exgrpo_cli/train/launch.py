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
each finishes its step, the checkpoint is written once, and the ranks exit.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exgrpo_cli.config import ExgrpoConfig
from exgrpo_cli.errors import ExgrpoError

log = logging.getLogger(__name__)

# how long the ranks may take to finish a step and save after a stop, before they are killed
SHUTDOWN_TIMEOUT_S = 1800


def under_launcher() -> bool:
    """True inside a torchrun (or our own) rank: its environment names its rank."""
    return "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ


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


def _rank_logging(out: Path) -> None:
    """The rank's log file in the run dir, as Hydra sets it up for a one-process run."""
    rank = int(os.environ.get("RANK", "0"))
    name = "train.log" if rank == 0 else f"train.rank{rank}.log"
    handler = logging.FileHandler(out / name)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def rank_main(cfg: ExgrpoConfig) -> dict[str, float]:
    """What every started rank runs (in a fresh process)."""
    from exgrpo_cli.train.run import run_training

    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _rank_logging(out)
    try:
        return run_training(cfg)
    except ExgrpoError as err:
        if os.environ.get("RANK", "0") == "0":
            print(f"exgrpo train: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None


def launch(cfg: ExgrpoConfig, nproc: int, target: Callable[[ExgrpoConfig], Any] | None = None) -> Any:
    """Start `nproc` ranks on this node running `target(cfg)` (default: training), wait for all of
    them; rank 0's result. Raises SystemExit with the worst rank's exit code when any failed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from exgrpo_cli.policy.distributed import free_port

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
        # Ctrl-C reaches the ranks from the terminal: the agent leaves SIGINT alone (a second
        # signal would abort a rank that is saving its checkpoint); on SIGTERM (a scheduler's stop)
        # it passes one SIGTERM on and gives the ranks time to write their checkpoint
        signals_to_handle="SIGTERM,SIGHUP,SIGQUIT",
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    log.info("starting %d ranks (trainer.nproc=%s)", nproc, cfg.trainer.nproc)
    # the parent only waits on Ctrl-C (the ranks stop themselves, see above)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        results: dict[int, Any] = elastic_launch(config, target or rank_main)(cfg)
    except ChildFailedError as err:
        codes = [f.exitcode for f in err.failures.values()]
        worst = max(codes, key=lambda c: abs(c))
        raise SystemExit(worst if worst > 0 else 1) from None
    finally:
        signal.signal(signal.SIGINT, previous)
    return results.get(0)
