"""Teacher-forced forward passes over prompt+response sequences.

Rows are concatenated prompt+response token ids, right-padded; position t predicts token t+1,
so the response mask is shifted by one against the inputs. Rows are grouped into micro-batches by
a token budget (length-sorted, so padding stays small) to keep memory bounded for long responses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from exgrpo_cli.algo.logprobs import token_entropy, token_logprobs


@dataclass
class SequenceBatch:
    input_ids: Tensor  # [B, L] long, right-padded prompt+response
    attention_mask: Tensor  # [B, L]
    response_mask: Tensor  # [B, L-1] float: 1 where target token t+1 is a response token
    rows: list[int]  # indices of these rows in the caller's list

    @property
    def targets(self) -> Tensor:
        return self.input_ids[:, 1:]


def pack(prompts: list[list[int]], responses: list[list[int]], rows: list[int], pad_id: int,
         device: torch.device) -> SequenceBatch:
    seqs = [prompts[i] + responses[i] for i in rows]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    resp = torch.zeros((len(rows), width - 1))
    for r, i in enumerate(rows):
        p, n = len(prompts[i]), len(responses[i])
        ids[r, :p + n] = torch.tensor(seqs[r])
        att[r, :p + n] = 1
        resp[r, p - 1:p - 1 + n] = 1.0
    return SequenceBatch(ids.to(device), att.to(device), resp.to(device), rows)


def micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Row indices grouped so that rows * longest row <= token_budget (at least one row each)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunks: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > token_budget:
            chunks.append(cur)
            cur = []
        cur.append(i)
    if cur:
        chunks.append(cur)
    return chunks


def forward_logprobs(model, batch: SequenceBatch, *, temperature: float = 1.0,
                     with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs [B, L-1] of the target tokens (and per-token entropies when asked)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   use_cache=False).logits[:, :-1]
    logp = token_logprobs(logits, batch.targets, temperature)
    ent = token_entropy(logits, temperature) if with_entropy else None
    return logp, ent


def pad_rows(values: list[list[float]], batch: SequenceBatch, prompt_lens: list[int]) -> Tensor:
    """Per-response-token values (e.g. stored behaviour log-probs) laid out like `batch`'s targets."""
    out = torch.zeros_like(batch.response_mask)
    for r, i in enumerate(batch.rows):
        v = values[i]
        start = prompt_lens[i] - 1
        out[r, start:start + len(v)] = torch.tensor(v, dtype=out.dtype)
    return out
