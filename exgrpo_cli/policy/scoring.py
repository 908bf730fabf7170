"""Scores of replay candidates under the *current* policy, for trajectory selection (ALGORITHM.md 3).

Where it sits in the step: between question selection and the choice of the trajectory, for the
rules whose `score` asks for it (replay/trajectory.py). All stored experiences of the selected
questions go through batched no-grad forwards; the score is the mean full-vocabulary token entropy
of softmax(logits / T) over the response (`entropy`), or the mean negative log-likelihood at
temperature 1 (`nll`). Only the selected questions' experiences are scored.
"""

from __future__ import annotations

from typing import Literal

import torch

from exgrpo_cli.algo.logprobs import token_entropy, token_logprobs
from exgrpo_cli.policy.forward import micro_batches, pack, response_logits


@torch.no_grad()
def score_candidates(
    model: torch.nn.Module,
    prompts: list[list[int]],
    responses: list[list[int]],
    *,
    kind: Literal["entropy", "nll"],
    temperature: float,
    pad_id: int,
    token_budget: int,
    max_rows: int,
) -> list[float]:
    """One score per (prompt, response) row: its mean token entropy, or its mean NLL (kind=nll)."""
    if not responses:
        return []
    device = next(model.parameters()).device
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    scores = [0.0] * len(responses)
    was_training = model.training
    model.eval()
    try:
        for chunk in micro_batches(lengths, token_budget):
            for start in range(0, len(chunk), max_rows):
                rows = chunk[start : start + max_rows]
                batch = pack(prompts, responses, rows, pad_id, device)
                logits = response_logits(model, batch)  # response positions only
                if kind == "nll":
                    per_tok = -token_logprobs(logits, batch.targets, 1.0)
                else:
                    per_tok = token_entropy(logits, temperature)
                m = batch.response_mask
                mean = (per_tok * m).sum(-1) / m.sum(-1).clamp(min=1.0)
                for i, v in zip(rows, mean.tolist()):
                    scores[i] = v
    finally:
        model.train(was_training)
    return scores
