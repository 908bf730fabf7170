"""The ExGRPO mixed-policy token loss (docs/algorithm.md §4): loss inputs -> per-token losses.

Per token, with w = exp(logp_theta - logp_b):
- fresh rows (b = pi_old of this step): PPO-clip max(-A w, -A clip(w, 1-eps, 1+eps)) when
  clip_eps is given, else -A w (the official run drops clipping after the delayed start);
- replayed rows (b = the stored behaviour log-probs): -A f(w) with f(w) = w / (w + beta)
  (policy shaping), or -A w when beta is None (the "w/o shaping" ablation). Never clipped.

Where it sits in the step: inside the update, once per micro-batch. `POLICY_LOSSES` (the
`algo.loss` names) is the seam: each entry reads the settings it needs from the config (the
trainer calls it once per step, telling it whether replay has started) and returns the step's
`PolicyLoss`, which takes `LossInputs` and returns per-token losses; how they add up to the
objective is algo/aggregation.py's business. A new loss with a knob of its own is one callable and
one entry here, plus its key in config/schema.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from exgrpo_cli.algo.offpolicy import TokenSums

# exp() of a log-ratio beyond this overflows float32 to inf and then poisons the sum with nan;
# ratios this large carry no usable gradient anyway, so they are capped (as verl does).
MAX_LOG_RATIO = 20.0


def policy_shaping(ratio: Tensor, beta: float) -> Tensor:
    """f(w) = w / (w + beta): damps large importance ratios, boosts low-probability tokens."""
    return ratio / (ratio + beta)


@dataclass
class LossStats(TokenSums):
    """Token sums behind the `loss/` metrics of one (micro-)batch; add them up across chunks."""

    on_policy_loss: float = 0.0  # summed token loss of fresh rows / normalizer
    off_policy_loss: float = 0.0  # summed token loss of replayed rows / normalizer
    fresh_tokens: int = 0
    replay_tokens: int = 0
    clipped_tokens: int = 0  # fresh tokens where the clipped branch was taken
    replay_ratio_sum: float = 0.0  # sum of w over replayed tokens


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

    # w is finite here (the log-ratio is capped), so the published f(w) is the one that trains
    replay = -adv * (policy_shaping(ratio, beta) if beta is not None else ratio)

    is_replay = replay_mask.bool().unsqueeze(-1)
    losses = torch.where(is_replay, replay, fresh)
    losses = torch.where(mask, losses, torch.zeros_like(losses))
    return losses, clip_hit & ~is_replay


@dataclass(frozen=True)
class LossInputs:
    """What a policy loss reads for one micro-batch of B rows and T response positions."""

    logp: Tensor  # [B, T] log-probs of the response tokens under the current policy (with grad)
    behaviour_logp: Tensor  # [B, T] under the behaviour policy (pi_old, or the stored ones)
    advantages: Tensor  # [B]
    response_mask: Tensor  # [B, T], 1 on response tokens
    replay_mask: Tensor  # [B] bool, True for replayed rows


# inputs -> (token losses [B, T], zero outside the mask; clipped fresh tokens [B, T])
PolicyLoss = Callable[[LossInputs], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class ExgrpoLoss:
    """ExGRPO's loss with a step's settings: the clipping changes at the delayed start
    (docs/algorithm.md §4)."""

    clip_eps: float | None  # None: no PPO clipping on fresh tokens
    beta: float | None  # None: no policy shaping on replayed tokens

    def __call__(self, x: LossInputs) -> tuple[Tensor, Tensor]:
        return exgrpo_token_losses(
            x.logp,
            x.behaviour_logp,
            x.advantages,
            x.response_mask,
            x.replay_mask,
            clip_eps=self.clip_eps,
            beta=self.beta,
        )

    @classmethod
    def for_step(cls, cfg: Any, started: bool) -> ExgrpoLoss:
        """algo.clip_eps, dropped once replay has `started` unless algo.clip_after_start (the
        official run drops it); replay.beta, or no shaping without replay.shaping."""
        a, p = cfg.algo, cfg.replay
        return cls(
            clip_eps=None if started and not a.clip_after_start else a.clip_eps,
            beta=p.beta if p.shaping else None,
        )


# (the run's config.ExgrpoConfig, replay has started) -> the step's loss, with the settings this
# entry reads. The config is duck-typed: algo/ imports nothing of the package above it.
LossForStep = Callable[[Any, bool], PolicyLoss]

# `algo.loss`: name -> its LossForStep. A new loss is one callable and one entry here.
POLICY_LOSSES: dict[str, LossForStep] = {"exgrpo": ExgrpoLoss.for_step}


def behaviour_logprobs(
    fresh_old: Tensor, stored: Tensor, replay_mask: Tensor, importance_correction: bool
) -> Tensor:
    """The behaviour log-probs b of each token [B, T]: pi_old of the step (`fresh_old`: the detached
    current log-probs on the step's first mini-batch, the pre-update pass's on later ones) for fresh
    rows, and the stored log-probs for replayed rows, or also pi_old for them without IS correction
    (the "w/o IS" ablation: the official code weighs them against the step's old log-probs, which
    differ from the current policy's on every mini-batch after the first)."""
    replayed = replay_mask.bool().unsqueeze(-1)
    return torch.where(replayed, stored, fresh_old) if importance_correction else fresh_old


def loss_stats(x: LossInputs, losses: Tensor, clip_hit: Tensor, normalizer: float) -> LossStats:
    """The detached sums behind loss/on_policy, loss/off_policy, loss/clip_fraction, ..."""
    with torch.no_grad():
        mask = x.response_mask.bool()
        rep = x.replay_mask.bool().unsqueeze(-1) & mask
        fresh = ~x.replay_mask.bool().unsqueeze(-1) & mask
        ratio = (x.logp - x.behaviour_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
        return LossStats(
            on_policy_loss=float((losses * fresh).sum()) / normalizer,
            off_policy_loss=float((losses * rep).sum()) / normalizer,
            fresh_tokens=int(fresh.sum()),
            replay_tokens=int(rep.sum()),
            clipped_tokens=int(clip_hit.sum()),
            replay_ratio_sum=float((ratio * rep).sum()),
        )
