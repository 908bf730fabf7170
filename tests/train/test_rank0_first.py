"""Only rank 0 downloads (a hub dataset or tokenizer); the others wait and read its copy."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from thread_ranks import thread_world

from exgrpo_cli.errors import UsageError
from exgrpo_cli.policy.sharding import DataParallel


def _two_ranks(load: Any) -> list[Any]:
    out: list[Any] = [None, None]

    def work(rank: int) -> None:
        try:
            out[rank] = DataParallel(rank=rank, world_size=2).main_first(lambda: load(rank))
        except Exception as err:  # noqa: BLE001 - compared below
            out[rank] = err

    threads = [threading.Thread(target=work, args=(r,)) for r in (1, 0)]  # rank 1 starts first
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return out


def test_rank0_loads_first_then_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    thread_world(monkeypatch, 2)
    order: list[int] = []

    def load(rank: int) -> str:
        if rank == 0:
            time.sleep(0.3)  # a download: rank 1 must not start before it ends
        order.append(rank)
        return f"copy {rank}"

    assert _two_ranks(load) == ["copy 0", "copy 1"] and order == [0, 1]


def test_rank0s_failure_is_every_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    thread_world(monkeypatch, 2)
    tried: list[int] = []

    def load(rank: int) -> None:
        tried.append(rank)
        raise OSError("hub unreachable")

    r0, r1 = _two_ranks(load)
    assert isinstance(r0, OSError) and isinstance(r1, UsageError) and "hub unreachable" in str(r1)
    assert tried == [0]  # rank 1 never tried
