"""Per-token log-probabilities and entropies from logits.

Used twice per step: in the training forward (log-probs with gradient, entropy bonus) and in the
no-grad scoring of replay candidates (mean token entropy, ALGORITHM.md 3: the score the official
code computes wrongly, issue #57 there).
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / T)[target] per position. logits [B,T,V], targets long [B,T] -> [B,T] fp32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    # logsumexp instead of a full log_softmax: one [B,T,V] temporary fewer
    return picked - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Full-vocabulary entropy of softmax(logits / T) per position. [B,T,V] -> [B,T] fp32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def mean_token_entropy(logits: Tensor, mask: Tensor, temperature: float = 1.0) -> Tensor:
    """Mean entropy over the masked positions of each row. logits [B,T,V], mask [B,T] -> [B].

    Rows with no masked position get 0.
    """
    ent = token_entropy(logits, temperature)
    m = mask.to(ent.dtype)
    return (ent * m).sum(-1) / m.sum(-1).clamp(min=1.0)
