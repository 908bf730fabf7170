"""How per-token losses and entropies add up to the objective of one optimizer update.

Where it sits in the step: inside the update. Before an update's first micro-batch, the
aggregation named by `algo.aggregation` (a name of `AGGREGATIONS`) turns the shape of the update
(its rows' lengths on this rank, the ranks' mean row count) into `Normalisers`: one divisor for
every token loss and one per row for its token entropies. `objective` then gives each
micro-batch's share of the objective,

    sum(token losses) / policy  -  entropy_coef * sum_rows(sum of the row's token entropies / entropy[row]),

and the update back-propagates each share as it goes. Because every weight is fixed per token
before any forward, how the rows are cut into memory-sized micro-batches (`algo.micro_batch_tokens`)
never changes the objective.

- `drgrpo` (ALGORITHM.md 4, the default): sum of token losses / (responses x max response
  length), averaged over ranks, minus entropy_coef x the update's token-mean entropy (on several
  ranks: the mean over ranks of each rank's token-mean entropy, see `drgrpo`).
- `official`: the per-rank gradient of the official actor (mix_actor.py with
  loss_remove_token_mean=True, use_dynamic_bsz=True): the update's rows on a rank are cut into
  max-over-ranks ceil(tokens / ppo_max_token_len_per_gpu) balanced micro-batches; each contributes
  (sum of its token losses / L  -  entropy_coef x its token-mean entropy) / gradient_accumulation,
  where gradient_accumulation = ppo_mini_batch_size / ppo_micro_batch_size (verl scales both by
  rollout.n and divides both by the data-parallel size, so only their ratio remains: 64 / 64 = 1
  in run_exgrpo.sh). So the policy term is sum / (L x GA) per rank, and the entropy bonus grows
  with the number of those micro-batches. Those official micro-batches are a rule of the
  objective, reproduced here from the official settings; exgrpo's own memory micro-batches
  (`algo.micro_batch_tokens`) are independent of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# max over ranks of a per-rank integer (identity on one rank): a collective, so every rank calls it
MaxOverRanks = Callable[[int], int]


@dataclass(frozen=True)
class UpdateShape:
    """One optimizer update as this rank sees it, before any forward."""

    response_lengths: list[int]  # per row of this rank's share of the mini-batch
    sequence_lengths: list[int]  # prompt + response tokens per row
    rows_mean: float  # the ranks' mean row count (FSDP averages the gradients over ranks)
    max_response_tokens: int  # L: the constant of the Dr.GRPO normaliser


@dataclass(frozen=True)
class Normalisers:
    policy: float  # every token loss is divided by this
    entropy: list[float]  # per row: its token entropies are divided by this (then x entropy_coef)


Aggregation = Callable[[UpdateShape, MaxOverRanks], Normalisers]


def drgrpo(shape: UpdateShape, max_over_ranks: MaxOverRanks) -> Normalisers:
    """Dr.GRPO: a constant normaliser of (responses x L), no per-sequence length normalisation.
    With R ranks each dividing by the ranks' mean row count, FSDP's average over ranks is the
    gradient of the whole mini-batch's sum / (all responses x L), whatever each rank's share.
    The entropy term is not made run-wide the same way: each rank divides by its own response
    tokens, so on R > 1 ranks the bonus is the mean over ranks of per-rank token means, which
    equals the mini-batch's token mean only when the ranks hold as many response tokens."""
    tokens = float(max(sum(shape.response_lengths), 1))
    return Normalisers(
        policy=float(shape.rows_mean * shape.max_response_tokens),
        entropy=[tokens] * len(shape.response_lengths),
    )


@dataclass(frozen=True)
class AggregationSettings:
    """Constants an aggregation may depend on: the official actor's batch configuration."""

    ppo_mini_batch_size: int = 64  # questions per mini-batch (run_exgrpo.sh)
    ppo_micro_batch_size: int = 64  # questions per micro-batch (sets gradient_accumulation)
    ppo_max_token_len_per_gpu: int = 32768  # the dynamic micro-batches' token budget

    @property
    def gradient_accumulation(self) -> int:
        return max(1, self.ppo_mini_batch_size // self.ppo_micro_batch_size)


def balanced_partition(lengths: list[int], parts: int) -> list[list[int]]:
    """Indices of `lengths` cut into `parts` non-empty groups of near-equal total length: longest
    first, each to the group with the least so far (ties: the lower group). verl balances its
    dynamic micro-batches with a Karmarkar-Karp partition; both keep the official count, and the
    groups' token sums differ by at most one row's length."""
    parts = max(1, min(parts, len(lengths)))
    groups: list[list[int]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        g = min(range(parts), key=lambda g: (totals[g], g))
        groups[g].append(i)
        totals[g] += lengths[i]
    return groups


def official(settings: AggregationSettings) -> Aggregation:
    """The official actor's weights for `settings` (see the module docstring)."""

    def normalisers(shape: UpdateShape, max_over_ranks: MaxOverRanks) -> Normalisers:
        ga = settings.gradient_accumulation
        tokens = sum(shape.sequence_lengths)
        count = max_over_ranks(math.ceil(tokens / settings.ppo_max_token_len_per_gpu))
        entropy = [1.0] * len(shape.response_lengths)
        for group in balanced_partition(shape.sequence_lengths, count) if shape.sequence_lengths else []:
            response_tokens = max(sum(shape.response_lengths[i] for i in group), 1)
            for i in group:
                entropy[i] = float(response_tokens * ga)
        return Normalisers(policy=float(shape.max_response_tokens * ga), entropy=entropy)

    return normalisers


# `algo.aggregation`: name -> the aggregation built from its settings
AGGREGATIONS: dict[str, Callable[[AggregationSettings], Aggregation]] = {
    "drgrpo": lambda settings: drgrpo,
    "official": official,
}


def objective(
    token_losses: Tensor,
    token_entropy: Tensor | None,
    response_mask: Tensor,
    policy_norm: float,
    entropy_norm: Tensor,
    entropy_coef: float,
) -> Tensor:
    """One micro-batch's share of the update's objective (a scalar to back-propagate).

    token_losses, token_entropy, response_mask: [B, T]; entropy_norm: [B], the rows' entropy
    divisors from `Normalisers.entropy`. The token entropies enter with their gradient: the
    entropy bonus pushes the policy's entropy up.
    """
    loss = token_losses.sum() / policy_norm
    if token_entropy is not None and entropy_coef > 0:
        per_row = (token_entropy * response_mask).sum(-1) / entropy_norm.to(token_entropy.dtype)
        loss = loss - entropy_coef * per_row.sum()
    return loss


def entropy_norms(norms: Normalisers, rows: list[int], device: torch.device) -> Tensor:
    """The entropy divisors of `rows` (indices into the update's rows) as a [len(rows)] tensor."""
    return torch.tensor([norms.entropy[i] for i in rows], dtype=torch.float32, device=device)
