"""The off-policy figures (algo/offpolicy.py) and the rollout correction's weights
(algo/rollout_correction.py) against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from exgrpo_cli.algo.offpolicy import AGE_BANDS, age_band, age_summary, gap_sums
from exgrpo_cli.algo.rollout_correction import RolloutCorrection, correction_stats, correction_weights


def test_gap_sums_by_hand() -> None:
    # d = target - behaviour: 0, log 3 (r = 3, outside [0.5, 2]), -log 4 (r = 1/4, outside), 0.1
    target = [-1.0, math.log(3.0) - 2.0, -math.log(4.0) - 0.5, -0.9]
    behaviour = [-1.0, -2.0, -0.5, -1.0]
    s = gap_sums(target, behaviour)
    assert s.tokens == 4 and s.outside == 2
    assert s.abs_sum == pytest.approx(math.log(3) + math.log(4) + 0.1)
    k3 = [0.0, 3 - 1 - math.log(3), 0.25 - 1 + math.log(4), math.exp(0.1) - 1 - 0.1]
    assert s.k3_sum == pytest.approx(sum(k3))
    diff, mean_k3, outside = s.figures()
    assert (diff, mean_k3, outside) == pytest.approx((s.abs_sum / 4, sum(k3) / 4, 0.5))
    assert all(math.isnan(x) for x in gap_sums([], []).figures())


def test_k3_is_second_order_and_never_negative_for_tiny_gaps() -> None:
    # fp32 rounding noise (1e-7 nats) must not read as a mismatch: k3 ~ d^2 / 2, not cancelled to < 0
    s = gap_sums([1e-7, -1e-7], [0.0, 0.0])
    assert 0 <= s.k3_sum == pytest.approx(1e-14, rel=1e-3)


def test_age_bands_cover_every_age() -> None:
    assert [age_band(a) for a in (1, 2, 3, 8, 9, 32, 33, 500)] == [
        "1-2", "1-2", "3-8", "3-8", "9-32", "9-32", "33+", "33+"
    ]  # fmt: skip
    assert [b[0] for b in AGE_BANDS] == ["1-2", "3-8", "9-32", "33+"]


def test_age_summary() -> None:
    m = age_summary([1, 2, 3, 10])
    assert m["replay/age_mean"] == 4.0 and m["replay/age_max"] == 10.0
    assert m["replay/age_p50"] == 2.5 and m["replay/age_p90"] == pytest.approx(7.9)
    assert all(math.isnan(v) for v in age_summary([]).values())


def _rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three fresh rows and one replayed, pi_old - pi_engine per token shifted by hand."""
    old = torch.zeros(4, 3)
    shift = torch.tensor(
        [
            [1.0, 0.0, -1.0],  # r = e (capped at 2), 1, 1/e; geometric mean 1: kept
            [0.005, 0.005, 0.0],  # r ~ 1.005, 1.005, pad: geometric mean e^0.005 = 1.005: kept
            [0.02, 0.02, 0.02],  # geometric mean e^0.02 = 1.0202 > 1.01: dropped
            [3.0, 3.0, 3.0],  # replayed: left alone
        ]
    )
    engine = old - shift
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
    replay = torch.tensor([False, False, False, True])
    return old, engine, mask, replay


def test_token_tis_weights_by_hand() -> None:
    old, engine, mask, replay = _rows()
    w, cut = correction_weights(RolloutCorrection("token_tis", cap=2.0), old, engine, mask, replay)
    e = math.exp
    want = [[2.0, 1.0, e(-1)], [e(0.005), e(0.005), 1.0], [e(0.02)] * 3, [1.0] * 3]
    assert torch.allclose(w, torch.tensor(want), atol=1e-6)
    assert cut.tolist() == [[True, False, False], [False] * 3, [False] * 3, [False] * 3]
    s = correction_stats(w, cut, mask, replay)
    assert s.tokens == 8 and s.cut == 1
    assert s.weight_sum == pytest.approx(2 + 1 + e(-1) + 2 * e(0.005) + 3 * e(0.02), rel=1e-6)


def test_geo_mask_drops_whole_sequences_outside_the_band() -> None:
    old, engine, mask, replay = _rows()
    w, cut = correction_weights(RolloutCorrection("geo_mask", low=0.99, high=1.01), old, engine, mask, replay)
    assert w.tolist() == [[1.0] * 3, [1.0] * 3, [0.0] * 3, [1.0] * 3]
    assert cut.sum() == 3 and cut[2].all()
    # a narrower band drops the second row too (1.005 > 1.004); padding is never cut
    w, cut = correction_weights(
        RolloutCorrection("geo_mask", low=0.99, high=1.004), old, engine, mask, replay
    )
    assert w[1].tolist() == [0.0, 0.0, 1.0] and cut.sum() == 5


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="token_tis"):
        RolloutCorrection("product")
