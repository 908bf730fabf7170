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
from exgrpo_cli.parallel.process_end import ends_without_teardown


def main(out: str) -> None:
    parallel = D.init_distributed(timeout_s=60, device="cpu")
    mine = parallel.mine(7)
    merged = parallel.merge({i: f"item {i} by rank {parallel.rank}" for i in mine}, done=len(mine))
    report = {
        "world_size": parallel.world_size,
        "mine": parallel.gather(mine),
        "rounds": parallel.rounds(7),
        "in_order": merged.in_order(7),
        "counts": merged.counts,
        "mean": parallel.mean({"x": float(parallel.rank)}),
        "max": parallel.max({"x": float(parallel.rank)}),
        "any": [parallel.any(parallel.rank == 1), parallel.any(False)],
        "from_main": parallel.from_main(f"rank {parallel.rank}'s"),
        "seeds": parallel.gather(parallel.seed(100)),
        "equal_calls": parallel.equal_calls(3 + parallel.rank),
        "map": parallel.map(lambda share: [f"{x}@{parallel.rank}" for x in share], list("abcde")),
        "sum": parallel.sum({"x": float(parallel.rank + 1)}),
        "main_first": parallel.main_first(lambda: parallel.rank),
    }
    tensor = torch.full((2,), float(parallel.rank))
    parallel.fill_from_main(tensor)
    report["filled"] = parallel.gather(tensor.tolist())
    parallel.barrier()
    if parallel.is_main:
        with open(out, "w") as f:
            json.dump(report, f)
    D.close_distributed()


if __name__ == "__main__":
    with ends_without_teardown():  # no race with gloo's threads at exit
        main(sys.argv[1])
