"""Exact values of the eval metrics: unbiased pass@k, avg@n over grouped samples, averages."""

from fractions import Fraction

import pytest

from exgrpo_cli.evaluation.scoring import avg_at_n, group_averages, mean_pass_at_k, metric_name, pass_at_k


def test_pass_at_k_exact_values():
    assert pass_at_k(4, 2, 2) == 5 / 6  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c < k: every draw holds a correct sample
    assert pass_at_k(32, 1, 8) == float(
        1 - Fraction(31 * 30 * 29 * 28 * 27 * 26 * 25 * 24, 32 * 31 * 30 * 29 * 28 * 27 * 26 * 25)
    )  # = 8/32


@pytest.mark.parametrize("n,c", [(1, 0), (1, 1), (4, 1), (32, 7), (32, 32)])
def test_pass_at_1_is_the_share_correct(n: int, c: int):
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-15)


def test_pass_at_k_is_monotone_in_k():
    values = [pass_at_k(16, 3, k) for k in range(1, 17)]
    assert values == sorted(values) and values[-1] == 1.0


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_avg_at_n_on_repeated_rows():
    # two questions sampled 4 times (the grouped rows of an avg@4 file): (3/4 + 1/4) / 2
    assert avg_at_n([[1, 1, 1, 0], [0, 0, 1, 0]]) == 0.5
    # a question's mean first, then over questions: not the pooled share of samples
    assert avg_at_n([[1, 1, 1, 1], [0]]) == 0.5
    assert avg_at_n([[1.0], [0.0], [1.0], [1.0]]) == 0.75  # n=1: pass@1
    assert avg_at_n([]) == 0.0


def test_mean_pass_at_k():
    rows = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert mean_pass_at_k(rows, 2) == pytest.approx((5 / 6 + 0 + 1) / 3)
    assert mean_pass_at_k(rows, 1) == pytest.approx(avg_at_n(rows))
    assert mean_pass_at_k([[1, 0], [1]], 2) is None  # a question with fewer than k samples


def test_metric_names():
    assert metric_name(1) == "pass@1"
    assert metric_name(32) == "avg@32"


def test_group_averages_are_unweighted_means_over_present_benchmarks():
    scores = {"aime24": 0.2, "math500": 0.8, "arc_c": 0.5, "synthetic": 0.9}
    groups = {"aime24": "id", "math500": "id", "arc_c": "ood", "synthetic": "other"}
    avg = group_averages(scores, groups)
    assert avg["id"] == pytest.approx(0.5)
    assert avg["ood"] == pytest.approx(0.5)
    assert avg["all"] == pytest.approx((0.2 + 0.8 + 0.5 + 0.9) / 4)
    only_id = group_averages({"amc": 0.3}, {"amc": "id"})
    assert only_id == {"id": 0.3, "ood": None, "all": 0.3}
