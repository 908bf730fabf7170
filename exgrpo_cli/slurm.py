"""Which SLURM job (if any) this process runs in: a leaf module read by the config (the default
run dir's name) and by train/preempt.py (the job a requeue names)."""

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
