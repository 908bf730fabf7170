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
    env["EXGRPO_SOCKET_IFNAME"] = "lo"  # every "node" is this host: the script takes no loopback itself
    res = run_captured(
        ["bash", str(SCRIPT), "trainer.device=cpu", "trainer.steps=2", *SMALL_RUN], tmp_path, env, 900
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    srun = (tmp_path / "srun.calls").read_text()
    assert "--ntasks-per-node=1 --nodes=2" in srun  # one torchrun per node
    # the ranks of both "nodes" (one host: loopback is right here, and named) met over gloo on it
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


def test_a_loopback_address_is_never_the_sockets_interface(tmp_path: Path) -> None:
    res, seen = _dry_sbatch(tmp_path)  # the fake scontrol names localhost for each node: 127.0.0.1
    assert res.returncode == 0, res.stderr
    assert seen == ["GLOO_SOCKET_IFNAME=", "NCCL_SOCKET_IFNAME="]  # nothing exported: lo would hang
    assert "no interface found that reaches the other nodes" in res.stderr


# stand-ins for glibc's getent (ahostsv4, from a hosts file) and iproute2's `ip -o -4` (addr show,
# route get), printing what they print, for a node with a docker bridge, an Ethernet management
# network and InfiniBand, whose other nodes are on 10.1.0.0/16 (ib0)
FAKE_GETENT = """#!/bin/bash
[[ $1 == ahostsv4 ]] || exit 2
found=0
while read -r addr names; do
  for n in $names; do
    if [[ $n == "$2" ]]; then
      printf '%-15s STREAM %s\\n%-15s DGRAM  \\n%-15s RAW    \\n' "$addr" "$2" "$addr" "$addr"
      found=1
      break 2
    fi
  done
done < "{hosts}"
[[ $found == 1 ]] || exit 2
"""
FAKE_IP = r"""#!/bin/bash
args="$*"
life='\       valid_lft forever preferred_lft forever'
if [[ $args == "-o -4 addr show" ]]; then
  echo "1: lo    inet 127.0.0.1/8 scope host lo$life"
  echo "2: eth0    inet 192.168.7.11/24 brd 192.168.7.255 scope global eth0$life"
  echo "3: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0$life"
  echo "4: ib0    inet 10.1.0.1/16 brd 10.1.255.255 scope global ib0$life"
elif [[ $args == "-o -4 route get "* ]]; then
  a=${args##* }
  case $a in
    127.*) echo "local $a dev lo table local src 127.0.0.1 uid 1000 \    cache <local> " ;;
    10.1.0.1) echo "local $a dev lo table local src 10.1.0.1 uid 1000 \    cache <local> " ;;
    10.1.*) echo "$a dev ib0 src 10.1.0.1 uid 1000 \    cache " ;;
    *) echo "$a via 192.168.7.1 dev eth0 src 192.168.7.11 uid 1000 \    cache " ;;
  esac
else
  exit 1
fi
"""
NAMED_SCONTROL = """#!/bin/bash
if [[ $1 == show && $2 == hostnames ]]; then
  for ((i = 1; i <= SLURM_JOB_NUM_NODES; i++)); do echo "node$i"; done
fi
"""


def _named_nodes(tmp_path: Path, hosts: str, nodes: int = 2) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "netbin"
    bin_dir.mkdir(parents=True)
    (tmp_path / "hosts").write_text(hosts)
    for name, text in (
        ("getent", FAKE_GETENT.format(hosts=tmp_path / "hosts")),
        ("ip", FAKE_IP),
        ("scontrol", NAMED_SCONTROL),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = _fake_slurm(tmp_path)
    env.update(FAKE_SRUN_DRY="1", SLURM_JOB_NUM_NODES=str(nodes), PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "EXGRPO_SOCKET_IFNAME"):
        env.pop(key, None)
    res = run_captured(["bash", str(SCRIPT), "trainer.steps=1"], tmp_path, env, timeout=60)
    return res, (tmp_path / "srun.calls.env").read_text().split()


@pytest.mark.parametrize("own", ["127.0.1.1", "127.0.0.1"])  # Debian's /etc/hosts line; a plain one
def test_the_sockets_interface_is_the_route_to_another_node(tmp_path: Path, own: str) -> None:
    """The first node's hostname resolves to loopback in its /etc/hosts: the interface is the one of
    its route to the second node (ib0), not lo (the old choice with 127.0.0.1: every node bound its
    loopback) nor none (127.0.1.1, held by no interface: gloo fell back to the hostname's)."""
    res, seen = _named_nodes(tmp_path, f"{own} node1 node1.cluster\n10.1.0.2 node2\n")
    assert res.returncode == 0, res.stderr
    assert seen == ["GLOO_SOCKET_IFNAME=ib0", "NCCL_SOCKET_IFNAME=ib0"]
    assert "sockets on ib0 (gloo), ib0 (NCCL)" in res.stdout


def test_one_node_takes_the_interface_holding_its_own_address(tmp_path: Path) -> None:
    res, seen = _named_nodes(tmp_path, "10.1.0.1 node1\n", nodes=1)
    assert res.returncode == 0, res.stderr
    assert seen == ["GLOO_SOCKET_IFNAME=ib0", "NCCL_SOCKET_IFNAME=ib0"]
    res, seen = _named_nodes(tmp_path / "loop", "127.0.1.1 node1\n", nodes=1)
    assert seen == ["GLOO_SOCKET_IFNAME=", "NCCL_SOCKET_IFNAME="]  # loopback: left to gloo and NCCL


def test_the_sockets_interface_can_be_named(tmp_path: Path) -> None:
    res, seen = _dry_sbatch(tmp_path, EXGRPO_SOCKET_IFNAME="ib0", NCCL_SOCKET_IFNAME="=mlx5_0")
    assert res.returncode == 0, res.stderr
    assert seen == ["GLOO_SOCKET_IFNAME=ib0", "NCCL_SOCKET_IFNAME==mlx5_0"]  # a variable set wins


def test_the_job_asks_for_the_nodes_memory() -> None:
    assert "#SBATCH --mem=0\n" in SCRIPT.read_text()
