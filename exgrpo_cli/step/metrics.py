"""The `rollout/`, `loss/` and per-origin `reward/` metrics of one step, from its groups and its
update's result, and its `timing/` metrics (`Timers`, seconds per stage).

Where it sits in the step: last, before logging (run/training.py then averages every metric over the
ranks). Functions of what the step produced; `loss_metrics` is a collective under torchrun: its
per-token ratios are run-wide, from the ranks' summed tokens, so it is called on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.replay.mixing import Group, MixedBatch
from exgrpo_cli.step.update import UpdateResult


def rollout_metrics(groups: list[Group], batch: MixedBatch) -> dict[str, float]:
    fresh = [r for g in groups for r in g.responses if not r.replayed]
    lengths = [len(r.ids) for r in fresh]
    return {
        "rollout/response_length": float(np.mean(lengths)) if lengths else 0.0,
        "rollout/truncated": float(np.mean([not r.finished for r in fresh])) if fresh else 0.0,
        "rollout/responses": float(len(fresh)),
        "rollout/rows": float(len(batch)),
    }


def loss_metrics(res: UpdateResult, lr: float, parallel: DataParallel | None = None) -> dict[str, float]:
    """The update's metrics. The per-token ones (clip fraction, importance weight, entropy, engine
    log-prob gap) divide the ranks' summed numerators by their summed token counts: a mean of
    per-rank ratios would weigh a rank's few tokens like another's many, and a rank without
    replayed tokens would make the importance weight NaN for the run. On one rank the sums are
    this rank's own, unchanged. The losses are per-rank shares of FSDP's rank-averaged objective
    and stay per rank (averaged by the caller)."""
    s = res.stats
    t = (parallel or DataParallel()).sum(
        {
            "clipped": s.clipped_tokens,
            "fresh": s.fresh_tokens,
            "replay": s.replay_tokens,
            "replay_ratio": s.replay_ratio_sum,
            "entropy": res.entropy_sum,
            "logprob_diff": res.logprob_diff_sum,
        }
    )
    fresh_tokens = max(t["fresh"], 1)
    return {
        "loss/total": res.loss_total,
        "loss/on_policy": s.on_policy_loss,
        "loss/off_policy": s.off_policy_loss,
        "loss/clip_fraction": t["clipped"] / fresh_tokens,
        "loss/importance_weight_mean": t["replay_ratio"] / t["replay"] if t["replay"] else float("nan"),
        "loss/entropy": t["entropy"] / max(t["fresh"] + t["replay"], 1),
        "rollout/logprob_diff_mean": t["logprob_diff"] / fresh_tokens,
        "optim/grad_norm": float(np.mean(res.grad_norms)) if res.grad_norms else float("nan"),
        "optim/skipped_steps": float(res.skipped),
        "optim/lr": lr,
    }


def accuracy_by_origin(groups: list[Group]) -> dict[str, float]:
    """The fresh responses' accuracy apart for questions drawn fresh this step and for questions
    replayed from the buffer (their K-1 fresh responses; the replayed response is left out), as
    `reward/accuracy` counts them (at or above reward.correct_at):
    `reward/accuracy` pools both, so a run that keeps replaying a few questions it now solves can
    show a rising training accuracy while it does worse on new ones. A key is absent when the step
    has no group of that origin."""
    out = {}
    for key, from_buffer in (("fresh_questions", False), ("replayed_questions", True)):
        correct = [
            r.is_correct
            for g in groups
            if g.from_buffer == from_buffer
            for r in g.responses
            if not r.replayed
        ]
        if correct:
            out[f"reward/accuracy_{key}"] = float(np.mean(correct))
    return out


class Timers(dict[str, float]):
    """The step's `timing/<stage>` metrics: seconds per stage, summed over its uses."""

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self[f"timing/{name}"] = self.get(f"timing/{name}", 0.0) + time.perf_counter() - t0
