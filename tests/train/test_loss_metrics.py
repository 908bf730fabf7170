"""The update's per-token metrics are run-wide token averages, not means of per-rank ratios.

Two ranks are simulated by two threads exchanging their dicts (tests/thread_ranks.py), so
`loss_metrics` runs as under torchrun without a process group.
"""

from __future__ import annotations

import math

import pytest
from thread_ranks import run_ranks, thread_world

from exgrpo_cli.algo.losses import LossStats
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.step import metrics
from exgrpo_cli.step.update import UpdateResult

# rank 0 replays nothing; rank 1 has three times the fresh tokens, and replays
RANKS = [
    UpdateResult(stats=LossStats(fresh_tokens=10, clipped_tokens=1), entropy_sum=5.0, logprob_diff_sum=1.0),
    UpdateResult(
        stats=LossStats(fresh_tokens=30, replay_tokens=4, clipped_tokens=9, replay_ratio_sum=6.0),
        entropy_sum=39.0,
        logprob_diff_sum=3.0,
    ),
]


def test_two_ranks_weigh_every_token_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    thread_world(monkeypatch, 2)
    out = run_ranks(2, lambda r: metrics.loss_metrics(RANKS[r], 1e-6, DataParallel(rank=r, world_size=2)))
    keys = ("loss/clip_fraction", "loss/importance_weight_mean", "loss/entropy", "rollout/logprob_diff_mean")
    assert [out[0][k] for k in keys] == [out[1][k] for k in keys]  # every rank holds the run's values
    m = out[0]
    assert m["loss/clip_fraction"] == 10 / 40  # the per-rank mean would be (0.1 + 0.3) / 2
    assert m["loss/importance_weight_mean"] == 6.0 / 4  # rank 0's alone would be NaN
    assert m["loss/entropy"] == 44.0 / 44
    assert m["rollout/logprob_diff_mean"] == 4.0 / 40


def test_one_rank_keeps_its_own_ratios() -> None:
    m = metrics.loss_metrics(RANKS[1], 1e-6)
    assert m["loss/clip_fraction"] == 9 / 30 and m["loss/importance_weight_mean"] == 6.0 / 4
    assert m["loss/entropy"] == 39.0 / 34 and m["rollout/logprob_diff_mean"] == 3.0 / 30
    assert math.isnan(metrics.loss_metrics(RANKS[0], 1e-6)["loss/importance_weight_mean"])
