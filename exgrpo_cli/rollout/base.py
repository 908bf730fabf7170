"""The engine protocol shared by the HF and vLLM engines."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 0  # one seed per call: rollouts are reproducible given (weights, seed)
    # False: vLLM samples without per-request seeds (its batched sampler; a repeated or resumed
    # call then draws other samples). Seeded vLLM requests draw their noise one request at a time
    # at every decoding step and skip FlashInfer's top-p/top-k kernel. The HF engine seeds anyway
    # (one generator per call costs nothing there).
    seeded: bool = True


@dataclass
class Rollout:
    """One sampled response to one prompt."""

    prompt_index: int  # index into the prompts of the generate call
    response_ids: list[int]  # sampled tokens, the end-of-sequence token included when emitted
    logprobs: list[float] | None  # per response token, under softmax(logits / sampling temperature)
    finished: bool  # True when the response ended with end-of-sequence (not truncated)


class RolloutEngine(Protocol):
    def generate(self, prompt_ids: list[list[int]], n: list[int], spec: SamplingSpec) -> list[Rollout]:
        """n[i] samples of prompt i; results grouped by prompt in prompt order."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> float:
        """Make the engine sample from `model`'s current weights; returns seconds spent. Wakes a
        released engine's weights (not its KV cache)."""
        ...

    def release(self, keep_weights: bool = False) -> None:
        """Called right after generating: give the device memory the engine holds back to the
        trainer (vLLM on CUDA with sleep mode: sleep level 2, weights and KV cache dropped; else
        nothing). `sync_weights` and `generate` wake what they need (generate syncs the dropped
        weights again from the module the last sync read: a collective under FSDP).
        `keep_weights` (after validation, whose weights are the current ones): the weights wait in
        host memory (vLLM's level 1) and come back without a sync."""
        ...

    def close(self) -> None: ...


def decode_response(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """Response text for the reward: end-of-sequence/pad tokens dropped, other special tokens
    (e.g. a `</think>` added as a special token) kept, since the reward needs them."""
    drop = {t for t in (tokenizer.eos_token_id, tokenizer.pad_token_id) if t is not None}
    # one flat id list decodes to one string (decode's `str | list[str]` covers batches)
    return cast(str, tokenizer.decode([t for t in ids if t not in drop], skip_special_tokens=False))


def eos_token_ids(
    tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module | None = None, path: str | None = None
) -> list[int]:
    """End-of-sequence ids for both engines: the generation config's (of `model`, else read from
    the folder `path`) and the tokenizer's. Chat models often stop on `<|im_end|>` while the
    tokenizer's eos is `<|endoftext|>`: without the generation config, responses would run to the
    token limit."""
    gen: Any = getattr(model, "generation_config", None)
    if gen is None and path:
        from transformers import GenerationConfig

        try:
            gen = GenerationConfig.from_pretrained(path)
        except (OSError, ValueError) as err:
            # a folder without generation_config.json is common (base models, our tiny one); one
            # that has an unreadable one is a problem worth seeing
            if os.path.isfile(os.path.join(os.path.expanduser(path), "generation_config.json")):
                log.warning(
                    "could not read %s/generation_config.json (%s): stopping on the tokenizer's eos only",
                    path,
                    err,
                )
            gen = None
    found = [getattr(gen, "eos_token_id", None), tokenizer.eos_token_id]
    flat = [x for c in found for x in (c if isinstance(c, (list, tuple)) else [c]) if x is not None]
    ids = list(dict.fromkeys(int(x) for x in flat))  # in order, each once
    if not ids:
        raise ValueError("the tokenizer and the model define no end-of-sequence token")
    return ids
