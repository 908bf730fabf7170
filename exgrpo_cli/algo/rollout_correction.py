"""Rollout-mismatch correction on fresh rows (`algo.rollout_correction`, docs/off-policy.md).

The trainer takes its own pi_old as the behaviour policy of fresh rows (as the paper and the
official code do), but the tokens were sampled by the rollout engine, whose log-probs differ by
kernel and dtype rounding (bf16 on a GPU). A correction weighs each fresh token by how the two
disagree, with r = pi_old / pi_engine per token:
- `token_tis`: truncated importance sampling, weight min(r, cap) per token;
- `geo_mask`: a sequence whose geometric-mean ratio exp(mean log r) leaves [low, high] gets
  weight 0 on every token (dropped), the others weight 1.
Token-level or geometric only: a product of per-token ratios over thousands of tokens is 0 or
huge for nearly every sequence.

Where it sits in the step: inside the update, per micro-batch, after the policy loss: the weights
multiply the fresh token losses (replayed rows and padding get weight 1, the loss is zero there
anyway). The aggregation's normalisers are left as they are, so a dropped sequence's tokens still
count in a token-mean denominator: dropping lowers the step's loss, it does not reweigh the rest.
Pure: tensors in, tensors out, no grad through the weights (both log-probs are detached).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from exgrpo_cli.algo.offpolicy import MAX_LOG_RATIO, TokenSums

MODES = ("token_tis", "geo_mask")


@dataclass(frozen=True)
class RolloutCorrection:
    """A correction mode (one of MODES) and its settings."""

    mode: str
    cap: float = 2.0  # token_tis: the truncation of r
    low: float = 0.99  # geo_mask: the kept band of the geometric-mean ratio
    high: float = 1.01

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"algo.rollout_correction.mode must be null or one of {', '.join(MODES)}")


@dataclass
class CorrectionStats(TokenSums):
    """Token sums behind `loss/correction_*`: the fresh tokens' weights and how many were cut."""

    weight_sum: float = 0.0
    cut: float = 0.0  # fresh tokens capped (token_tis) or dropped (geo_mask)
    tokens: float = 0.0


def correction_weights(
    c: RolloutCorrection, old_logp: Tensor, engine_logp: Tensor, response_mask: Tensor, replay_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """(weights [B, T], cut [B, T] bool) for one micro-batch: 1 on replayed rows and padding."""
    mask = response_mask.bool()
    fresh = ~replay_mask.bool().unsqueeze(-1) & mask
    d = (old_logp.detach() - engine_logp.detach()).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    d = torch.where(fresh, d, torch.zeros_like(d))
    if c.mode == "token_tis":
        ratio = d.exp()
        cut = (ratio > c.cap) & fresh
        w = torch.where(fresh, ratio.clamp(max=c.cap), torch.ones_like(ratio))
        return w, cut
    tokens = fresh.sum(-1)
    mean_log = d.sum(-1) / tokens.clamp(min=1)
    # compared in log space: exp(mean) of a sequence of 8k tokens is exact enough, the log is cheaper
    out = (mean_log < math.log(c.low)) | (mean_log > math.log(c.high))
    cut = out.unsqueeze(-1) & fresh
    w = torch.where(cut, torch.zeros_like(d), torch.ones_like(d))
    return w, cut


def correction_stats(w: Tensor, cut: Tensor, response_mask: Tensor, replay_mask: Tensor) -> CorrectionStats:
    with torch.no_grad():
        fresh = ~replay_mask.bool().unsqueeze(-1) & response_mask.bool()
        return CorrectionStats(
            weight_sum=float((w * fresh).sum()), cut=float(cut.sum()), tokens=float(fresh.sum())
        )
