"""The step's off-policy figures: engine mismatch of fresh rows, staleness and age of replayed
rows, the rollout correction's cut, and the warning band before `rollout.max_logprob_diff`.

Where it sits in the train step: `offpolicy_sums` runs inside the update (step/update.py), once,
after the first mini-batch's forward, when the trainer has pi_old's log-probs of every row; the
engine check (step/divergence.py) reads its fresh-row sums. `offpolicy_metrics` turns the sums
into metrics at the end of the step (a collective: the ranks' token sums are added first), and
`MismatchWatch` reads the run-wide gap to warn before the stop. The maths is algo/offpolicy.py's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from exgrpo_cli.algo.offpolicy import AGE_BANDS, GapSums, age_band, age_summary, gap_sums, log_ratios, shaped
from exgrpo_cli.algo.rollout_correction import CorrectionStats, RolloutCorrection
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.replay.mixing import MixedBatch
from exgrpo_cli.step.divergence import nucleus_slack

if TYPE_CHECKING:
    from exgrpo_cli.config.schema import ExgrpoConfig

# the trend alarm ignores rises smaller than this over its window: 0.005 nats/token is the low end
# of a healthy bf16 engine's gap, so a smaller rise is rounding noise (an fp32 CPU run's gap
# wanders around 1e-7 and would otherwise "keep rising" by chance)
TREND_MIN_RISE = 0.005


@dataclass
class OffPolicySums:
    """Token sums of one rank's batch (add over ranks, then divide)."""

    mismatch: GapSums = field(default_factory=GapSums)  # fresh rows: trainer pi_old vs engine
    staleness: GapSums = field(default_factory=GapSums)  # replayed rows: pi_old vs stored
    # band -> [sum of w, sum of f(w), tokens] over replayed tokens, w = pi_old / stored
    bands: dict[str, list[float]] = field(default_factory=lambda: {b[0]: [0.0, 0.0, 0.0] for b in AGE_BANDS})


def offpolicy_sums(
    trainer_logp: Mapping[int, Sequence[float]], batch: MixedBatch, beta: float | None
) -> OffPolicySums:
    """The sums over this rank's rows that have both log-probs; `trainer_logp` holds pi_old's
    log-probs of the rows, `batch.behavior_logp` the engine's (fresh) or the stored ones
    (replayed), `batch.ages` the replayed rows' ages, `beta` the shaping of f(w) (None: f(w) = w)."""
    out = OffPolicySums()
    for i, mine in trainer_logp.items():
        other = batch.behavior_logp[i]
        if not other:
            continue
        if not bool(batch.replay_mask[i]):
            out.mismatch += gap_sums(mine, other)
            continue
        out.staleness += gap_sums(mine, other)
        age = batch.ages[i] if i < len(batch.ages) else None
        if age is not None:
            w = np.exp(log_ratios(mine, other))
            sums = out.bands[age_band(age)]
            sums[0] += float(w.sum())
            sums[1] += float(shaped(w, beta).sum())
            sums[2] += float(w.size)
    return out


def _flat(sums: OffPolicySums, correction: CorrectionStats) -> dict[str, float]:
    flat = {**sums.mismatch.as_dict("m_"), **sums.staleness.as_dict("s_")}
    for band, (w, fw, n) in sums.bands.items():
        flat |= {f"w_{band}": w, f"fw_{band}": fw, f"n_{band}": n}
    flat |= {"c_w": correction.weight_sum, "c_cut": correction.cut, "c_n": correction.tokens}
    return flat


def correction_of(cfg: ExgrpoConfig) -> RolloutCorrection | None:
    """`algo.rollout_correction` as the update applies it (None: off)."""
    c = cfg.algo.rollout_correction
    return None if c.mode is None else RolloutCorrection(c.mode, c.cap, c.low, c.high)


def offpolicy_metrics(
    sums: OffPolicySums,
    correction: CorrectionStats,
    parallel: DataParallel,
    cfg: ExgrpoConfig,
    ages: Sequence[int] = (),
) -> dict[str, float]:
    """The step's off-policy metrics (docs/metrics.md) from the update's sums, run-wide: a
    collective, every rank calls it. The replay/ keys are logged when the run replays
    (`replay.ratio` > 0), the loss/correction_ ones when a rollout correction is on; `ages`: the
    replayed rows' ages, the same list on every rank (every rank selects every replayed question)."""
    replay, corrected = cfg.replay.ratio > 0, cfg.algo.rollout_correction.mode is not None
    t = parallel.sum(_flat(sums, correction))
    _, k3, outside = GapSums.from_dict(t, "m_").figures()
    m = {"rollout/mismatch_k3": k3, "rollout/mismatch_ratio_outside": outside}
    if replay:
        diff, k3, outside = GapSums.from_dict(t, "s_").figures()
        m |= {
            "replay/staleness_logprob_diff_mean": diff,
            "replay/staleness_k3": k3,
            "replay/staleness_ratio_outside": outside,
            **age_summary(ages),
        }
        for band, _, _ in AGE_BANDS:
            n = t[f"n_{band}"]
            m[f"replay/w_mean/age_{band}"] = t[f"w_{band}"] / n if n else math.nan
            m[f"replay/fw_mean/age_{band}"] = t[f"fw_{band}"] / n if n else math.nan
    if corrected:
        n = t["c_n"]
        m["loss/correction_weight_mean"] = t["c_w"] / n if n else math.nan
        m["loss/correction_cut"] = t["c_cut"] / n if n else math.nan
    return m


class MismatchWatch:
    """The warning band below `rollout.max_logprob_diff`: a line when the run-wide gap crosses
    `warn` upwards (one per crossing, not one per step above it), and a trend alarm when the gap
    rose at each of the last `window` steps by `TREND_MIN_RISE` or more in all (one line when the
    alarm starts). Neither stops the run. Under top-p sampling the threshold grows by the nucleus
    slack, as the stop's does. The history lives in memory: a resumed run starts a new window.
    The lines wait in `lines` until the run prints them (`take_lines`, run/training.py: on rank 0's
    console and in every rank's log, as the run's other notices)."""

    def __init__(self, warn: float | None, window: int, top_p: float = 1.0) -> None:
        self.warn = None if warn is None else warn + nucleus_slack(top_p)
        self.window = window
        self.lines: list[str] = []
        self._history: deque[float] = deque(maxlen=window + 1)
        self._above = False
        self._rising = False

    def observe(self, step: int, gap: float) -> dict[str, float]:
        """The step's `rollout/logprob_diff_warn` and `rollout/logprob_diff_rising` (0 or 1)."""
        above = self.warn is not None and not gap <= self.warn  # NaN warns too
        if above and not self._above:
            self._say(
                f"step {step}: the rollout engine's log-probs are {gap:.4g} nats/token from the "
                f"trainer's, past rollout.warn_logprob_diff={self.warn:.4g} (healthy bf16: 0.005-0.04; "
                "the run goes on; docs/off-policy.md says how to read it)"
            )
        self._above = above
        self._history.append(gap)
        h = list(self._history)
        rising = (
            self.window > 0
            and len(h) == self.window + 1
            and all(b > a for a, b in zip(h, h[1:]))
            and h[-1] - h[0] >= TREND_MIN_RISE
        )
        if rising and not self._rising:
            self._say(
                f"step {step}: the engine-trainer log-prob gap rose at each of the last {self.window} "
                f"steps, {h[0]:.4g} -> {h[-1]:.4g} nats/token (rollout.logprob_diff_trend_window; "
                "the run goes on, rollout.max_logprob_diff stops it)"
            )
        self._rising = rising
        return {"rollout/logprob_diff_warn": float(above), "rollout/logprob_diff_rising": float(rising)}

    def _say(self, line: str) -> None:
        self.lines.append(f"warning: {line}")

    def take_lines(self) -> list[str]:
        """The lines said since the last call (and forget them)."""
        out, self.lines = self.lines, []
        return out
