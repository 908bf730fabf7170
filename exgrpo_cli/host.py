"""What the process learns from the host it runs on, read by the config, the run and the plans:
leaf functions without torch, so a forked checker can read them cheaply.

- The SLURM job (if any) this process runs in: the default run dir's name (conf/config.yaml) and
  the job a requeue names (run/preempt.py).
- Memory figures that Linux keeps under /proc, in bytes: the host's available memory (the start-up
  check of the model's size, plan/model_bounds.py), this process's size (the chat template check's
  limit, data/template_budget.py) and resident peak (the step's host memory, metrics/memory.py).
"""

from __future__ import annotations

import os
import time

RUN_NAME_RESOLVER = "exgrpo_run_name"


def slurm_job_id() -> str | None:
    """The id `scontrol requeue` takes: `<array job>_<task>` for an array task, else the job's."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def run_name(pattern: str = "%Y-%m-%d_%H-%M-%S") -> str:
    """The default run dir's last part (conf/config.yaml): `slurm-<job id>` inside a SLURM job,
    whose requeued runs keep the id and so find their checkpoints again; else the start time."""
    job = slurm_job_id()
    return f"slurm-{job}" if job else time.strftime(pattern)


def under_submitit() -> bool:
    """submitit's job runner names its folder in the environment before it calls the task."""
    return "SUBMITIT_FOLDER" in os.environ


def register_run_name_resolver() -> None:
    """`${exgrpo_run_name:}` in the configs; cached, so that every use within a run agrees."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RUN_NAME_RESOLVER):
        OmegaConf.register_new_resolver(RUN_NAME_RESOLVER, run_name, use_cache=True)


# Memory figures under /proc

MEMINFO, SELF_STATUS = "/proc/meminfo", "/proc/self/status"


def proc_bytes(path: str, field: str) -> int | None:
    """`field` of a /proc file of `Name:   <n> kB` lines, in bytes; None where it cannot be read
    (not Linux, or no such field)."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == field:
                    return int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
