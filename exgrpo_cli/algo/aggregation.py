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
  length), averaged over ranks, minus entropy_coef x the update's token-mean entropy.
"""

from __future__ import annotations

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
    gradient of the whole mini-batch's sum / (all responses x L), whatever each rank's share."""
    tokens = float(max(sum(shape.response_lengths), 1))
    return Normalisers(
        policy=float(shape.rows_mean * shape.max_response_tokens),
        entropy=[tokens] * len(shape.response_lengths),
    )


# `algo.aggregation`: name -> aggregation
AGGREGATIONS: dict[str, Aggregation] = {"drgrpo": drgrpo}


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
