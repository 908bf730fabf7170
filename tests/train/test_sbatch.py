"""scripts/slurm/train.sbatch under a faked SLURM (issue #23 point 3): `srun` and `scontrol` are
stand-ins on PATH (srun starts the script's per-node command once per "node", all on this host;
scontrol names the nodes), everything after them is real: the script's torchrun command line,
two torchruns meeting at the c10d rendezvous it composes, 2 nodes x 2 gloo ranks training."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo_cli.parallel.fsdp import free_port

from conftest import REPO, SMALL_RUN, cli_env, metrics, run_captured

SCRIPT = REPO / "scripts" / "slurm" / "train.sbatch"

FAKE_SRUN = """#!/bin/bash
# stand-in for srun: the command once per node of the job, all on this host, with the environment
# srun passes on (the sockets' interface: what every node's gloo and NCCL read)
echo "$@" >> "{log}"
for v in GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME; do echo "$v=${{!v:-}}"; done >> "{log}.env"
[[ -n ${{FAKE_SRUN_DRY:-}} ]] && exit 0  # the command line and environment only
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 "$@" &
  pids+=($!)
done
rc=0
for p in "${{pids[@]}}"; do wait "$p" || rc=$?; done
exit $rc
"""

FAKE_SCONTROL = """#!/bin/bash
# stand-in for scontrol: `show hostnames <list>` names one host per node (all this one)
if [[ $1 == show && $2 == hostnames ]]; then
  for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do echo localhost; done
else
  echo "$@" >> "{log}"
fi
"""


def _fake_slurm(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text.format(log=tmp_path / f"{name}.calls"))
        (bin_dir / name).chmod(0o755)
    env = cli_env()
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        PYTHON=sys.executable,
        SLURM_JOB_ID="31337",
        SLURM_JOB_NUM_NODES="2",
        SLURM_JOB_NODELIST="node[1-2]",
        SLURM_SUBMIT_DIR=str(tmp_path),
        EXGRPO_NPROC_PER_NODE="2",
        EXGRPO_RDZV_PORT=str(free_port()),
    )
    return env


@pytest.mark.slow
@pytest.mark.long  # make test-all only (docs/testing.md)
def test_two_nodes_of_two_ranks_from_the_sbatch_script(tiny_model: Path, tmp_path: Path) -> None:
    env = _fake_slurm(tmp_path)
    res = run_captured(
        ["bash", str(SCRIPT), "trainer.device=cpu", "trainer.steps=2", *SMALL_RUN], tmp_path, env, 900
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    srun = (tmp_path / "srun.calls").read_text()
    assert "--ntasks-per-node=1 --nodes=2" in srun  # one torchrun per node
    # the ranks of both "nodes" met over gloo on the interface the script picked for localhost
    assert (tmp_path / "srun.calls.env").read_text().split() == [
        "GLOO_SOCKET_IFNAME=lo",
        "NCCL_SOCKET_IFNAME=lo",
    ]
    assert "--nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d" in srun
    assert f"--rdzv-endpoint=localhost:{env['EXGRPO_RDZV_PORT']}" in srun
    out = tmp_path / "outputs" / "train" / "slurm-31337"  # the default run dir: the job's
    assert [r["step"] for r in metrics(out)] == [0, 1, 2]
    log = (out / "train.log").read_text()  # before the ranks split their logs, all write here
    assert all(f"rank {r}/4 joined the gloo process group" in log for r in range(4))
    assert "on cpu x4" in log and "on cpu x4" in (out / "train.rank3.log").read_text()
    assert (out / "checkpoints" / "step_2").is_dir()
    assert not (tmp_path / "scontrol.calls").exists()  # a finished run requeues nothing


def _dry_sbatch(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The script up to srun (which only records): its command line and the environment it passes."""
    full = _fake_slurm(tmp_path)
    full.update(FAKE_SRUN_DRY="1", **env)
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if key not in env:
            full.pop(key, None)
    res = run_captured(["bash", str(SCRIPT), "trainer.steps=1"], tmp_path, full, timeout=60)
    return res, (tmp_path / "srun.calls.env").read_text().split()


def test_the_sockets_interface_is_the_one_holding_the_first_nodes_address(tmp_path: Path) -> None:
    res, seen = _dry_sbatch(tmp_path)  # the fake scontrol names localhost: 127.0.0.1 is on lo
    assert res.returncode == 0, res.stderr
    assert seen == ["GLOO_SOCKET_IFNAME=lo", "NCCL_SOCKET_IFNAME=lo"]
    assert "sockets on lo (gloo), lo (NCCL)" in res.stdout


def test_the_sockets_interface_can_be_named(tmp_path: Path) -> None:
    res, seen = _dry_sbatch(tmp_path, EXGRPO_SOCKET_IFNAME="ib0", NCCL_SOCKET_IFNAME="=mlx5_0")
    assert res.returncode == 0, res.stderr
    assert seen == ["GLOO_SOCKET_IFNAME=ib0", "NCCL_SOCKET_IFNAME==mlx5_0"]  # a variable set wins


def test_the_job_asks_for_the_nodes_memory() -> None:
    assert "#SBATCH --mem=0\n" in SCRIPT.read_text()
