"""A rank that died, said in one line: which rank, of what, at which step, where the run can
resume from and the command that resumes it.

Where it sits: run/launch.py calls `dead_rank_line` in the parent of `trainer.nproc` ranks when
torch's elastic launcher reports a failed rank (its report, with the library's traceback, goes to
the run's log file only). The step comes from metrics.jsonl (rank 0 logs each step once it is
done, so the step in flight is the next one); the checkpoint is the one a resume would take,
verified against its manifest as the resume will verify it (read-only here: nothing is
quarantined).
"""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.config.paths import hydra_config
from exgrpo_cli.config.schema import ExgrpoConfig


def _what(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def step_in_flight(out: Path, steps: int) -> str:
    """'during step k' from the last step metrics.jsonl holds ('before step 1' without one), or
    the checkpoint write of that step when its temporary folder is there."""
    last = None
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
        for line in reversed(lines):
            if line.strip():
                last = int(json.loads(line)["step"])
                break
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if last is None:
        return "before step 1 (while starting)"
    if (out / "checkpoints" / f".tmp-step_{last}").is_dir():  # a write the death left torn
        return f"while writing step {last}'s checkpoint"
    if last >= steps:
        return f"after its last step ({steps})"
    return f"during step {last + 1}"


def resume_command(cfg: ExgrpoConfig) -> str:
    """The command line that resumes this run: its overrides, its run dir pinned."""
    hc = hydra_config()
    if hc is None:  # outside a Hydra app: the output dir alone
        task, run_dir = [f"trainer.output_dir={cfg.trainer.output_dir}"], []
    else:
        task = list(hc.overrides.task)
        pinned = [o for o in hc.overrides.hydra if o.split("=", 1)[0] == "hydra.run.dir"]
        run_dir = pinned or [f"hydra.run.dir={hc.runtime.output_dir}"]
    return shlex.join(["exgrpo", "train", *task, *run_dir])


def rank_log(out: Path, rank: int) -> Path:
    """The rank's log file (run/launch.py's `rank_logging` writes it)."""
    return out / ("train.log" if rank == 0 else f"train.rank{rank}.log")


def dead_rank_line(cfg: ExgrpoConfig, rank: int, pid: int, exitcode: int, world: int) -> str:
    out = Path(cfg.trainer.output_dir)
    # the checkpoint trainer.resume=auto would take: the first resume candidate that verifies
    found = next((p for p in ckpt.resume_candidates(out / "checkpoints") if ckpt.verify(p) is None), None)
    where = str(found) if found is not None else "none (a rerun starts from step 0)"
    return (
        f"rank {rank} of {world} (pid {pid}) {_what(exitcode)} "
        f"{step_in_flight(out, cfg.trainer.steps)}; newest verified checkpoint: {where}; "
        f"its log: {rank_log(out, rank)}; resume with: {resume_command(cfg)}"
    )
