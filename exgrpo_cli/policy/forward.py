"""Teacher-forced forward passes over prompt+response sequences, scoring only response tokens.

Where it sits in the step: every forward of the trainer's model outside generation. The update
(step/update.py) runs its loss forward and pi_old's no-grad pass through `forward_logprobs`, the
replay candidates' scoring (policy/scoring.py) its no-grad one; `synced_micro_batches` cuts their
rows into memory-sized micro-batches, the same number on every rank.

Layout of a packed batch (the one the rollout saw, and TRL's): each prompt is left-padded to the
longest prompt P of the batch and each response right-padded to the longest response R, so every
row's response starts at column P; position ids count from each row's first real token, as in
generation. The hidden state at column P-1+j predicts response token j. The default path
(`forward_logprobs` with a plain linear head: Qwen2, Llama, Mistral, SmolLM2) takes the final
hidden states of the response positions and projects them onto the vocabulary in chunks of tokens
(algo/logprobs.py), so no [tokens x vocabulary] tensor exists in forward or backward. Models whose
logits are biased, scaled or soft-capped take the full-logits path (`response_logits`), which
still projects only the last R+1 positions (`logits_to_keep`, when the model takes it). Rows are
grouped into micro-batches by a token budget (length-sorted, so padding stays small) to keep
memory bounded for long responses.

All per-token outputs are response-aligned: [B, R], column j = response token j, masked by
`response_mask` beyond each row's length.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from exgrpo_cli.algo.logprobs import chunked_token_logprobs, token_entropy, token_logprobs
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy.head import head_compute_dtype


@dataclass
class SequenceBatch:
    input_ids: Tensor  # [B, P+R] long: left-padded prompt, then right-padded response
    attention_mask: Tensor  # [B, P+R] long
    position_ids: Tensor  # [B, P+R] long: 0 at each row's first real token
    response_mask: Tensor  # [B, R] float: 1 on each row's response tokens
    rows: list[int]  # indices of these rows in the caller's list

    @property
    def targets(self) -> Tensor:
        """The response tokens [B, R] (pad beyond each row's length)."""
        return self.input_ids[:, self.input_ids.shape[1] - self.response_mask.shape[1] :]


def pack(
    prompts: list[list[int]], responses: list[list[int]], rows: list[int], pad_id: int, device: torch.device
) -> SequenceBatch:
    P = max(len(prompts[i]) for i in rows)
    R = max(len(responses[i]) for i in rows)
    # one tensor conversion for the whole batch instead of one per row
    ids = torch.tensor(
        [
            [pad_id] * (P - len(prompts[i]))
            + list(prompts[i])
            + list(responses[i])
            + [pad_id] * (R - len(responses[i]))
            for i in rows
        ],
        dtype=torch.long,
    )
    plen = torch.tensor([len(prompts[i]) for i in rows])[:, None]
    rlen = torch.tensor([len(responses[i]) for i in rows])[:, None]
    col = torch.arange(P + R)[None, :]
    att = ((col >= P - plen) & (col < P + rlen)).long()
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    resp = (torch.arange(R)[None, :] < rlen).float()
    return SequenceBatch(ids.to(device), att.to(device), pos.to(device), resp.to(device), list(rows))


AUTO_TOKEN_BUDGET = {"cuda": 16384, "cpu": 2048}


def token_budget(configured: int, device: torch.device) -> int:
    """`algo.micro_batch_tokens`, with 0 meaning the device's default: big chunks keep a GPU busy,
    while on a CPU small ones run faster (their activations stay in cache)."""
    return configured if configured > 0 else AUTO_TOKEN_BUDGET.get(device.type, AUTO_TOKEN_BUDGET["cuda"])


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


def synced_micro_batches(
    prompts: list[list[int]],
    responses: list[list[int]],
    rows: list[int],
    token_budget: int,
    pad_id: int,
    device: torch.device,
    parallel: DataParallel,
    max_rows: int | None = None,
) -> Iterator[tuple[SequenceBatch, bool]]:
    """`rows` packed into token-budget micro-batches (each cut further into pieces of at most
    `max_rows` rows when given), as (batch, idle) pairs, the same number on every rank. Under FSDP
    every forward (and backward) is a collective, so a rank with fewer micro-batches than another
    runs `idle` passes on one row (row 0 of the lists when this rank has no rows at all): take
    part, add nothing (`DataParallel.equal_calls`). Every pass over rows that may be cut
    differently per rank (update, old log-probs, the replay candidates' scores) goes through here."""
    lengths = [len(prompts[i]) + len(responses[i]) for i in rows]
    chunks = micro_batches(lengths, token_budget)
    if max_rows is not None:
        chunks = [c[start : start + max_rows] for c in chunks for start in range(0, len(c), max_rows)]
    most = parallel.equal_calls(len(chunks))
    for k in range(most):
        if k < len(chunks):
            yield pack(prompts, responses, [rows[c] for c in chunks[k]], pad_id, device), False
        else:
            yield pack(prompts, responses, rows[:1] or [0], pad_id, device), True


# model class -> whether its forward accepts logits_to_keep (asked once per class)
_TAKES_LOGITS_TO_KEEP: dict[type[torch.nn.Module], bool] = {}


def _forward(model: torch.nn.Module, batch: SequenceBatch, keep: int) -> Any:
    """The model's forward over `batch`, with `logits_to_keep=keep` when its forward takes it
    (transformers' models do; a remote-code model may not), else without: it projects every
    position and the caller cuts. Read from the signature, once per class: calling and catching a
    TypeError would also swallow a TypeError raised inside a forward that does take it, and run
    that forward twice."""
    cls = type(model)
    takes = _TAKES_LOGITS_TO_KEEP.get(cls)
    if takes is None:
        params = inspect.signature(cls.forward).parameters.values()
        takes = any(p.name == "logits_to_keep" or p.kind is p.VAR_KEYWORD for p in params)
        _TAKES_LOGITS_TO_KEEP[cls] = takes
    return model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        **({"logits_to_keep": keep} if takes else {}),
    )


def response_logits(model: torch.nn.Module, batch: SequenceBatch) -> Tensor:
    """Logits [B, R, V] of the positions that predict the response tokens."""
    keep = batch.response_mask.shape[1] + 1
    return _forward(model, batch, keep).logits[:, -keep:-1]


# largest fp32 [chunk x vocabulary] temporary of the chunked projection (algo.logprobs): 441 tokens
# a chunk at Qwen2.5's 152,064-token vocabulary, the whole micro-batch at the tiny model's 364
LOGIT_CHUNK_BYTES = 256 * 2**20


def chunk_tokens(vocab_size: int, chunk_bytes: int = LOGIT_CHUNK_BYTES) -> int:
    return max(16, chunk_bytes // (4 * max(vocab_size, 1)))


def output_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The output projection when logits are exactly `hidden @ head.weight.T` (Qwen2, Llama,
    Mistral, SmolLM2 ...), so they can be computed in chunks from the final hidden states; None for
    models whose logits are biased, scaled or soft-capped (they take the full-logits path)."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    hf_config = getattr(model, "config", None)
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or not hasattr(model, "get_decoder"):
        return None
    if getattr(hf_config, "final_logit_softcapping", None) or hasattr(hf_config, "logit_scale"):
        return None
    if getattr(hf_config, "logits_scaling", 1.0) not in (None, 1.0):
        return None
    return head


def final_hidden_states(model: torch.nn.Module, batch: SequenceBatch) -> Tensor:
    """The decoder's final (normed) hidden states [B, P+R, H], from a forward of the whole model.

    The model's own forward runs (projecting only the last position), not its decoder alone: under
    FSDP2 the root unit owns the embedding, final norm and output head, and only the root's forward
    gathers them (and, the root not resharding after forward, keeps the head gathered for the
    chunked projection and its backward)."""
    captured: list[Tensor] = []
    handle = model.get_decoder().register_forward_hook(  # type: ignore[operator]
        lambda module, args, output: captured.append(output.last_hidden_state)
    )
    try:
        _forward(model, batch, 1)
    finally:
        handle.remove()
    return captured[-1]


def forward_logprobs(
    model: torch.nn.Module,
    batch: SequenceBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_bytes: int = LOGIT_CHUNK_BYTES,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs [B, R] of the response tokens (and per-token entropies when asked), zero beyond
    each row's response. Computed from the final hidden states in chunks of tokens (no
    [tokens x vocabulary] tensor in forward or backward) when the model's head allows it."""
    head = output_head(model)
    if head is None:
        logits = response_logits(model, batch)
        logp = token_logprobs(logits, batch.targets, temperature) * batch.response_mask
        ent = token_entropy(logits, temperature) * batch.response_mask if with_entropy else None
        return logp, ent
    R = batch.response_mask.shape[1]
    hidden = final_hidden_states(model, batch)[:, -R - 1 : -1]  # position P-1+j predicts token j
    mask = batch.response_mask.bool()
    lp, ent = chunked_token_logprobs(
        hidden[mask],
        head.weight,
        batch.targets[mask],
        temperature=temperature,
        chunk_tokens=chunk_tokens(head.weight.shape[0], chunk_bytes),
        with_entropy=with_entropy,
        compute_dtype=head_compute_dtype(head),
    )
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return zeros.masked_scatter(mask, lp), None if ent is None else zeros.masked_scatter(mask, ent)


def pad_rows(values: list[list[float]], batch: SequenceBatch) -> Tensor:
    """Per-response-token values (e.g. stored behaviour log-probs) laid out like `batch`'s log-probs."""
    R = batch.response_mask.shape[1]
    rows = [list(values[i][:R]) + [0.0] * (R - min(len(values[i]), R)) for i in batch.rows]
    return torch.tensor(rows, dtype=batch.response_mask.dtype, device=batch.response_mask.device)
