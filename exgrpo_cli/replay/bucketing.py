"""What the buffer takes from a scored group: its level (`replay.bucket_by`, docs/algorithm.md §9),
and which of its responses are stored (`storable`).

Place in the train step: when the buffer observes a step's scored groups (after the update), the
rule gives each group a level in 0..K, and the question goes to the bucket whose range holds
level / K (replay/buckets.py). Every rank holds every group's rewards after the reward stage, so
a rule over the whole step's groups gives the same levels on every rank.

- `count`: the paper's rule, k, the number of correct responses (reward >= reward.correct_at).
  Only groups with 0 < k < K are stored, so its levels are 1..K-1.
- `reward_std`: our reading of the paper's Table-2 rule for a reward model: the std of the group's
  rewards, min-max normalised over the step's groups, rounded to 0..K. Levels 0..K all occur.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from exgrpo_cli.replay.mixing import Group

Bounds = tuple[int, int]  # (lbound, rbound): groups with lbound < k <= rbound are collected


def collects(group: Group, bounds: Bounds | None) -> bool:
    """Whether the buffer stores responses of `group`: after the delayed start, lbound < k <= rbound."""
    return bounds is not None and bounds[0] < group.num_correct <= bounds[1]


def storable(groups: Sequence[Group], bounds: Bounds | None) -> list[tuple[int, int]]:
    """(group, response) of every response the buffer stores from a step's groups, in the order
    it stores them: the fresh correct responses (reward >= reward.correct_at) of the groups it
    collects (lbound < k <= rbound, docs/algorithm.md §2); none before the delayed start (`bounds`
    None). Every rank finds the same from the same groups, whatever `replay.bucket_by` is."""
    collected = [(gi, g) for gi, g in enumerate(groups) if collects(g, bounds)]
    return [
        (gi, ri) for gi, g in collected for ri, r in enumerate(g.responses) if r.is_correct and not r.replayed
    ]


def count_levels(groups: Sequence[Group], group_size: int) -> list[int]:
    """k of K per group."""
    return [g.num_correct for g in groups]


def reward_std_levels(groups: Sequence[Group], group_size: int) -> list[int]:
    """round(K * (s - min s) / (max s - min s)) per group, s its rewards' std (population);
    every group 0 when the step's stds are all equal (no spread to rank them by)."""
    if not groups:
        return []
    stds = np.array([np.std([r.reward for r in g.responses]) for g in groups], dtype=np.float64)
    lo, hi = float(stds.min()), float(stds.max())
    if not hi > lo:
        return [0] * len(groups)
    return [int(round(group_size * (s - lo) / (hi - lo))) for s in stds]


@dataclass(frozen=True)
class BucketRule:
    levels: Callable[[Sequence[Group], int], list[int]]
    min_level: int  # the lowest level a stored question can have (its highest: K - min_level)


# `replay.bucket_by`: name -> the rule; its name is saved with the buffer and checked on load
BUCKET_BY: dict[str, BucketRule] = {
    "count": BucketRule(count_levels, min_level=1),
    "reward_std": BucketRule(reward_std_levels, min_level=0),
}
