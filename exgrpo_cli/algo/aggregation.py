"""How per-token losses and entropies add up to the objective of one optimizer update.

Where it sits in the step: inside the update. Before an update's first micro-batch, the
aggregation named by `algo.aggregation` (a name of `AGGREGATIONS`) turns the shape of the update
(its rows' lengths and keys on this rank, the ranks' mean row count) into `Normalisers`: one divisor for
every token loss and one per row for its token entropies. `objective` then gives each
micro-batch's share of the objective,

    sum(token losses) / policy  -  entropy_coef * sum_rows(sum of the row's token entropies / entropy[row]),

and the update back-propagates each share as it goes. Because every weight is fixed per token
before any forward, how the rows are cut into memory-sized micro-batches (`algo.micro_batch_tokens`)
never changes the objective.

- `drgrpo` (docs/algorithm.md, the default): sum of token losses / (responses x max response
  length), averaged over ranks, minus entropy_coef x the update's token-mean entropy (on several
  ranks: the mean over ranks of each rank's token-mean entropy, see `drgrpo`).
- `official`: the paper's objective as the official actor computes it on its 8 GPUs (mix_actor.py
  with loss_remove_token_mean=True, use_dynamic_bsz=True), for the same global mini-batch on any
  number of ranks. On those 8 GPUs each rank cut its share of the mini-batch into max-over-ranks
  ceil(tokens / ppo_max_token_len_per_gpu) balanced micro-batches; each contributed
  (sum of its token losses / L  -  entropy_coef x its token-mean entropy) / gradient_accumulation,
  where gradient_accumulation = ppo_mini_batch_size / ppo_micro_batch_size (verl scales both by
  rollout.n and divides both by the data-parallel size, so only their ratio remains: 64 / 64 = 1
  in run_exgrpo.sh), and FSDP averaged over the 8. So the policy term is sum / (8 x L x GA) over
  the whole mini-batch and the entropy bonus is the sum of those micro-batches' token means
  / (8 x GA). Here the mini-batch's groups are dealt to `official_batch.gpus` (8) virtual ranks as
  this project deals them to real ones (group g to g mod 8), their official micro-batches are cut
  from every rank's rows (an all-gather of lengths), and each real rank's divisors are scaled by
  8 / R (R: the rank count) so that FSDP's average over R gives that objective: on 8 ranks exactly the
  official per-rank gradient, on 1 rank the same total instead of 8x it (docs/algorithm.md).
  Those official micro-batches are a rule of the objective; exgrpo's own memory micro-batches
  (`algo.micro_batch_tokens`) are independent of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

# every rank's object, in rank order (`[obj]` on one rank): a collective, so every rank calls it
GatherRanks = Callable[[Any], list[Any]]


@dataclass(frozen=True)
class UpdateShape:
    """One optimizer update as this rank sees it, before any forward."""

    response_lengths: list[int]  # per row of this rank's share of the mini-batch
    sequence_lengths: list[int]  # prompt + response tokens per row
    rows_mean: float  # the ranks' mean row count (FSDP averages the gradients over ranks)
    max_response_tokens: int  # L: the constant of the Dr.GRPO normaliser
    # per row: (its group's index in the step, its index in the group), the same whatever the rank
    # count; None: this rank's rows in order, as one group each (a single process)
    row_keys: list[tuple[int, int]] | None = None


@dataclass(frozen=True)
class Normalisers:
    policy: float  # every token loss is divided by this
    entropy: list[float]  # per row: its token entropies are divided by this (then x entropy_coef)


Aggregation = Callable[[UpdateShape, GatherRanks], Normalisers]


def drgrpo(shape: UpdateShape, gather: GatherRanks) -> Normalisers:
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
    gpus: int = 8  # the official run's data-parallel ranks (trainer.n_gpus_per_node x nnodes)

    @property
    def gradient_accumulation(self) -> int:
        return max(1, self.ppo_mini_batch_size // self.ppo_micro_batch_size)


def balanced_partition(
    lengths: list[int], parts: int, keys: Sequence[tuple[int, int]] | None = None
) -> list[list[int]]:
    """Indices of `lengths` cut into `parts` non-empty groups of near-equal total length: longest
    first (ties: by `keys`, else by index), each to the group with the least so far (ties: the lower
    group). verl balances its dynamic micro-batches with a Karmarkar-Karp partition; both keep the
    official count, and the groups' token sums differ by at most one row's length."""
    parts = max(1, min(parts, len(lengths)))
    order_key = keys if keys is not None else [(i, 0) for i in range(len(lengths))]
    groups: list[list[int]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], order_key[i])):
        g = min(range(parts), key=lambda g: (totals[g], g))
        groups[g].append(i)
        totals[g] += lengths[i]
    return groups


def official(settings: AggregationSettings) -> Aggregation:
    """The official actor's 8-GPU objective for `settings`, on any rank count (module docstring)."""

    def normalisers(shape: UpdateShape, gather: GatherRanks) -> Normalisers:
        ga, gpus = settings.gradient_accumulation, settings.gpus
        keys = shape.row_keys
        if keys is None:
            keys = [(i, 0) for i in range(len(shape.response_lengths))]
        mine = list(zip(keys, shape.sequence_lengths, shape.response_lengths))
        parts = gather(mine)
        # FSDP averages the R ranks' gradients: a divisor of d x 8 / R on each rank is d x 8 in total
        scale = gpus / len(parts)
        rows = sorted(row for part in parts for row in part)  # the whole mini-batch, rank-free order
        if len({row[0] for row in rows}) != len(rows):
            raise ValueError("official aggregation: UpdateShape.row_keys must tell every rank's rows apart")
        virtual: list[list[tuple[tuple[int, int], int, int]]] = [[] for _ in range(gpus)]
        for row in rows:
            virtual[row[0][0] % gpus].append(row)
        count = max(math.ceil(sum(r[1] for r in v) / settings.ppo_max_token_len_per_gpu) for v in virtual)
        divisor: dict[tuple[int, int], float] = {}
        for v in virtual:
            if not v:
                continue
            for group in balanced_partition([r[1] for r in v], count, keys=[r[0] for r in v]):
                response_tokens = max(sum(v[i][2] for i in group), 1)
                for i in group:
                    divisor[v[i][0]] = float(response_tokens * ga) * scale
        return Normalisers(
            policy=float(shape.max_response_tokens * ga) * scale, entropy=[divisor[k] for k in keys]
        )

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
