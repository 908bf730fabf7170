"""The vLLM worker extension that loads the trainer's new weights into a running vLLM engine.

Where it sits in the step: at the very end, after the optimizer step, `VLLMEngine.sync_weights`
calls these methods on every vLLM worker through `LLM.collective_rpc`. vLLM mixes this class into
its worker class when the engine is built with
`worker_extension_cls="exgrpo_cli.rollout.vllm_ext.WeightSyncExtension"`, so `self` is the worker
and `self.model_runner` its model runner; the module must therefore stay importable inside a
worker process (no heavy imports beyond what the worker already has).

Method names carry an `exgrpo_` prefix because vLLM refuses an extension whose attribute names
collide with the worker's own (e.g. `update_weights`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

WorkerWeights = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
CHECKSUM_MOD = 1 << 40  # checksums are kept below this: a sum over ranks stays exact in float64
INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_checksum(t: torch.Tensor) -> int:
    """The sum of a tensor's bit patterns read as integers, mod CHECKSUM_MOD: exact and independent
    of the summing order, so the same values give the same checksum however they are sharded or
    sliced (the sum of the parts' checksums, mod CHECKSUM_MOD), and a single flipped bit changes it.
    (An int64 sum that wraps stays right mod 2^40, a divisor of 2^64.)"""
    flat = t.detach().contiguous().reshape(-1)
    ints = flat.view(INT_OF_WIDTH[flat.element_size()])
    return int(ints.sum(dtype=torch.int64).item()) % CHECKSUM_MOD


class WeightSyncExtension:
    """Mixed into vLLM's worker; `self.model_runner` is the worker's."""

    model_runner: Any  # the worker's (declared only: an attribute here would clash with it)

    def exgrpo_reload_weights(self, weights: WorkerWeights) -> int:
        """Load HF-named tensors in place (only possible in-process: with the engine in another
        process, tensors would arrive through RPC serialisation as nested lists)."""
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:  # the reload does not report the count
            nonlocal count
            for pair in weights.items() if isinstance(weights, Mapping) else weights:
                count += 1
                yield pair

        # reload_weights runs the model's own load_weights (HF names -> fused qkv / gate_up
        # params, tied lm_head) and then re-runs the post-load processing, unlike a raw
        # model.load_weights on an already-processed model
        self.model_runner.reload_weights(weights_iterator=counted())
        return count

    def exgrpo_checksums(self, names: list[str]) -> dict[str, tuple[int, int, str]]:
        """{name: (bits_checksum, elements, dtype)} of the named weights as this worker holds them
        (its slice under tensor parallelism); a name it does not hold, or holds emptied (a CPU
        kernel that repacked the weight elsewhere), is left out."""
        params = dict(self.model_runner.get_model().named_parameters())
        held = [(n, params[n]) for n in names if n in params and params[n].numel() > 0]
        return {n: (bits_checksum(p.data), p.numel(), str(p.dtype).removeprefix("torch.")) for n, p in held}

    def exgrpo_reload_file(self, path: str) -> int:
        """Load the tensors of a safetensors file (how weights cross into a separate engine
        process); safetensors rather than torch.load: no pickle, and it memory-maps the file."""
        from safetensors.torch import load_file

        return self.exgrpo_reload_weights(load_file(path, device="cpu"))
