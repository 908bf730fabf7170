"""The policy update of one step: mixed batch + advantages -> optimizer step(s).

Plumbing only: the step's rows are cut into one mini-batch per optimizer update, each into
memory-sized micro-batches kept in step across ranks (`synced_micro_batches`), and every
micro-batch's share of the objective is back-propagated; then the gradient is clipped and the
update skipped when its norm is not finite or too large. The maths is algo/'s: the behaviour
log-probs (`behaviour_logprobs`), the per-token loss the trainer chose (`POLICY_LOSSES`), per-token
log-probs and entropies, and how they add up (`AGGREGATIONS`, `objective`).

pi_old (docs/algorithm.md §4): the policy before the step's first update. On the first mini-batch that
is the current policy itself, so its log-probs are the detached ones of the very forward that
builds the loss; the later mini-batches' are computed once, in a no-grad pass before the first
update. Replayed rows use their stored log-probs (IS correction), or pi_old too with
`replay.importance_correction=false` (the official "w/o IS" ablation).

Off-policy figures (step/offpolicy.py): once every row's pi_old log-probs are known (after the
first mini-batch's forward) the engine mismatch and the replay staleness are summed, once, and
handed to `before_first_step` (the engine check). `algo.rollout_correction` multiplies the fresh
token losses by its weights (algo/rollout_correction.py); off, nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from exgrpo_cli.algo.aggregation import Aggregation, UpdateShape, entropy_norms, objective
from exgrpo_cli.algo.losses import (
    LossInputs,
    LossStats,
    PolicyLoss,
    behaviour_logprobs,
    loss_stats,
)
from exgrpo_cli.algo.offpolicy import GapSums
from exgrpo_cli.algo.rollout_correction import (
    CorrectionStats,
    RolloutCorrection,
    correction_stats,
    correction_weights,
)
from exgrpo_cli.parallel.fsdp import local_dist
from exgrpo_cli.parallel.offload import clip_grad_norm
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy.forward import SequenceBatch, forward_logprobs, pad_rows, synced_micro_batches
from exgrpo_cli.replay.mixing import MixedBatch, split_groups
from exgrpo_cli.step.offpolicy import OffPolicySums, offpolicy_sums


@dataclass(frozen=True)
class UpdatePlan:
    """Everything the update needs besides the batch: chosen once per step by the trainer."""

    loss: PolicyLoss  # the step's, its settings bound (algo/losses.py)
    aggregation: Aggregation
    entropy_coef: float
    importance_correction: bool
    max_response_tokens: int  # L, the constant of the aggregation
    updates: int  # optimizer updates (mini-batches) per step
    micro_batch_tokens: int  # memory knob only: never changes the objective
    grad_clip: float
    skip_grad_norm_above: float
    # log-probs and entropies are of softmax(logits / T), T the rollout temperature, as the
    # official actor's and the engines' (docs/algorithm.md §4)
    temperature: float = 1.0
    # called with this rank's engine-vs-trainer sums over fresh tokens (pi_old known for every
    # row), after the first mini-batch's forward and before the first optimizer step: may stop the
    # run (step/divergence.py)
    before_first_step: Callable[[GapSums], object] | None = None
    # fresh-row correction of the engine mismatch (algo.rollout_correction); None: off
    rollout_correction: RolloutCorrection | None = None
    # the policy shaping's beta, for the f(w)-by-age figures only (None: f(w) = w); never the loss's
    replay_beta: float | None = None


@dataclass
class UpdateResult:
    stats: LossStats = field(default_factory=LossStats)
    entropy_sum: float = 0.0
    logprob_diff_sum: float = 0.0  # |trainer - rollout engine| log-prob over fresh tokens, before the update
    offpolicy: OffPolicySums = field(default_factory=OffPolicySums)  # mismatch, staleness, w by age
    correction: CorrectionStats = field(default_factory=CorrectionStats)  # algo.rollout_correction
    # row -> the trainer's log-probs of a fresh row's tokens under the policy before the step's first
    # update: what the replay buffer stores (the official code stores these, not the engine's)
    trainer_logp: dict[int, list[float]] = field(default_factory=dict)
    grad_norms: list[float] = field(default_factory=list)
    applied: list[bool] = field(default_factory=list)  # per update, in order: False when skipped
    loss_total: float = 0.0

    @property
    def skipped(self) -> int:
        return self.applied.count(False)


def _rows_of(batch: MixedBatch, groups: list[int]) -> list[int]:
    wanted = set(groups)
    return [i for i, g in enumerate(batch.group_index.tolist()) if g in wanted]


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: MixedBatch,
    advantages: Tensor,
    plan: UpdatePlan,
    pad_id: int,
    parallel: DataParallel | None = None,
    old: dict[int, list[float]] | None = None,
) -> UpdateResult:
    """The policy-gradient step(s) on `batch`, one optimizer step per mini-batch. `old`: pi_old's
    log-probs of the later mini-batches' rows (`pi_old_logprobs`; computed here when not given)."""
    # the batches are packed on the run's compute device (`dist.device`), which under FSDP2's CPU
    # offload is not where the parameters are
    parallel = parallel if parallel is not None else local_dist(model)
    minibatches = _minibatches(batch, plan)
    if old is None:
        old = pi_old_logprobs(model, batch, plan, pad_id, parallel)
    res = UpdateResult()
    res.trainer_logp.update(old)
    params = [p for p in model.parameters() if p.requires_grad]
    for index, rows in enumerate(minibatches):
        optimizer.zero_grad(set_to_none=True)
        # the first mini-batch's pi_old is the current policy: no table; its log-probs are recorded
        stats, mb_loss = _accumulate(
            model, batch, advantages, rows, old if index else {}, plan, pad_id, parallel, res
        )
        res.stats += stats
        res.loss_total += mb_loss
        if index == 0:  # pi_old of every row is known: the step's off-policy sums, once
            res.offpolicy = offpolicy_sums(res.trainer_logp, batch, plan.replay_beta)
            res.logprob_diff_sum = res.offpolicy.mismatch.abs_sum
            if plan.before_first_step is not None:
                plan.before_first_step(res.offpolicy.mismatch)
        norm = clip_grad_norm(params, plan.grad_clip, parallel)  # global under FSDP, offloaded or not
        res.grad_norms.append(norm)
        # every rank must take the same decision, and a non-finite loss may be on one rank only;
        # judged per update: a non-finite earlier mini-batch must not condemn this one
        bad_loss = parallel.any(not math.isfinite(mb_loss))
        # skip-on-non-finite (and on huge norms, as the paper)
        skip = not math.isfinite(norm) or norm > plan.skip_grad_norm_above or bad_loss
        if not skip:
            optimizer.step()
        res.applied.append(not skip)
        optimizer.zero_grad(set_to_none=True)  # also frees the gradients' memory until the next step
    fresh = [i for i in res.trainer_logp if not bool(batch.replay_mask[i])]
    res.trainer_logp = {i: res.trainer_logp[i] for i in fresh}
    return res


def _minibatches(batch: MixedBatch, plan: UpdatePlan) -> list[list[int]]:
    """The rows of each of the step's `plan.updates` mini-batches, whole groups each."""
    num_groups = int(batch.group_index.max()) + 1
    return [_rows_of(batch, gs) for gs in split_groups(num_groups, plan.updates)]


@torch.no_grad()
def pi_old_logprobs(
    model: torch.nn.Module, batch: MixedBatch, plan: UpdatePlan, pad_id: int, parallel: DataParallel
) -> dict[int, list[float]]:
    """pi_old (docs/algorithm.md §4): the log-probs, under the policy before the step's first
    optimizer step, of the rows of every mini-batch but the first (row -> per-token list). The
    first mini-batch needs none: its pi_old is the policy its own forward runs, whose log-probs
    the update records. A no-grad pass; a collective under FSDP (every rank calls it)."""
    old: dict[int, list[float]] = {}
    for rows in _minibatches(batch, plan)[1:]:
        passes = synced_micro_batches(
            batch.prompt_ids,
            batch.response_ids,
            rows,
            plan.micro_batch_tokens,
            pad_id,
            parallel.device,
            parallel,
        )
        for sb, idle in passes:
            logp, _ = forward_logprobs(model, sb, temperature=plan.temperature)
            if idle:
                continue
            for i, row in zip(sb.rows, logp.tolist()):
                old[i] = row[: len(batch.response_ids[i])]
    return old


def _accumulate(
    model: torch.nn.Module,
    batch: MixedBatch,
    advantages: Tensor,
    rows: list[int],
    old: dict[int, list[float]],
    plan: UpdatePlan,
    pad_id: int,
    parallel: DataParallel,
    res: UpdateResult,
) -> tuple[LossStats, float]:
    """Back-propagate one update's objective, micro-batch by micro-batch; (its stats, its loss)."""
    device = parallel.device
    rows_mean = parallel.mean({"rows": len(rows)})["rows"]
    shape = UpdateShape(
        response_lengths=[len(batch.response_ids[i]) for i in rows],
        sequence_lengths=[len(batch.prompt_ids[i]) + len(batch.response_ids[i]) for i in rows],
        rows_mean=rows_mean,
        max_response_tokens=plan.max_response_tokens,
        row_keys=[batch.row_keys[i] for i in rows],
    )
    norms = plan.aggregation(shape, parallel.gather)
    position = {row: k for k, row in enumerate(rows)}
    stats, total = LossStats(), 0.0
    with_entropy = plan.entropy_coef > 0
    passes = synced_micro_batches(
        batch.prompt_ids, batch.response_ids, rows, plan.micro_batch_tokens, pad_id, device, parallel
    )
    for sb, idle in passes:
        logp, ent = forward_logprobs(
            model, sb, temperature=plan.temperature, with_entropy=with_entropy and not idle
        )
        if idle:  # takes part in FSDP's collectives, adds nothing
            (logp.sum() * 0.0).backward()
            continue
        x = _loss_inputs(logp, sb, batch, advantages, old, plan.importance_correction)
        losses, clipped = plan.loss(x)
        if plan.rollout_correction is not None:  # weights of fresh tokens, 1 elsewhere
            w, cut = correction_weights(
                plan.rollout_correction,
                x.behaviour_logp,
                _engine_logprobs(batch, sb, device),
                sb.response_mask,
                x.replay_mask,
            )
            losses = losses * w
            res.correction += correction_stats(w, cut, sb.response_mask, x.replay_mask)
        loss = objective(
            losses,
            ent,
            sb.response_mask,
            norms.policy,
            entropy_norms(norms, [position[i] for i in sb.rows], device),
            plan.entropy_coef,
        )
        loss.backward()
        total += float(loss.detach())
        stats += loss_stats(x, losses, clipped, norms.policy)
        if ent is not None:
            res.entropy_sum += float((ent.detach() * sb.response_mask).sum())
        if not old:  # the first mini-batch: these are the pre-update log-probs
            for i, row in zip(sb.rows, logp.detach().tolist()):
                res.trainer_logp[i] = row[: len(batch.response_ids[i])]
    return stats, total


def _loss_inputs(
    logp: Tensor,
    sb: SequenceBatch,
    batch: MixedBatch,
    advantages: Tensor,
    old: dict[int, list[float]],
    importance_correction: bool,
) -> LossInputs:
    device = logp.device
    replay_mask = batch.replay_mask[sb.rows].to(device)
    fresh_old = logp.detach()
    if old:  # a later mini-batch: pi_old from the pre-update pass
        fresh_old = pad_rows([old.get(i, []) for i in range(len(batch))], sb).to(device)
    stored = fresh_old
    if importance_correction and bool(replay_mask.any()):
        stored = pad_rows([v if v is not None else [] for v in batch.behavior_logp], sb).to(device)
    behaviour = behaviour_logprobs(fresh_old, stored, replay_mask, importance_correction)
    return LossInputs(logp, behaviour, advantages[sb.rows].to(device), sb.response_mask, replay_mask)


def _engine_logprobs(batch: MixedBatch, sb: SequenceBatch, device: torch.device) -> Tensor:
    """The rollout engine's log-probs of the micro-batch's fresh rows [B, T] (replayed rows' are
    the stored ones: the correction leaves those rows alone)."""
    rows = batch.behavior_logp
    missing = [i for i in sb.rows if not bool(batch.replay_mask[i]) and not rows[i]]
    if missing:  # an engine that gave no log-probs: nothing to correct against, and no silent 1
        raise ValueError(f"algo.rollout_correction needs the engine's log-probs; rows {missing} have none")
    return pad_rows([v if v is not None else [] for v in rows], sb).to(device)
