"""parallel/sharding.py: which items are a rank's, and every rank's results put back together.

One process (nothing exchanged), two ranks simulated by threads exchanging objects (the step's
use: rewards and log-probs keyed by group), and two real gloo ranks (sharding_worker.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from policy.gloo_ranks import run_gloo_ranks
from thread_ranks import Exchange, run_ranks

from exgrpo_cli.parallel import sharding as S
from exgrpo_cli.parallel.sharding import DataParallel

WORKER = Path(__file__).resolve().parent / "sharding_worker.py"


def _ranks(world: int) -> list[DataParallel]:
    return [DataParallel(rank=r, world_size=world) for r in range(world)]


def test_the_shares_cover_every_item_once_and_rank_0_alone_takes_all() -> None:
    for n in (0, 1, 5, 8):
        shares = [s.mine(n) for s in _ranks(3)]
        assert sorted(i for share in shares for i in share) == list(range(n))
        assert max(map(len, shares)) == _ranks(3)[0].rounds(n)  # the calls every rank makes
    assert [s.mine(8) for s in _ranks(3)] == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert (
        DataParallel().mine(5) == [0, 1, 2, 3, 4]
        and DataParallel().rounds(5) == 5
        and DataParallel().done_after(2, 5) == 2
    )
    # after one item each, 3 ranks have done 3 of 8 items; after three, all 8
    assert [_ranks(3)[0].done_after(k, 8) for k in (1, 2, 3)] == [3, 6, 8]
    assert [s.seed(100) for s in _ranks(2)] == [100, 101] and DataParallel().seed(100) == 100


def test_one_process_exchanges_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_exchange(*args: object, **kwargs: object) -> None:
        raise AssertionError("a one-process run exchanged something")

    for name in ("all_gather_object", "broadcast_object", "all_reduce_dict"):
        monkeypatch.setattr(S, name, no_exchange)
    alone = DataParallel()
    merged = alone.merge({2: "b", 0: "a"}, timeouts=3)
    assert merged.items == {2: "b", 0: "a"} and merged.counts == {"timeouts": 3}
    assert alone.merge({1: "b", 0: "a"}).in_order(2) == ["a", "b"]
    with pytest.raises(RuntimeError, match=r"indices \[1\] of 3 \(1 missing\): a bug in how the work"):
        merged.in_order(3)  # item 1 never computed: a split bug, not a default
    assert alone.gather("x") == ["x"] and alone.from_main("mine") == "mine"
    assert alone.mean({"a": 2.0}) == {"a": 2.0} and alone.any(True) and not alone.any(False)
    assert alone.sum({"a": 2.0}) == {"a": 2.0} and alone.equal_calls(4) == 4
    assert alone.map(lambda share: [x * 2 for x in share], [1, 2, 3]) == [2, 4, 6]
    assert alone.main_first(lambda: "loaded") == "loaded"
    alone.barrier()

    def digest() -> str:
        raise AssertionError("digest computed with no rank to compare it with")

    alone.check_agree(digest, step=1)


def _on_threads(world: int, fn: Callable[[DataParallel], object]) -> list:
    return run_ranks(world, lambda r: fn(_ranks(world)[r]))


def test_two_ranks_map_their_shares_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """`map_counted`: one call of the work per rank on its share, the results in the items' order
    on every rank, the counts summed; a work that drops a result is refused."""
    monkeypatch.setattr(S, "all_gather_object", Exchange(2))
    calls: list[list[str]] = [[], []]

    def rank(s: DataParallel) -> tuple[list[str], dict[str, int]]:
        def work(share: list[str]) -> tuple[list[str], dict[str, int]]:
            calls[s.rank].append("".join(share))
            return [f"{x}@{s.rank}" for x in share], {"seen": len(share)}

        return s.map_counted(work, list("abcde"))

    got = _on_threads(2, rank)
    assert got[0] == got[1] == (["a@0", "b@1", "c@0", "d@1", "e@0"], {"seen": 5})
    assert calls == [["ace"], ["bd"]]
    with pytest.raises(RuntimeError, match="a share of 3 items gave 2 results"):
        DataParallel().map(lambda share: share[:2], [1, 2, 3])


def test_the_equal_call_rule_asks_the_most_any_rank_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    def most(values: dict[str, float], parallel: DataParallel, op: str = "mean") -> dict[str, float]:
        assert op == "max"
        return {k: max(v, 7.0) for k, v in values.items()}  # the other rank needs 7 calls

    monkeypatch.setattr(S, "all_reduce_dict", most)
    assert DataParallel(rank=1, world_size=2).equal_calls(3) == 7
    assert DataParallel(rank=1, world_size=2).equal_calls(9) == 9


def test_a_result_two_ranks_return_is_a_split_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "all_gather_object", Exchange(2))
    with pytest.raises(RuntimeError, match="rank 1 returned results another rank returned too"):
        _on_threads(2, lambda s: s.merge({(0, 1): s.rank}))


def test_diverged_digests_stop_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "all_gather_object", Exchange(2))
    _on_threads(2, lambda s: s.check_agree(lambda: "same", step=3))
    monkeypatch.setattr(S, "all_gather_object", Exchange(2))
    with pytest.raises(RuntimeError, match=r"step 4: .* diverged \(digest per rank: \['0', '1'\]\)"):
        _on_threads(2, lambda s: s.check_agree(lambda: str(s.rank), step=4))


@pytest.mark.slow
def test_two_gloo_ranks(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    run_gloo_ranks(str(WORKER), str(out))
    r = json.loads(out.read_text())
    assert r["world_size"] == 2
    assert r["mine"] == [[0, 2, 4, 6], [1, 3, 5]] and r["rounds"] == 4
    assert r["in_order"] == [f"item {i} by rank {i % 2}" for i in range(7)]
    assert r["counts"] == {"done": 7}
    assert r["mean"] == {"x": 0.5} and r["max"] == {"x": 1.0}
    assert r["any"] == [True, False] and r["from_main"] == "rank 0's" and r["seeds"] == [100, 101]
    assert r["equal_calls"] == 4 and r["sum"] == {"x": 3.0} and r["main_first"] == 0
    assert r["map"] == ["a@0", "b@1", "c@0", "d@1", "e@0"] and r["filled"] == [[0.0, 0.0], [0.0, 0.0]]
