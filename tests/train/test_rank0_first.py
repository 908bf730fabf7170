"""Only rank 0 downloads (a hub dataset or tokenizer); the others wait and read its copy."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from exgrpo_cli.errors import UsageError
from exgrpo_cli.policy import sharding as S
from exgrpo_cli.policy.sharding import DataParallel


class Broadcast:
    """broadcast_object for two threads: rank 0's object reaches rank 1."""

    def __init__(self) -> None:
        self.box: list[Any] = []
        self.ready = threading.Event()

    def __call__(self, obj: Any, dist: DataParallel, src: int = 0) -> Any:
        if dist.rank == 0:
            self.box.append(obj)
            self.ready.set()
            return obj
        assert self.ready.wait(10)
        return self.box[0]


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
    monkeypatch.setattr(S, "broadcast_object", Broadcast())
    order: list[int] = []

    def load(rank: int) -> str:
        if rank == 0:
            time.sleep(0.3)  # a download: rank 1 must not start before it ends
        order.append(rank)
        return f"copy {rank}"

    assert _two_ranks(load) == ["copy 0", "copy 1"] and order == [0, 1]


def test_rank0s_failure_is_every_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "broadcast_object", Broadcast())
    tried: list[int] = []

    def load(rank: int) -> None:
        tried.append(rank)
        raise OSError("hub unreachable")

    r0, r1 = _two_ranks(load)
    assert isinstance(r0, OSError) and isinstance(r1, UsageError) and "hub unreachable" in str(r1)
    assert tried == [0]  # rank 1 never tried
