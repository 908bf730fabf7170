"""Scores of replay candidates under the *current* policy, for trajectory selection (docs/algorithm.md §3).

Where it sits in the step: between question selection and the choice of the trajectory, for the
rules whose `score` asks for it (replay/trajectory.py). Under torchrun the ranks share the work.
All stored experiences of the selected questions go through batched no-grad forwards; the score
is the mean full-vocabulary token entropy of softmax(logits / T) over the response (`entropy`), or
the mean negative log-likelihood under the same softmax(logits / T) (`nll`). Only the selected questions'
experiences are scored.
"""

from __future__ import annotations

import torch

from exgrpo_cli.algo.logprobs import CandidateScore, masked_mean
from exgrpo_cli.parallel.fsdp import local_dist
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy.forward import forward_logprobs, synced_micro_batches


@torch.no_grad()
def score_candidates(
    model: torch.nn.Module,
    prompts: list[list[int]],
    responses: list[list[int]],
    *,
    kind: CandidateScore,
    temperature: float,
    pad_id: int,
    token_budget: int,
    max_rows: int,
    parallel: DataParallel | None = None,
) -> list[float]:
    """One score per (prompt, response) row: the mean over its response of `kind`'s per-token value.

    Under torchrun (`parallel`) each rank scores every W-th candidate and the scores are all-gathered:
    every rank returns all of them. The forwards of an FSDP-sharded model are collectives, so every
    rank runs as many (a rank out of rows repeats one row and drops its score)."""
    if not responses:
        return []
    parallel = parallel if parallel is not None else local_dist(model)
    mine = parallel.mine(len(responses))
    # the compute device: under CPU offload the parameters are in host memory
    passes = synced_micro_batches(
        prompts, responses, mine, token_budget, pad_id, parallel.device, parallel, max_rows=max_rows
    )
    scores: dict[int, float] = {}
    was_training = model.training
    model.eval()
    try:
        for batch, idle in passes:
            logp, ent = forward_logprobs(
                model, batch, temperature=temperature, with_entropy=kind.needs_entropy
            )
            per_tok = kind.per_token(logp, ent)
            if idle:  # took part in the collective forwards; its row is another rank's
                continue
            scores.update(zip(batch.rows, masked_mean(per_tok, batch.response_mask).tolist()))
    finally:
        model.train(was_training)
        # FSDP2 keeps its root unit gathered after a forward (a backward would reshard it): these
        # no-grad passes free it themselves, before the rollout needs the memory
        reshard = getattr(model, "reshard", None)
        if callable(reshard):
            reshard()
    return parallel.merge(scores).in_order(len(responses))
