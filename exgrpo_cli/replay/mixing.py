"""Building the mixed batch (docs/algorithm.md §4): fresh groups and replayed-question groups as rows.

A fresh question contributes K fresh responses; a replayed question K-1 fresh responses plus the
replayed experience. Each question is one group, so its advantages are relative to its own K
rewards. Pure: plain data in, tensors out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from exgrpo_cli.data.types import Question


@dataclass
class Response:
    ids: list[int]  # response token ids
    behavior_logp: list[float] | None  # rollout log-probs (fresh) or stored log-probs (replayed)
    reward: float = 0.0
    replayed: bool = False  # True for the experience taken from the buffer
    finished: bool = True  # ended with end-of-sequence
    # reward >= reward.correct_at, set by the reward stage with the reward; None (a response built
    # with a 0/1 reward and no stage, as in tests and benchmarks): reward > 0.5
    correct: bool | None = None
    age: int | None = None  # a replayed response: steps since the step that collected it

    @property
    def is_correct(self) -> bool:
        return self.reward > 0.5 if self.correct is None else self.correct


@dataclass
class Group:
    question: Question
    prompt_ids: list[int]
    responses: list[Response] = field(default_factory=list)
    from_buffer: bool = False  # the question was chosen by replay selection

    @property
    def num_correct(self) -> int:
        return sum(r.is_correct for r in self.responses)


@dataclass
class MixedBatch:
    prompt_ids: list[list[int]]  # per row
    response_ids: list[list[int]]  # per row
    behavior_logp: list[list[float] | None]  # per row; used for replayed rows
    rewards: Tensor  # [N] float
    group_index: Tensor  # [N] long: row -> group
    replay_mask: Tensor  # [N] bool: row is a replayed experience
    # per row: (its group's index among the step's groups (all ranks'), its place in the group),
    # the same whatever the rank count
    row_keys: list[tuple[int, int]] = field(default_factory=list)
    ages: list[int | None] = field(default_factory=list)  # per row: `Response.age` (None: fresh)

    def __len__(self) -> int:
        return len(self.response_ids)


def build_mixed_batch(groups: list[Group], step_groups: list[int] | None = None) -> MixedBatch:
    """The rows of `groups`, group by group; `step_groups`: each group's index among the step's
    groups (None: `groups` are the whole step)."""
    prompts, responses, behaviour, rewards, gidx, rmask, ages, keys = [], [], [], [], [], [], [], []
    for g, group in enumerate(groups):
        for ri, r in enumerate(group.responses):
            prompts.append(group.prompt_ids)
            responses.append(r.ids)
            behaviour.append(r.behavior_logp)
            rewards.append(float(r.reward))
            gidx.append(g)
            rmask.append(r.replayed)
            ages.append(r.age)
            keys.append((g if step_groups is None else step_groups[g], ri))
    return MixedBatch(
        prompt_ids=prompts,
        response_ids=responses,
        behavior_logp=behaviour,
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_index=torch.tensor(gidx, dtype=torch.long),
        replay_mask=torch.tensor(rmask, dtype=torch.bool),
        row_keys=keys,
        ages=ages,
    )


def update_order(groups: list[int], updates: int, rng: np.random.Generator) -> list[int]:
    """The order in which a step's groups are cut into `updates` mini-batches: shuffled when there
    are several (the official trainer shuffles the step's questions first, so every update sees
    fresh and replayed groups alike; kept in order for one update, where order cannot matter)."""
    if updates <= 1:
        return list(groups)
    return [groups[i] for i in rng.permutation(len(groups))]


def split_groups(num_groups: int, parts: int) -> list[list[int]]:
    """Contiguous, near-equal chunks of group indices: one per optimizer update of the step."""
    bounds = [round(i * num_groups / parts) for i in range(parts + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(parts) if bounds[i + 1] > bounds[i]]
