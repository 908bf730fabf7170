"""Benchmark scores from graded samples: unbiased pass@k, avg@n, and the paper's averages.

Where it sits: the last step of `exgrpo eval` (and of a regrade), after every sample has been
graded 0/1. Pure functions on plain lists, tested with exact values.

- avg@n: the mean over questions of each question's share of correct samples (the paper's
  avg@32 for AIME24/25 and AMC); with one sample per question it is pass@1.
- pass@k: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k) per question,
  averaged over questions; it needs k <= n for every question.
- averages: unweighted means over the benchmarks present, per group (ID, OOD) and over all, as in
  the paper's tables (docs/algorithm.md §8).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n samples, c of
    them correct, is correct. Exact (rational) arithmetic, rounded once."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return float(1 - Fraction(comb(n - c, k), comb(n, k)))


def _counts(correct: Sequence[Sequence[float]], correct_at: float | None = None) -> list[tuple[int, int]]:
    """(samples, correct samples) per question; a reward >= `correct_at` (reward.correct_at)
    counts as correct, or above 0.5 without one (0/1 rewards)."""
    if correct_at is None:
        return [(len(row), sum(1 for x in row if x > 0.5)) for row in correct]
    return [(len(row), sum(1 for x in row if x >= correct_at)) for row in correct]


def avg_at_n(correct: Sequence[Sequence[float]], correct_at: float | None = None) -> float:
    """Mean over questions of the per-question accuracy; 0.0 for no questions."""
    counts = [(n, c) for n, c in _counts(correct, correct_at) if n > 0]
    if not counts:
        return 0.0
    return sum(c / n for n, c in counts) / len(counts)


def mean_pass_at_k(
    correct: Sequence[Sequence[float]], k: int, correct_at: float | None = None
) -> float | None:
    """pass@k averaged over questions; None when some question has fewer than k samples."""
    counts = _counts(correct, correct_at)
    if not counts or any(n < k for n, _ in counts):
        return None
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def metric_name(samples_per_question: int) -> str:
    """The paper's name for the headline metric: pass@1 with one sample, else avg@n."""
    return "pass@1" if samples_per_question == 1 else f"avg@{samples_per_question}"


def group_averages(scores: Mapping[str, float], groups: Mapping[str, str]) -> dict[str, float | None]:
    """Unweighted means of `scores` (benchmark -> score) for the ID group, the OOD group and all
    benchmarks; None for a group with no benchmark present. `groups` maps benchmark -> "id" |
    "ood" | anything else (counted in "all" only)."""

    def mean(names: list[str]) -> float | None:
        return sum(scores[b] for b in names) / len(names) if names else None

    return {
        "id": mean([b for b in scores if groups.get(b) == "id"]),
        "ood": mean([b for b in scores if groups.get(b) == "ood"]),
        "all": mean(list(scores)),
    }
