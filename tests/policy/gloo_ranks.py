"""Worker scripts on gloo ranks under torchrun, for the tests that check what only real ranks show
(FSDP2 shards, collectives): a failed rank fails the test with the ranks' output."""

from __future__ import annotations

import subprocess

import pytest
import torch

from conftest import torchrun, worker_env


def run_gloo_ranks(
    *args: str, env: dict[str, str] | None = None, nproc: int = 2, timeout: float = 180
) -> None:
    """`args` (a worker script and its arguments) on `nproc` ranks; skipped where torch was built
    without torch.distributed."""
    if not torch.distributed.is_available():
        pytest.skip("torch built without torch.distributed")
    cmd = torchrun(*args, nproc=nproc)
    proc = subprocess.run(cmd, env=env or worker_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
