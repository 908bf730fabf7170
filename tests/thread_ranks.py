"""Ranks simulated by threads in one process, for tests of what ranks exchange: `Exchange` stands in
for `policy.distributed.all_gather_object` (monkeypatched there), `run_ranks` runs one function per
rank concurrently and re-raises the first error in the calling thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

from exgrpo_cli.policy.sharding import DataParallel


class Exchange:
    """all_gather_object for W threads: each one's object, in rank order, for every thread."""

    def __init__(self, world: int) -> None:
        self.slots: list = [None] * world
        self.barrier = threading.Barrier(world, timeout=30)

    def __call__(self, obj: object, dist: DataParallel) -> list:
        self.slots[dist.rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read them
        return out


def run_ranks(world: int, fn: Callable[[int], object]) -> list:
    """fn(rank) for every rank, on its own thread; their results in rank order."""
    results: list = [None] * world
    errors: list = []

    def work(r: int) -> None:
        try:
            results[r] = fn(r)
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results
