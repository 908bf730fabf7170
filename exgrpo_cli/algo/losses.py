"""The ExGRPO mixed-policy token loss (ALGORITHM.md 4) with Dr.GRPO aggregation.

Per token, with w = exp(logp_theta - logp_b):
- fresh rows (b = pi_old of this step): PPO-clip max(-A w, -A clip(w, 1-eps, 1+eps)) when
  clip_eps is given, else -A w (the official run drops clipping after the delayed start);
- replayed rows (b = the stored behaviour log-probs): -A f(w) with f(w) = w / (w + beta)
  (policy shaping), or -A w when beta is None (the "w/o shaping" ablation). Never clipped.
The sum over the valid tokens of all rows is divided by a constant `normalizer` (Dr.GRPO: the
number of responses times the maximum response length), not by each response's length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

# exp() of a log-ratio beyond this overflows float32 to inf and then poisons the sum with nan;
# ratios this large carry no usable gradient anyway, so they are capped (as verl does).
MAX_LOG_RATIO = 20.0


def policy_shaping(ratio: Tensor, beta: float) -> Tensor:
    """f(w) = w / (w + beta): damps large importance ratios, boosts low-probability tokens."""
    return ratio / (ratio + beta)


@dataclass
class LossStats:
    """Token sums behind the `loss/` metrics of one (micro-)batch; add them up across chunks."""

    on_policy_loss: float = 0.0  # summed token loss of fresh rows / normalizer
    off_policy_loss: float = 0.0  # summed token loss of replayed rows / normalizer
    fresh_tokens: int = 0
    replay_tokens: int = 0
    clipped_tokens: int = 0  # fresh tokens where the clipped branch was taken
    replay_ratio_sum: float = 0.0  # sum of w over replayed tokens
    fresh_ratio_sum: float = 0.0  # sum of w over fresh tokens (exactly fresh_tokens when b = theta)

    def __iadd__(self, other: LossStats) -> LossStats:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))
        return self


def exgrpo_token_losses(
    logp: Tensor,
    behavior_logp: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    replay_mask: Tensor,
    *,
    clip_eps: float | None,
    beta: float | None,
) -> tuple[Tensor, Tensor]:
    """Token losses [B,T] (zero outside the mask) and a bool [B,T] of clipped fresh tokens."""
    mask = response_mask.bool()
    log_ratio = (logp - behavior_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    log_ratio = torch.where(mask, log_ratio, torch.zeros_like(log_ratio))
    ratio = log_ratio.exp()
    adv = advantages.to(ratio.dtype).unsqueeze(-1)

    if clip_eps is not None:
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
        fresh = torch.maximum(unclipped, clipped)
        clip_hit = (clipped > unclipped) & mask
    else:
        fresh = -adv * ratio
        clip_hit = torch.zeros_like(mask)

    if beta is not None:
        # w/(w+beta) == sigmoid(log w - log beta): the same value, but finite for any log-ratio
        shaped = torch.sigmoid(log_ratio - math.log(beta))
        replay = -adv * shaped
    else:
        replay = -adv * ratio

    is_replay = replay_mask.bool().unsqueeze(-1)
    losses = torch.where(is_replay, replay, fresh)
    losses = torch.where(mask, losses, torch.zeros_like(losses))
    return losses, clip_hit & ~is_replay


def exgrpo_policy_loss(
    logp: Tensor,
    behavior_logp: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    replay_mask: Tensor,
    *,
    clip_eps: float | None,
    beta: float | None,
    normalizer: float,
) -> Tensor:
    """Scalar ExGRPO policy loss.

    logp, behavior_logp: [B,T] log-probs of the response tokens under the current and the
    behaviour policy; advantages: [B]; response_mask: [B,T] (1 on response tokens);
    replay_mask: bool [B] (True for replayed rows); normalizer: the Dr.GRPO constant.
    """
    losses, _ = exgrpo_token_losses(
        logp, behavior_logp, advantages, response_mask, replay_mask, clip_eps=clip_eps, beta=beta
    )
    return losses.sum() / normalizer


def loss_stats(
    losses: Tensor,
    logp: Tensor,
    behavior_logp: Tensor,
    response_mask: Tensor,
    replay_mask: Tensor,
    clip_hit: Tensor,
    normalizer: float,
) -> LossStats:
    """The detached sums behind loss/on_policy, loss/off_policy, loss/clip_fraction, ..."""
    with torch.no_grad():
        mask = response_mask.bool()
        rep = replay_mask.bool().unsqueeze(-1) & mask
        fresh = ~replay_mask.bool().unsqueeze(-1) & mask
        ratio = (logp - behavior_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
        return LossStats(
            on_policy_loss=float((losses * fresh).sum()) / normalizer,
            off_policy_loss=float((losses * rep).sum()) / normalizer,
            fresh_tokens=int(fresh.sum()),
            replay_tokens=int(rep.sum()),
            clipped_tokens=int(clip_hit.sum()),
            replay_ratio_sum=float((ratio * rep).sum()),
            fresh_ratio_sum=float((ratio * fresh).sum()),
        )
