"""One rank of the 2-rank check of parallel/sharding.py, launched by tests/policy/test_sharding.py
under torchrun (gloo, CPU): `python sharding_worker.py OUT_JSON`. Every rank works out its share of
7 items, the shares are merged, scalars reduced and rank 0's value shared over gloo; rank 0
writes what it got to OUT_JSON. What the ranks do with a wrong split or diverged digests is plain
Python over the gathered objects, checked in test_sharding.py (threads for ranks)."""

from __future__ import annotations

import json
import sys

import torch

from exgrpo_cli.parallel import fsdp as D


def main(out: str) -> None:
    dist = D.init_distributed(timeout_s=60, device="cpu")
    mine = dist.mine(7)
    merged = dist.merge({i: f"item {i} by rank {dist.rank}" for i in mine}, done=len(mine))
    report = {
        "world_size": dist.world_size,
        "mine": dist.gather(mine),
        "rounds": dist.rounds(7),
        "in_order": merged.in_order(7),
        "counts": merged.counts,
        "mean": dist.mean({"x": float(dist.rank)}),
        "max": dist.max({"x": float(dist.rank)}),
        "any": [dist.any(dist.rank == 1), dist.any(False)],
        "from_main": dist.from_main(f"rank {dist.rank}'s"),
        "seeds": dist.gather(dist.seed(100)),
        "equal_calls": dist.equal_calls(3 + dist.rank),
        "map": dist.map(lambda share: [f"{x}@{dist.rank}" for x in share], list("abcde")),
        "sum": dist.sum({"x": float(dist.rank + 1)}),
        "main_first": dist.main_first(lambda: dist.rank),
    }
    tensor = torch.full((2,), float(dist.rank))
    dist.fill_from_main(tensor)
    report["filled"] = dist.gather(tensor.tolist())
    dist.barrier()
    if dist.is_main:
        with open(out, "w") as f:
            json.dump(report, f)
    D.close_distributed()


if __name__ == "__main__":
    main(sys.argv[1])
