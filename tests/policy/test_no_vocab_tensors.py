"""No [tokens x vocabulary] tensor in the update's forward and backward (issue #11 point 1), proven
exactly and cheaply: a dispatch mode records the shape of every tensor every op returns."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen2ForCausalLM

from exgrpo_cli.policy.forward import chunk_tokens, forward_logprobs, pack, response_logits

from conftest import tiny_qwen2

VOCAB = 4096
CHUNK_BYTES = 64 * 4 * VOCAB  # 64 tokens a chunk


class Shapes(TorchDispatchMode):
    """Records the shape of every tensor produced by an aten op while active."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def _model() -> Qwen2ForCausalLM:
    return tiny_qwen2(vocab=VOCAB, hidden=32, layers=1, heads=2, kv_heads=1, positions=512)


def _largest_vocab_tensor(chunked: bool) -> tuple[int, int]:
    """(largest numel among tensors with a vocabulary-sized dim, response tokens) over a forward
    and backward of the update's ingredients (log-probs with gradient and the entropy bonus)."""
    model = _model()
    g = torch.Generator().manual_seed(0)
    rows = 3
    prompts = [torch.randint(3, VOCAB, (20,), generator=g).tolist() for _ in range(rows)]
    responses = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (200, 180, 150)]
    sb = pack(prompts, responses, list(range(rows)), 0, torch.device("cpu"))
    with Shapes() as rec:
        if chunked:
            logp, ent = forward_logprobs(model, sb, with_entropy=True, chunk_bytes=CHUNK_BYTES)
        else:
            logits = response_logits(model, sb)
            logp = torch.log_softmax(logits.float(), -1).gather(-1, sb.targets.unsqueeze(-1)).squeeze(-1)
            ent = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
        assert ent is not None
        ((logp * sb.response_mask).sum() + 0.001 * (ent * sb.response_mask).sum()).backward()
    tokens = int(sb.response_mask.sum())
    largest = max((int(torch.Size(s).numel()) for s in rec.shapes if VOCAB in s), default=0)
    return largest, tokens


def test_the_update_holds_no_tokens_by_vocabulary_tensor() -> None:
    largest, tokens = _largest_vocab_tensor(chunked=True)
    assert chunk_tokens(VOCAB, CHUNK_BYTES) == 64 and tokens == 530
    # the largest vocabulary-wide tensors: one chunk's logits, and the head / embedding itself
    assert largest <= max(64 * VOCAB, VOCAB * 32), largest
    assert largest < tokens * VOCAB / 8


def test_the_recorder_sees_them_on_the_full_logits_path() -> None:
    """The check is not vacuous: projecting the whole micro-batch does create [B x R x V] tensors."""
    largest, tokens = _largest_vocab_tensor(chunked=False)
    assert largest >= tokens * VOCAB
