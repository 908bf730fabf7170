"""One toy `UpdatePlan` for the tests that call `policy_update` directly: the Dr.GRPO objective
with PPO clipping on fresh tokens, one update, no entropy term; each test changes what it is about."""

from __future__ import annotations

import dataclasses
from typing import Any

from exgrpo_cli.algo.aggregation import drgrpo
from exgrpo_cli.algo.losses import ExgrpoLoss
from exgrpo_cli.step.update import UpdatePlan

TOY_PLAN = UpdatePlan(
    loss=ExgrpoLoss(clip_eps=0.2, beta=None),
    aggregation=drgrpo,
    entropy_coef=0.0,
    importance_correction=True,
    max_response_tokens=48,
    updates=1,
    micro_batch_tokens=16384,
    grad_clip=1.0,
    skip_grad_norm_above=500.0,
)


def toy_plan(**changes: Any) -> UpdatePlan:
    return dataclasses.replace(TOY_PLAN, **changes)
