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

from exgrpo_cli.policy.forward import forward_logprobs, micro_batches, pack


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
                if kind == "nll":
                    logp, _ = forward_logprobs(model, batch)
                    per_tok = -logp
                else:
                    _, ent = forward_logprobs(model, batch, temperature=temperature, with_entropy=True)
                    assert ent is not None
                    per_tok = ent
                m = batch.response_mask
                mean = (per_tok * m).sum(-1) / m.sum(-1).clamp(min=1.0)
                for i, v in zip(rows, mean.tolist()):
                    scores[i] = v
    finally:
        model.train(was_training)
    return scores
