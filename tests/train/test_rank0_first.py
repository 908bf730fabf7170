"""Only rank 0 downloads (a hub dataset or tokenizer); the others wait and read its copy."""

from __future__ import annotations

import time
from typing import Any

import pytest
from thread_ranks import run_ranks, thread_world

from exgrpo_cli.errors import UsageError
from exgrpo_cli.parallel.sharding import DataParallel


def _two_ranks(load: Any) -> list[Any]:
    def rank(r: int) -> Any:
        try:
            return DataParallel(rank=r, world_size=2).main_first(lambda: load(r))
        except Exception as err:  # noqa: BLE001 - compared below
            return err

    return run_ranks(2, rank)


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
