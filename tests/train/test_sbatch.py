"""scripts/slurm/train.sbatch under a faked SLURM (issue #23 point 3): `srun` and `scontrol` are
stand-ins on PATH (srun starts the script's per-node command once per "node", all on this host;
scontrol names the nodes), everything after them is real: the script's torchrun command line,
two torchruns meeting at the c10d rendezvous it composes, 2 nodes x 2 gloo ranks training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SMALL_RUN, cli_env

SCRIPT = REPO / "scripts" / "slurm" / "train.sbatch"

FAKE_SRUN = """#!/bin/bash
# stand-in for srun: the command once per node of the job, all on this host
echo "$@" >> "{log}"
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
        EXGRPO_RDZV_PORT=str(_free_port()),
    )
    return env


def _free_port() -> int:
    from exgrpo_cli.policy.distributed import free_port

    return free_port()


@pytest.mark.slow
def test_two_nodes_of_two_ranks_from_the_sbatch_script(tiny_model: Path, tmp_path: Path) -> None:
    env = _fake_slurm(tmp_path)
    res = subprocess.run(
        ["bash", str(SCRIPT), "trainer.device=cpu", "trainer.steps=2", *SMALL_RUN],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    srun = (tmp_path / "srun.calls").read_text()
    assert "--ntasks-per-node=1 --nodes=2" in srun  # one torchrun per node
    assert "--nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d" in srun
    assert f"--rdzv-endpoint=localhost:{env['EXGRPO_RDZV_PORT']}" in srun
    out = tmp_path / "outputs" / "train" / "slurm-31337"  # the default run dir: the job's
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]
    log = (out / "train.log").read_text()  # before the ranks split their logs, all write here
    assert all(f"rank {r}/4 joined the gloo process group" in log for r in range(4))
    assert "on cpu x4" in log and "on cpu x4" in (out / "train.rank3.log").read_text()
    assert (out / "checkpoints" / "step_2").is_dir()
    assert not (tmp_path / "scontrol.calls").exists()  # a finished run requeues nothing
