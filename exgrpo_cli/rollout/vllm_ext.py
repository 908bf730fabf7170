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


class _Counted:
    """Passes (name, tensor) pairs through while counting them (the reload does not report it)."""

    def __init__(self, weights: WorkerWeights) -> None:
        self._it = iter(weights.items() if isinstance(weights, Mapping) else weights)
        self.count = 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._it:
            self.count += 1
            yield name, tensor


class WeightSyncExtension:
    """Mixed into vLLM's worker; `self.model_runner` is the worker's."""

    model_runner: Any  # the worker's (declared only: an attribute here would clash with it)

    def exgrpo_reload_weights(self, weights: WorkerWeights) -> int:
        """Load HF-named tensors in place (only possible in-process: with the engine in another
        process, tensors would arrive through RPC serialisation as nested lists)."""
        counted = _Counted(weights)
        # reload_weights runs the model's own load_weights (HF names -> fused qkv / gate_up
        # params, tied lm_head) and then re-runs the post-load processing, unlike a raw
        # model.load_weights on an already-processed model
        self.model_runner.reload_weights(weights_iterator=iter(counted))
        return counted.count

    def exgrpo_reload_file(self, path: str) -> int:
        """Load the tensors of a safetensors file (how weights cross into a separate engine
        process); safetensors rather than torch.load: no pickle, and it memory-maps the file."""
        from safetensors.torch import load_file

        return self.exgrpo_reload_weights(load_file(path, device="cpu"))
