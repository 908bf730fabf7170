"""One rank of the 2-rank check of policy/sharding.py, launched by tests/policy/test_sharding.py
under torchrun (gloo, CPU): `python sharding_worker.py OUT_JSON`. Every rank works out its share of
7 items, the shares are merged, scalars reduced, rank 0's value shared and the digests checked
(first equal, then different), then an item claimed twice and an item nobody returns; rank 0
writes what it got to OUT_JSON."""

from __future__ import annotations

import json
import sys

import torch

from exgrpo_cli.policy import distributed as D


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
    dist.check_agree(lambda: "same", step=1)
    try:
        dist.check_agree(lambda: f"rank {dist.rank}", step=2)
        report["diverged"] = "not detected"
    except RuntimeError as err:
        report["diverged"] = str(err)
    try:
        dist.merge({0: dist.rank})  # both ranks claim item 0
        report["claimed_twice"] = "not detected"
    except RuntimeError as err:
        report["claimed_twice"] = str(err)
    try:
        dist.merge({i: dist.rank for i in mine if i != 5}).in_order(7)  # nobody returns item 5
        report["gap"] = "not detected"
    except RuntimeError as err:
        report["gap"] = str(err)
    if dist.is_main:
        with open(out, "w") as f:
            json.dump(report, f)
    D.close_distributed()


if __name__ == "__main__":
    main(sys.argv[1])
