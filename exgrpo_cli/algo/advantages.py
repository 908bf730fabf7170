"""Group-relative advantages (Dr.GRPO): A_i = r_i - mean(r of i's group), broadcast over tokens.

A replayed question's group holds its K-1 fresh responses and the replayed one (docs/algorithm.md §4),
so one function serves fresh and mixed groups alike.
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, group_index: Tensor, scale_by_std: bool = False) -> Tensor:
    """Advantages of N responses.

    rewards: float [N]; group_index: long [N], the group (question) of each response, values in
    0..G-1. Returns float [N]. With `scale_by_std` (original GRPO, not Dr.GRPO) the centred reward
    is divided by the group's sample standard deviation (+1e-6, so all-equal groups give 0).
    """
    if rewards.shape != group_index.shape or rewards.dim() != 1:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_index {tuple(group_index.shape)} "
            "must be 1-D of the same length"
        )
    rewards = rewards.float()
    num_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    counts = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_index, torch.ones_like(rewards))
    sums = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_index, rewards)
    mean = sums / counts.clamp(min=1)
    centred = rewards - mean[group_index]
    if not scale_by_std:
        return centred
    sq = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_index, centred**2)
    std = (sq / (counts - 1).clamp(min=1)).sqrt()
    return centred / (std[group_index] + 1e-6)
