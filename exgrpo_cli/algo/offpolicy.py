"""How far a batch's tokens are off-policy: pure maths on per-token log-probs (docs/off-policy.md).

Two sources, measured with the same three figures. For a token sampled from a behaviour policy b
and scored by a target policy p, with d = log p - log b and r = exp(d):
- mean |d| (nats per token): `rollout/logprob_diff_mean` for fresh rows;
- the k3 estimate of KL(b || p), r - 1 - log r per token: never negative, unbiased, and second
  order in d for small gaps (d^2 / 2), so it separates kernel noise from a real difference;
- the share of tokens with r outside [1/2, 2] (|d| > log 2): what a correction would cut.

Fresh rows: b = the rollout engine, p = the trainer's pi_old (the engine-vs-trainer mismatch).
Replayed rows: b = the stored log-probs of the collection step, p = pi_old of this step (the
staleness; r is then the importance weight w of the step's first update). Where it sits in the
step: step/offpolicy.py calls these once per update, after the first mini-batch's forward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Self

import numpy as np

# exp() beyond this overflows; as algo/losses.py's MAX_LOG_RATIO (kept apart: no torch import here)
MAX_LOG_RATIO = 20.0
RATIO_BAND = (0.5, 2.0)  # a token whose ratio leaves it counts in the `_ratio_outside` share

# Age bands of replayed rows (steps since collection, >= 1). Async trainers cap a sample's age at
# 1 (NeMo-RL), 4 (TRL) or 8 (verl, prime-rl) policy versions: 1-2 is as fresh as replay gets,
# 3-8 is what those trainers still accept, 9-32 and 33+ are beyond any cap, where ExGRPO relies on
# f(w) alone. Powers of two-ish, so a run of any length fills a few of them.
AGE_BANDS: tuple[tuple[str, int, int | None], ...] = (
    ("1-2", 1, 2),
    ("3-8", 3, 8),
    ("9-32", 9, 32),
    ("33+", 33, None),
)


@dataclass
class TokenSums:
    """Token sums that add up field by field (`+=`): GapSums, LossStats, CorrectionStats."""

    def __iadd__(self, other: Self) -> Self:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self


@dataclass
class GapSums(TokenSums):
    """Token sums behind the three figures of one source; add them up over rows and ranks."""

    abs_sum: float = 0.0  # sum of |d|
    k3_sum: float = 0.0  # sum of r - 1 - log r
    outside: float = 0.0  # tokens with r outside RATIO_BAND
    tokens: float = 0.0

    def as_dict(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}{f.name}": float(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, float], prefix: str) -> GapSums:
        return cls(**{f.name: d[f"{prefix}{f.name}"] for f in fields(cls)})

    def figures(self) -> tuple[float, float, float]:
        """(mean |d|, mean k3, share outside the band); NaN each without tokens."""
        if not self.tokens:
            return math.nan, math.nan, math.nan
        return self.abs_sum / self.tokens, self.k3_sum / self.tokens, self.outside / self.tokens


def log_ratios(target: Sequence[float], behaviour: Sequence[float]) -> np.ndarray:
    """d = target - behaviour per token (float64), capped at +-MAX_LOG_RATIO."""
    d = np.subtract(np.asarray(target, dtype=np.float64), np.asarray(behaviour, dtype=np.float64))
    return np.clip(d, -MAX_LOG_RATIO, MAX_LOG_RATIO)


def gap_sums(target: Sequence[float], behaviour: Sequence[float]) -> GapSums:
    """The three figures' sums over one row's tokens (equal lengths)."""
    d = log_ratios(target, behaviour)
    lo, hi = math.log(RATIO_BAND[0]), math.log(RATIO_BAND[1])
    # expm1(d) - d is r - 1 - log r without the cancellation of exp(d) - 1 - d at tiny d
    return GapSums(
        abs_sum=float(np.abs(d).sum()),
        k3_sum=float((np.expm1(d) - d).sum()),
        outside=float(((d < lo) | (d > hi)).sum()),
        tokens=float(d.size),
    )


def age_band(age: int) -> str:
    """The name of the band (AGE_BANDS) an age of >= 1 step falls in; ages below 1 (a response
    replayed at the step that collected it cannot happen) join the first band."""
    for name, _, hi in AGE_BANDS:
        if hi is None or age <= hi:
            return name
    raise AssertionError("the last band is open")


def shaped(w: np.ndarray, beta: float | None) -> np.ndarray:
    """f(w) = w / (w + beta), or w without shaping (as algo/losses.py's policy_shaping)."""
    return w / (w + beta) if beta is not None else w


def age_summary(ages: Sequence[int]) -> dict[str, float]:
    """`replay/age_mean`, `_p50`, `_p90`, `_max` of the replayed rows' ages (NaN without any)."""
    if not len(ages):
        return {f"replay/age_{k}": math.nan for k in ("mean", "p50", "p90", "max")}
    a = np.asarray(ages, dtype=np.float64)
    p50, p90 = np.percentile(a, [50, 90])
    return {
        "replay/age_mean": float(a.mean()),
        "replay/age_p50": float(p50),
        "replay/age_p90": float(p90),
        "replay/age_max": float(a.max()),
    }
