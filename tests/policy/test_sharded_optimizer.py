"""Optimizers over FSDP2 shards (gloo ranks on a CPU, see shard_worker.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from policy.gloo_ranks import run_gloo_ranks

from conftest import worker_env

WORKER = Path(__file__).resolve().parent / "shard_worker.py"
# every test starts torchrun ranks: 11-27 s each measured on the shared 2-core machine
pytestmark = pytest.mark.slow


def _run(mode: str, ranks: int, tmp_path: Path) -> dict:
    out = tmp_path / "report.json"
    env = worker_env()
    env["PYTHONFAULTHANDLER"] = "1"  # a rank that aborts prints every thread's Python stack
    run_gloo_ranks(str(WORKER), mode, str(out), env=env, nproc=ranks)
    report: dict = json.loads(out.read_text())
    assert report["world_size"] == ranks
    return report


def test_host_adamw_survives_fsdp2_replacing_uneven_local_shards(tmp_path: Path) -> None:
    """trainer.offload=optimizer: HostAdamW found each parameter's moments by the id() of its
    local shard, which FSDP2 replaces (a module-wide _apply re-pads uneven shards): KeyError."""
    report = _run("host_adamw", 2, tmp_path)
    assert report["replaced"] == 4
    assert report["weight_diff"] < 1e-6 and report["moment_diff"] < 1e-6


def test_one_rank_fsdp_loads_a_legacy_optimizer_state(tmp_path: Path) -> None:
    """A one-GPU run is FSDP2 over one rank (DTensor parameters) with `dist.distributed` False:
    a legacy checkpoint's full optimizer state was loaded as plain tensors, which AdamW cannot
    step with DTensor parameters."""
    report = _run("one_rank_fsdp", 1, tmp_path)
    assert report["legacy_diff"] < 1e-6 and report["files_diff"] == 0.0
