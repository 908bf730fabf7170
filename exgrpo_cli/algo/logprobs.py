"""Per-token log-probabilities and entropies from logits.

Used twice per step: in the training forward (log-probs with gradient, entropy bonus) and in the
no-grad scoring of replay candidates (`masked_mean` of the token entropies, docs/algorithm.md §3:
the score the official code computes wrongly, issue #57 there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class CandidateScore:
    """What a trajectory rule (replay/trajectory.py) scores each stored response by under the
    current policy: a per-token value averaged over the response (`masked_mean`). A new score is
    one more instance here."""

    name: str
    needs_entropy: bool  # the scoring forward computes the full-vocabulary entropies too
    per_token: Callable[[Tensor, Tensor | None], Tensor]  # (log-probs [B,T], entropies [B,T]) -> [B,T]


def _entropy(logp: Tensor, ent: Tensor | None) -> Tensor:
    assert ent is not None  # needs_entropy: the forward computed them
    return ent


# the full-vocabulary token entropy of softmax(logits / T); the response tokens' NLL under it
ENTROPY = CandidateScore("entropy", needs_entropy=True, per_token=_entropy)
NLL = CandidateScore("nll", needs_entropy=False, per_token=lambda logp, ent: -logp)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of each row's values over its masked positions: [B,T], mask [B,T] -> [B]. Rows with
    no masked position get 0 (not nan). A replay candidate's score is this mean of its tokens'
    entropies or negative log-likelihoods (docs/algorithm.md §3)."""
    m = mask.to(values.dtype)
    return (values * m).sum(-1) / m.sum(-1).clamp(min=1.0)


# ----------------------------------------------------------------------------- from hidden states
# The vocabulary projection of a whole micro-batch would be a [tokens x vocabulary] tensor: with
# Qwen2.5's 152,064 tokens, ~600 MB in fp32 per thousand tokens, several copies of it in forward
# and backward. Here the projection runs on `chunk_tokens` rows at a time, in forward and again in
# backward (recomputed, never stored), so the largest temporaries are [chunk_tokens x vocabulary].


def _chunk_stats(
    hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float
) -> tuple[Tensor, Tensor, Tensor]:
    """fp32 (logits / T, logsumexp, target log-prob) of one chunk. The matmul runs in the dtype
    of `weight` as given (the head's: bf16 under mixed precision; its fp32 copy with an fp32 head),
    the softmax maths in fp32."""
    z = (hidden.to(weight.dtype) @ weight.t()).float()
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)
    return z, lse, z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse


class _ChunkedHead(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,  # torch's FunctionCtx, which declares none of the attributes it carries
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        temperature: float,
        chunk: int,
        with_entropy: bool,
        compute_dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        w = weight.to(compute_dtype)  # the weight itself unless an fp32 head asks for a copy
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ent = torch.zeros(n if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk):
            z, lse, lp = _chunk_stats(hidden[s : s + chunk], w, targets[s : s + chunk], temperature)
            logp[s : s + chunk] = lp
            if with_entropy:  # H = -sum_j p_j log p_j, as token_entropy computes it
                logp_all = z - lse.unsqueeze(-1)
                ent[s : s + chunk] = -(logp_all.exp() * logp_all).sum(-1)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.temperature, ctx.chunk, ctx.with_entropy = temperature, chunk, with_entropy
        ctx.compute_dtype = compute_dtype
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor, g_ent: Tensor) -> tuple[Tensor | None, ...]:
        hidden, weight, targets = ctx.saved_tensors
        temperature, chunk, with_entropy = ctx.temperature, ctx.chunk, ctx.with_entropy
        # the softmax recomputed as the forward computed it (an fp32 head: from the fp32 copy);
        # the gradients' matmuls then run in the weight's dtype, as without an fp32 head
        w = weight.to(ctx.compute_dtype)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        # in the weight's dtype, as its gradient will be: an fp32 copy of a 152k x 3.5k bf16 head
        # would be 2.2 GB more
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], chunk):
            h, t = hidden[s : s + chunk], targets[s : s + chunk]
            z, lse, _ = _chunk_stats(h, w, t, temperature)
            logp_all = z - lse.unsqueeze(-1)
            p = logp_all.exp()
            # d log p_t / d z = onehot(t) - p
            g = -p * g_logp[s : s + chunk].unsqueeze(-1)
            g.scatter_add_(-1, t.unsqueeze(-1), g_logp[s : s + chunk].unsqueeze(-1))
            if with_entropy:  # d H / d z_j = -p_j (log p_j + H)
                h_ent = -(p * logp_all).sum(-1, keepdim=True)
                g -= p * (logp_all + h_ent) * g_ent[s : s + chunk].unsqueeze(-1)
            if temperature != 1.0:
                g = g / temperature
            g = g.to(weight.dtype)
            if grad_h is not None:
                grad_h[s : s + chunk] = (g @ weight).to(hidden.dtype)
            if grad_w is not None:
                grad_w.addmm_(g.t(), h.to(weight.dtype))
        return grad_h, grad_w, None, None, None, None, None


def chunked_token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
    compute_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs (and entropies) of softmax(hidden @ weight.T / T), without ever holding
    more than `chunk_tokens` rows of logits, in forward or backward.

    hidden [N, H] (the final hidden states of the positions that predict `targets`), weight [V, H]
    (the output embedding), targets long [N] -> (log p(target) [N] fp32, entropy [N] fp32 or None).
    Values and gradients (with respect to hidden and weight) equal `token_logprobs` /
    `token_entropy` on the full logits. `compute_dtype`: the logits' matmul dtype (None: the
    weight's; torch.float32 for an fp32 head, policy/head.py: one fp32 copy of the weight per pass).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden [N, H] and weight [V, H] expected, got {tuple(hidden.shape)}, {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets {tuple(targets.shape)} must be [N] for hidden {tuple(hidden.shape)}")
    apply: Callable[..., tuple[Tensor, Tensor]] = _ChunkedHead.apply  # torch leaves `apply` untyped
    dtype = weight.dtype if compute_dtype is None else compute_dtype
    logp, ent = apply(
        hidden, weight, targets, float(temperature), max(1, int(chunk_tokens)), with_entropy, dtype
    )
    return logp, ent if with_entropy else None
