"""The HF engine's own decode loop: K samples per prompt with the log-prob of each token.

Why not `model.generate`: on a CPU the rollout of a step is many small decode forwards, and
`generate` adds per-step work the trainer does not need (logits processors and stopping criteria
objects, a copy of every step's full-vocabulary logits when asked for them, and forwards for rows
that have already emitted end-of-sequence until the longest row is done). This loop keeps only
what a rollout needs:

- one prefill forward with `logits_to_keep=1` (no vocabulary projection of prompt positions);
- per step, one decode forward over the rows still generating: finished rows are dropped from the
  batch and the KV cache once they are at least `compact_share` of it, so the cost follows the
  live rows instead of the longest one;
- the log-prob of the drawn token under softmax(logits / T), T the sampling temperature (the
  trainer's log-probs use the same T, as the official actor's), is read from the step's logits at
  once, so no [steps, rows, vocab] tensor is ever kept; top-p does not renormalise it;
- sampling from softmax(logits / T) with top-p filtering, drawn with the caller's generator by
  inverting the CDF (one uniform per row, a binary search): on a CPU `torch.multinomial` took
  3.2 ms for 128 x 364 probabilities and 83 ms for 32 x 49k, the inverse CDF 0.3 ms and 15 ms.

Shapes: `input_ids`/`attention_mask` [B, W] left-padded; results [B, max_new_tokens] (tokens,
log-probs; zeros after a row's end) and [B] (lengths, finished flags).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class SampledBatch:
    tokens: Tensor  # [B, T] long, zeros after each row's length
    logprobs: Tensor  # [B, T] fp32 log-prob of each drawn token under softmax(logits / temperature)
    lengths: Tensor  # [B] long: tokens per row, the end-of-sequence token included
    finished: Tensor  # [B] bool: the row ended with end-of-sequence


def filter_top_p(logits: Tensor, top_p: float) -> Tensor:
    """Mask (to -inf) the tail of each row outside the smallest set of tokens whose probability
    reaches top_p; the most likely token always stays. [b, V] -> [b, V]."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop_sorted = cum <= (1.0 - top_p)
    drop_sorted[..., -1] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def draw(logits: Tensor, temperature: float, top_p: float, generator: torch.Generator) -> Tensor:
    """One token per row from softmax(filter_top_p(logits / T)). logits [b, V] fp32 -> [b] long.

    Inverse-CDF sampling: the CDF is accumulated in float64 so that even a 150k vocabulary's
    rounding cannot shift a token's interval noticeably; u in (0, total] and a left search
    never land on a zero-probability (top-p filtered) token."""
    if temperature != 1.0:
        logits = logits / temperature
    cdf = filter_top_p(logits, top_p).softmax(-1).double().cumsum(-1)
    u = 1.0 - torch.rand((len(cdf), 1), generator=generator, dtype=cdf.dtype, device=cdf.device)
    return torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    max_new_tokens: int,
    eos_ids: list[int],
    temperature: float,
    top_p: float,
    generator: torch.Generator,
    compact_share: float = 0.125,
) -> SampledBatch:
    B, device = input_ids.shape[0], input_ids.device
    T = max_new_tokens
    # results live on the model's device and come back once: no host round trip per token
    tokens = torch.zeros((B, T), dtype=torch.long, device=device)
    logprobs = torch.zeros((B, T), device=device)
    lengths = torch.full((B,), max(T, 0), dtype=torch.long, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    if T > 0 and B > 0:
        _decode(
            model,
            input_ids,
            attention_mask.long(),
            torch.tensor(eos_ids, device=device),
            temperature,
            top_p,
            generator,
            compact_share,
            (tokens, logprobs, lengths, finished),
        )
    return SampledBatch(tokens.cpu(), logprobs.cpu(), lengths.cpu(), finished.cpu())


def _decode(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention: Tensor,
    eos: Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator,
    compact_share: float,
    out: tuple[Tensor, ...],
) -> None:
    from transformers import DynamicCache

    tokens, logprobs, lengths, finished = out
    T = tokens.shape[1]
    cache = {_cache_kwarg(model): DynamicCache(config=model.config)}
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = _last_logits(model, input_ids, attention, positions, cache, logits_to_keep=1)
    rows = torch.arange(len(input_ids), device=input_ids.device)  # original row of each live batch row
    done = torch.zeros(len(rows), dtype=torch.bool, device=rows.device)  # ended, not yet dropped
    position = positions[:, -1:]
    for t in range(T):
        nxt = draw(logits, temperature, top_p, generator)
        scaled = logits / temperature if temperature != 1.0 else logits
        raw = scaled.gather(-1, nxt[:, None]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
        live = ~done
        # writes through `rows` (a fixed-size index): rows that ended earlier keep their values
        tokens[rows, t] = torch.where(live, nxt, tokens[rows, t])
        logprobs[rows, t] = torch.where(live, raw, logprobs[rows, t])
        hit = torch.isin(nxt, eos) & live
        lengths[rows] = torch.where(hit, t + 1, lengths[rows])
        finished[rows] = finished[rows] | hit
        done = done | hit
        n_done = int(done.sum())  # the one host sync of a step
        if t == T - 1 or n_done == len(rows):
            break
        if n_done >= compact_share * len(rows):
            keep = (~done).nonzero().squeeze(-1)
            next(iter(cache.values())).batch_select_indices(keep)
            rows, nxt, attention, position = rows[keep], nxt[keep], attention[keep], position[keep]
            done = done[keep]
        attention = torch.cat([attention, attention.new_ones((len(rows), 1))], dim=-1)
        position = position + 1
        logits = _last_logits(model, nxt[:, None], attention, position, cache)


def _last_logits(
    model: PreTrainedModel,
    ids: Tensor,
    attention: Tensor,
    positions: Tensor,
    cache: dict[str, Any],
    **keep: int,
) -> Tensor:
    """The fp32 logits of each row's last position, from a forward that extends the KV cache."""
    out = model(
        input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, **cache, **keep
    )
    return out.logits[:, -1].float()


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5.2x renamed `past_key_values` to `cache` (the old name warns until 5.40); the
    vLLM venv's older transformers only knows the old one."""
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"
