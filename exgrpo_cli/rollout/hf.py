"""Rollouts on the trainer's own Hugging Face model (the CPU default).

It samples from the very module being trained, so a weight sync costs nothing. All prompts of a
call go through the decode loop in chunks of at most `max_batch` sequences, left-padded; the
per-token log-probs are those of softmax(logits / T) at the sampling temperature T, as the
trainer computes them (docs/algorithm.md §4), before top-p. The loop is exgrpo's own
(`sampling.py`: finished rows leave the batch, no per-step logits kept); `hf_generate=True`, and a
run sharded over several ranks, use HF `generate` instead, whose `synced_gpus` keeps the ranks'
forwards (collectives) in step (one GPU, FSDP2-wrapped alone, keeps exgrpo's loop: it has no other
rank to wait for).

`generate` keeps the raw logits of every step until it returns: sequences x new tokens x vocab
floats. With a real vocabulary that is large (256 x 128 x 49k fp32 = 6.4 GB for SmolLM2), so on
that path chunks are also cut to keep it under `logits_budget_bytes`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import torch

from exgrpo_cli.parallel.fsdp import is_sharded, module_device
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.rollout.base import Rollout, SamplingSpec, eos_token_ids
from exgrpo_cli.rollout.sampling import SampledBatch, sample

if TYPE_CHECKING:
    from transformers import GenerationMixin, PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# past both, sampling with the trainer's HF module is far slower than vLLM (warned at construction)
SLOW_PARAMS = 1_000_000_000
SLOW_NEW_TOKENS = 2048


class HFEngine:
    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_batch: int = 256,
        logits_budget_bytes: int = 1 << 30,
        hf_generate: bool = False,
        max_new_tokens: int | None = None,
    ) -> None:
        """`max_new_tokens`: the longest responses the run asks for (only for the warning about
        large models and long responses on a GPU)."""
        self.model = model
        self.hf_generate = hf_generate
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.logits_budget_bytes = logits_budget_bytes
        self.eos_ids = eos_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        if max_new_tokens is not None:
            msg = slow_generation_warning(model, max_new_tokens)
            if msg:
                log.warning(msg)

    def sync_weights(self, model: torch.nn.Module) -> float:
        # the trainer's own HF model (the engine was built from it): nothing to copy
        self.model = cast("PreTrainedModel", model)
        return 0.0

    def release(self, keep_weights: bool = False) -> None:
        pass  # samples from the trainer's own module: no memory of its own to give back

    def close(self) -> None:
        pass

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: list[int], spec: SamplingSpec) -> list[Rollout]:
        flat = [(i, ids) for i, (ids, k) in enumerate(zip(prompt_ids, n)) for _ in range(k)]
        gen = torch.Generator(device="cpu").manual_seed(spec.seed)
        out: list[Rollout] = []
        was_training = self.model.training
        self.model.eval()
        head = self.model.get_output_embeddings()
        vocab = int(head.weight.shape[0]) if head is not None else int(self.model.config.vocab_size)
        per_seq = max(spec.max_new_tokens, 1) * vocab * 4  # fp32 logits kept per sequence
        # an FSDP-sharded model (several ranks): every forward is a collective. A model each rank
        # holds whole (exgrpo eval's ranks) samples on its own, with exgrpo's loop
        parallel = DataParallel.of_process_group(module_device(self.model))
        synced = parallel.distributed and is_sharded(self.model)
        own_loop = not (self.hf_generate or synced)
        # only HF generate keeps every step's logits: the own loop needs no logits budget
        chunk_size = (
            self.max_batch if own_loop else max(1, min(self.max_batch, self.logits_budget_bytes // per_seq))
        )
        starts: list[int | None] = list(range(0, len(flat), chunk_size))
        if synced:  # ... so every rank makes as many generate calls (an idle rank feeds a dummy row)
            starts += [None] * (parallel.equal_calls(len(starts)) - len(starts))
        try:
            for start in starts:
                chunk = flat[start : start + chunk_size] if start is not None else [(-1, [self.pad_id])]
                if own_loop:
                    out.extend(self._sample_chunk(chunk, spec, gen))
                    continue
                # HF sampling draws from the global RNG: seed it from our own generator per chunk
                torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
                res = self._generate_chunk(chunk, spec, synced)
                if start is not None:
                    out.extend(res)
        finally:
            self.model.train(was_training)
        return out

    def _left_padded(self, chunk: list[tuple[int, list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(ids) for _, ids in chunk)
        input_ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, (_, ids) in enumerate(chunk):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        return input_ids, attention

    def _sample_chunk(
        self, chunk: list[tuple[int, list[int]]], spec: SamplingSpec, gen: torch.Generator
    ) -> list[Rollout]:
        device = module_device(self.model)
        input_ids, attention = self._left_padded(chunk)
        # the draws use a generator on the model's device, seeded from the call's own generator
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        res = sample(
            self.model,
            input_ids.to(device),
            attention.to(device),
            max_new_tokens=spec.max_new_tokens,
            eos_ids=self.eos_ids,
            temperature=spec.temperature,
            top_p=spec.top_p,
            generator=torch.Generator(device=device).manual_seed(seed),
        )
        return _rollouts(chunk, res)

    def _generate_chunk(
        self, chunk: list[tuple[int, list[int]]], spec: SamplingSpec, synced: bool = False
    ) -> list[Rollout]:
        device = module_device(self.model)
        width = max(len(ids) for _, ids in chunk)
        input_ids, attention = self._left_padded(chunk)
        # AutoModelForCausalLM's classes mix GenerationMixin into PreTrainedModel; asked for a dict
        # with the logits, generate returns an output with .sequences and .logits
        res: Any = cast("GenerationMixin", self.model).generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            do_sample=True,
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=0,
            max_new_tokens=spec.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
            synced_gpus=synced,  # keep stepping until every rank is done (FSDP collectives)
        )
        new = res.sequences[:, width:]
        # raw logits of each generated position, step by step (no [steps, B, V] copy): the
        # log-probs of the drawn tokens at the sampling temperature, [B, steps]
        scaled = (step.float() / spec.temperature for step in res.logits)
        logp = torch.stack(
            [
                torch.gather(step, -1, new[:, t : t + 1]).squeeze(-1) - torch.logsumexp(step, -1)
                for t, step in enumerate(scaled)
            ],
            dim=1,
        ).cpu()
        new = new.cpu()
        is_eos = torch.isin(new, torch.tensor(self.eos_ids))
        finished = is_eos.any(-1)
        lengths = (~is_eos).long().cumprod(-1).sum(-1) + finished  # up to the first EOS, included
        return _rollouts(chunk, SampledBatch(new, logp, lengths, finished))


def _rollouts(chunk: list[tuple[int, list[int]]], res: SampledBatch) -> list[Rollout]:
    """One Rollout per row of `chunk`: the row's tokens and log-probs cut at its length."""
    toks, logps = res.tokens.tolist(), res.logprobs.tolist()  # one conversion, then list slices
    ends = zip(chunk, res.lengths.tolist(), res.finished.tolist())
    return [
        Rollout(prompt_index=pidx, response_ids=toks[row][:n], logprobs=logps[row][:n], finished=f)
        for row, ((pidx, _), n, f) in enumerate(ends)
    ]


def slow_generation_warning(model: torch.nn.Module, max_new_tokens: int) -> str | None:
    """One line when a GPU run samples long responses from a large model with this engine: each
    decoding step is a forward of the whole model (under FSDP a gather of all its weights), so a
    7B model with 8k-token responses runs for hours a step where vLLM takes minutes."""
    if module_device(model).type != "cuda":
        return None
    # DTensor parameters (FSDP2) report the full parameter's size
    params = sum(p.numel() for p in model.parameters())
    if params <= SLOW_PARAMS or max_new_tokens <= SLOW_NEW_TOKENS:
        return None
    sharded = (
        " (under FSDP every step gathers the full model)"
        if DataParallel.of_process_group().distributed
        else ""
    )
    return (
        f"rollout.engine=hf samples {max_new_tokens}-token responses from a {params / 1e9:.1f}B-parameter "
        f"model one token at a time through the trainer's module{sharded}: very slow; "
        "use rollout=vllm (pip install 'exgrpo[gpu]')"
    )
