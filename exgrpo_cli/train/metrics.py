"""The `rollout/` and `loss/` metrics of one step, from its groups and its update's result.

Where it sits in the step: last, before logging. Pure functions of what the step produced.
"""

from __future__ import annotations

import numpy as np

from exgrpo_cli.replay.mixing import Group, MixedBatch
from exgrpo_cli.train.update import UpdateResult


def rollout_metrics(groups: list[Group], batch: MixedBatch) -> dict[str, float]:
    fresh = [r for g in groups for r in g.responses if not r.replayed]
    lengths = [len(r.ids) for r in fresh]
    return {
        "rollout/response_length": float(np.mean(lengths)) if lengths else 0.0,
        "rollout/truncated": float(np.mean([not r.finished for r in fresh])) if fresh else 0.0,
        "rollout/responses": float(len(fresh)),
        "rollout/rows": float(len(batch)),
    }


def loss_metrics(res: UpdateResult, lr: float) -> dict[str, float]:
    s = res.stats
    fresh_tokens = max(s.fresh_tokens, 1)
    return {
        "loss/total": res.loss_total,
        "loss/on_policy": s.on_policy_loss,
        "loss/off_policy": s.off_policy_loss,
        "loss/clip_fraction": s.clipped_tokens / fresh_tokens,
        "loss/importance_weight_mean": s.replay_ratio_sum / s.replay_tokens
        if s.replay_tokens
        else float("nan"),
        "loss/entropy": res.entropy_sum / max(s.fresh_tokens + s.replay_tokens, 1),
        "rollout/logprob_diff_mean": res.logprob_diff_sum / fresh_tokens,
        "optim/grad_norm": float(np.mean(res.grad_norms)) if res.grad_norms else float("nan"),
        "optim/skipped_steps": float(res.skipped),
        "optim/lr": lr,
    }
