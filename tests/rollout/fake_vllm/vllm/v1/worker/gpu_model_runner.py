"""The model runner's weight reload, as vLLM 0.32 declares it (gpu_model_runner.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


class GPUModelRunner:
    def reload_weights(
        self,
        weights_iterator: Iterable[tuple[str, torch.Tensor]] | None = None,
        weights_path: str | None = None,
        is_checkpoint_format: bool = True,
    ) -> None:
        from vllm import EVENTS

        assert weights_iterator is not None
        # an iterator, consumed as it goes: never a whole dict of tensors handed over at once
        assert isinstance(weights_iterator, Iterator), type(weights_iterator)
        for name, tensor in weights_iterator:
            EVENTS.append(
                {
                    "call": "load",
                    "name": name,
                    "dtype": str(tensor.dtype).removeprefix("torch."),
                    "shape": list(tensor.shape),
                    "sum": float(tensor.double().sum()),
                }
            )
