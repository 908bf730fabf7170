"""Ranks simulated by threads in one process, for tests of what ranks exchange: `Exchange` stands in
for parallel/sharding.py's `all_gather_object`, `thread_world` for all three of its primitives (the
broadcast and the reduction through the same exchange), `run_ranks` runs one function per rank
concurrently and re-raises the first error in the calling thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from exgrpo_cli.parallel import sharding as S
from exgrpo_cli.parallel.sharding import DataParallel


class Exchange:
    """all_gather_object for W threads: each one's object, in rank order, for every thread."""

    def __init__(self, world: int) -> None:
        self.slots: list = [None] * world
        self.barrier = threading.Barrier(world, timeout=30)

    def __call__(self, obj: object, parallel: DataParallel) -> list:
        self.slots[parallel.rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read them
        return out


def thread_world(monkeypatch: pytest.MonkeyPatch, world: int) -> None:
    """parallel/sharding.py's primitives for `world` threads, each a rank."""
    gather = Exchange(world)
    reduce = {"mean": lambda v: sum(v) / world, "sum": sum, "max": max, "min": min}

    def all_reduce(values: dict[str, float], parallel: DataParallel, op: str = "mean") -> dict[str, float]:
        every = gather(dict(values), parallel)
        return {k: float(reduce[op]([v[k] for v in every])) for k in values}

    monkeypatch.setattr(S, "all_gather_object", gather)
    monkeypatch.setattr(S, "broadcast_object", lambda obj, ranks, src=0: gather(obj, ranks)[src])
    monkeypatch.setattr(S, "all_reduce_dict", all_reduce)


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
