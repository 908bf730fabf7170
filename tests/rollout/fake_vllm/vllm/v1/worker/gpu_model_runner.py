"""The model runner's weight reload, as vLLM 0.32 declares it (gpu_model_runner.py): the tensors go
into the engine's existing weights (the stand-in's, vllm/_weights.py), which must be awake."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch

BROKEN_SYNC = "EXGRPO_STANDIN_BROKEN_SYNC"
# tests only: the first reload arrives, later ones return as usual but leave the weights as they
# were (stale but intact: what a reload that silently fails looks like with sleep mode off)
STALE_SYNC = "EXGRPO_STANDIN_STALE_SYNC"


class GPUModelRunner:
    owner: Any = None  # the stand-in LLM whose weights this runner holds
    reloads = 0

    def get_model(self) -> torch.nn.Module:
        """The model the worker runs (vLLM: unwrapped from its CUDA-graph wrapper): the stand-in's
        HF model, or an empty module when it has no model (a made-up path)."""
        model = self.owner.weights.model if self.owner is not None else None
        return model if model is not None else torch.nn.Module()

    def reload_weights(
        self,
        weights_iterator: Iterable[tuple[str, torch.Tensor]] | None = None,
        weights_path: str | None = None,
        is_checkpoint_format: bool = True,
    ) -> None:
        from vllm import EVENTS, StandInContractError

        assert weights_iterator is not None
        # an iterator, consumed as it goes: never a whole dict of tensors handed over at once
        assert isinstance(weights_iterator, Iterator), type(weights_iterator)
        if self.owner is not None and "weights" in self.owner.sleeping_tags:
            # the weights' memory is unmapped while they sleep: a copy into it faults on CUDA
            raise StandInContractError("reload_weights while the weights sleep: wake_up(['weights']) first")
        self.reloads += 1
        arrives = not os.environ.get(BROKEN_SYNC) and not (os.environ.get(STALE_SYNC) and self.reloads > 1)
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
            # BROKEN_SYNC (tests only): the reload returns as usual but the tensors never arrive,
            # what a corrupt reload on CUDA looks like from outside
            if self.owner is not None and arrives:
                self.owner.weights.load(name, tensor)
