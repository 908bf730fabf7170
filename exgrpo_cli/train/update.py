"""The policy update of one step: mixed batch + advantages -> loss -> optimizer step(s).

With one update per step the behaviour policy of fresh tokens is the current policy itself, so
its log-probs are the detached log-probs of the very forward that builds the loss (no separate
old-log-prob pass). With several updates per step, the old log-probs of the later mini-batches
are computed once, before the first update. Replayed rows use their stored log-probs (IS
correction) unless `replay.importance_correction=false`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from exgrpo_cli.algo.losses import LossStats, exgrpo_token_losses, loss_stats
from exgrpo_cli.policy.distributed import DistInfo, all_reduce_dict
from exgrpo_cli.policy.forward import forward_logprobs, micro_batches, pack, pad_rows
from exgrpo_cli.replay.mixing import MixedBatch, split_groups


@dataclass
class UpdateSettings:
    clip_eps: float | None  # None: no PPO clipping on fresh tokens
    beta: float | None  # None: no policy shaping on replayed tokens
    importance_correction: bool
    entropy_coef: float
    max_response_tokens: int  # Dr.GRPO constant normaliser, per response
    updates: int
    micro_batch_tokens: int
    grad_clip: float
    skip_grad_norm_above: float


@dataclass
class UpdateResult:
    stats: LossStats
    entropy_sum: float = 0.0
    logprob_diff_sum: float = 0.0  # |trainer - rollout| log-prob over fresh tokens
    grad_norms: list[float] | None = None
    skipped: int = 0
    loss_total: float = 0.0
    per_update: list[LossStats] | None = None  # the stats of each optimizer update, in order


def _rows_of(batch: MixedBatch, groups: list[int]) -> list[int]:
    wanted = set(groups)
    return [i for i, g in enumerate(batch.group_index.tolist()) if g in wanted]


def _synced_chunks(chunks: list[list[int]], dist: DistInfo) -> list[list[int] | None]:
    """Under FSDP every forward/backward is a collective: all ranks must run as many micro-batches.
    A rank with fewer gets `None` entries, run as zero-weight passes on one row."""
    if not dist.distributed:
        return list(chunks)
    most = int(all_reduce_dict({"n": len(chunks)}, dist, op="max")["n"])
    return list(chunks) + [None] * (most - len(chunks))


def policy_update(
    model,
    optimizer: torch.optim.Optimizer,
    batch: MixedBatch,
    advantages: Tensor,
    s: UpdateSettings,
    pad_id: int,
    dist: DistInfo | None = None,
) -> UpdateResult:
    dist = dist or DistInfo()
    device = next(model.parameters()).device
    num_groups = int(batch.group_index.max()) + 1
    minibatches = [_rows_of(batch, gs) for gs in split_groups(num_groups, s.updates)]
    prompt_lens = [len(p) for p in batch.prompt_ids]
    old = (
        _old_logprobs(model, batch, minibatches[1:], s, pad_id, device, dist) if len(minibatches) > 1 else {}
    )
    res = UpdateResult(stats=LossStats(), grad_norms=[], per_update=[])
    params = [p for p in model.parameters() if p.requires_grad]
    for index, rows in enumerate(minibatches):
        # pi_old is the policy before the step's first update: for the first mini-batch that is
        # the current policy itself (ratio exactly 1), for the later ones the pre-update pass
        fresh_old = old if index > 0 else {}
        optimizer.zero_grad(set_to_none=True)
        # FSDP averages gradients over ranks: normalise by the ranks' mean row count so that the
        # result is the gradient of the whole step's loss even when the ranks' shares differ
        rows_mean = all_reduce_dict({"rows": len(rows)}, dist)["rows"]
        normalizer = float(rows_mean * s.max_response_tokens)
        n_tokens = sum(len(batch.response_ids[i]) for i in rows)
        mb_loss = 0.0
        mb_stats = LossStats()
        lengths = [prompt_lens[i] + len(batch.response_ids[i]) for i in rows]
        for chunk in _synced_chunks(micro_batches(lengths, s.micro_batch_tokens), dist):
            if chunk is None:
                _idle_pass(model, batch, rows[:1] or [0], pad_id, device, backward=True)
                continue
            sb = pack(batch.prompt_ids, batch.response_ids, [rows[c] for c in chunk], pad_id, device)
            logp, ent = forward_logprobs(model, sb, with_entropy=s.entropy_coef > 0)
            mask = sb.response_mask
            rmask = batch.replay_mask[sb.rows].to(device)
            behaviour = _behaviour(logp, sb, batch, fresh_old, rmask, s.importance_correction)
            losses, clip_hit = exgrpo_token_losses(
                logp, behaviour, advantages[sb.rows].to(device), mask, rmask, clip_eps=s.clip_eps, beta=s.beta
            )
            loss = losses.sum() / normalizer
            if ent is not None:
                ent_mean = (ent * mask).sum() / max(n_tokens, 1)
                loss = loss - s.entropy_coef * ent_mean
                res.entropy_sum += float((ent.detach() * mask).sum())
            loss.backward()
            mb_loss += float(loss.detach())
            mb_stats += loss_stats(losses, logp, behaviour, mask, rmask, clip_hit, normalizer)
            res.logprob_diff_sum += _rollout_diff(logp, sb, batch, rmask)
        res.stats += mb_stats
        res.per_update.append(mb_stats)
        norm = float(torch.nn.utils.clip_grad_norm_(params, s.grad_clip))  # global under FSDP
        res.grad_norms.append(norm)
        # every rank must take the same decision, and a non-finite loss may be on one rank only
        res.loss_total += mb_loss
        # judged per update: a non-finite earlier mini-batch must not condemn this one
        bad_loss = all_reduce_dict({"bad": float(not math.isfinite(mb_loss))}, dist, op="max")["bad"]
        if not math.isfinite(norm) or norm > s.skip_grad_norm_above or bad_loss:
            optimizer.zero_grad(set_to_none=True)  # skip-on-non-finite (and on huge norms, as the paper)
            res.skipped += 1
        else:
            optimizer.step()
    return res


def _behaviour(
    logp: Tensor,
    sb,
    batch: MixedBatch,
    old: dict[int, list[float]],
    rmask: Tensor,  # noqa: ANN001
    importance_correction: bool,
) -> Tensor:
    cur = logp.detach()
    fresh_old = cur
    if old:  # later mini-batches of a multi-update step: pi_old from the pre-update pass
        fresh_old = pad_rows([old.get(i, []) for i in range(len(batch))], sb).to(cur.device)
    if not importance_correction or not bool(rmask.any()):
        return torch.where(rmask.unsqueeze(-1), cur, fresh_old)
    stored = pad_rows([v if v is not None else [] for v in batch.behavior_logp], sb)
    return torch.where(rmask.unsqueeze(-1), stored.to(cur.device), fresh_old)


def _idle_pass(
    model,
    batch: MixedBatch,
    rows: list[int],
    pad_id: int,
    device: torch.device,  # noqa: ANN001
    backward: bool,
) -> None:
    """A forward (and zero-weight backward) that only takes part in FSDP's collectives."""
    sb = pack(batch.prompt_ids, batch.response_ids, rows, pad_id, device)
    logp, _ = forward_logprobs(model, sb)
    if backward:
        (logp.sum() * 0.0).backward()


@torch.no_grad()
def _old_logprobs(
    model,
    batch: MixedBatch,
    minibatches: list[list[int]],
    s: UpdateSettings,  # noqa: ANN001
    pad_id: int,
    device: torch.device,
    dist: DistInfo | None = None,
) -> dict[int, list[float]]:
    dist = dist or DistInfo()
    out: dict[int, list[float]] = {}
    prompt_lens = [len(p) for p in batch.prompt_ids]
    for rows in minibatches:
        lengths = [prompt_lens[i] + len(batch.response_ids[i]) for i in rows]
        for chunk in _synced_chunks(micro_batches(lengths, s.micro_batch_tokens), dist):
            if chunk is None:
                _idle_pass(model, batch, rows[:1] or [0], pad_id, device, backward=False)
                continue
            sb = pack(batch.prompt_ids, batch.response_ids, [rows[c] for c in chunk], pad_id, device)
            logp, _ = forward_logprobs(model, sb)
            for i, row in zip(sb.rows, logp.tolist()):
                out[i] = row[: len(batch.response_ids[i])]
    return out


def _rollout_diff(logp: Tensor, sb, batch: MixedBatch, rmask: Tensor) -> float:  # noqa: ANN001
    """Sum of |trainer log-prob - rollout-engine log-prob| over fresh tokens (a sync diagnostic)."""
    fresh_rows = [r for r, i in enumerate(sb.rows) if not bool(rmask[r]) and batch.behavior_logp[i]]
    if not fresh_rows:
        return 0.0
    engine = pad_rows([v if v is not None else [] for v in batch.behavior_logp], sb)
    diff = (logp.detach() - engine.to(logp.device)).abs() * sb.response_mask
    return float(diff[fresh_rows].sum())
