"""Low-rank adapters (model.lora): peft's LoRA layers injected into the HF model, in place.

Where it sits: before the step, where the policy is built (policy/model.py calls `apply_lora` on
the loaded model, before FSDP2 shards it), and around it, in every checkpoint (`save_adapter`,
`load_adapter`) and in the merged export (`merged_tensors`). The model stays the HF causal LM it
was (`model.model.layers`, `lm_head`, `generate`): peft replaces each targeted projection by a
LoRA layer that computes base(x) + (alpha / r) * B(A(dropout(x))), so every forward the step takes
(pi_old, replay scoring, entropies, the update, the HF engine's generation) goes through the
adapter with no other change. The base weights are frozen (requires_grad False): the optimizer,
built from the trainable parameters, holds the adapters' states only.

On disk the adapter is in peft's own format (adapter_model.safetensors + adapter_config.json),
so `PeftModel.from_pretrained(base, folder)` loads it in plain transformers. Written by rank 0
after each adapter tensor is gathered (a collective under FSDP2), as policy/export.py does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from exgrpo_cli.config.schema import LoraConfig, ModelConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.parallel.fsdp import MIXED_PRECISION, copy_full_into
from exgrpo_cli.parallel.offload import gather_full

if TYPE_CHECKING:
    from exgrpo_cli.parallel.sharding import DataParallel

ADAPTER_DIR = "adapter"  # a checkpoint's folder for the adapter (PEFT format)
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
ADAPTER = "default"  # peft's adapter name: in our parameter names, never in the files
MAX_ADAPTER_CONFIG_BYTES = 1 << 20
M = TypeVar("M", bound=torch.nn.Module)


def lora_on(cfg: LoraConfig) -> bool:
    return cfg.rank > 0


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` carries LoRA layers (apply_lora was called on it). Reads the mark apply_lora
    leaves, so that a full fine-tuning run never imports peft."""
    return getattr(model, "exgrpo_lora", None) is not None


def targets(model: torch.nn.Module, names: list[str]) -> dict[str, torch.nn.Linear]:
    """The Linear modules an adapter goes on: those whose last name part is one of `names` (peft's
    matching of a plain list), the LM head excluded (peft never adapts it for a causal LM)."""
    wanted = set(names)
    return {
        n: m
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in wanted and n != "lm_head"
    }


def check_targets(model: torch.nn.Module, cfg: LoraConfig, what: str) -> None:
    """UsageError (one line) unless every name of model.lora.target_modules matches a Linear of
    `model` (a meta model is enough: only the shapes are read) and the rank fits each target."""
    found = targets(model, cfg.target_modules)
    hit = {n.rsplit(".", 1)[-1] for n in found}
    missing = [t for t in cfg.target_modules if t not in hit]
    if missing:
        linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        have = sorted({n.rsplit(".", 1)[-1] for n in linear})
        raise UsageError(
            f"invalid model.lora.target_modules: {missing} match no linear layer of {what} "
            f"(its linear layers: {have[:12]})"
        )
    small = min(found.items(), key=lambda kv: min(kv[1].in_features, kv[1].out_features))
    dim = min(small[1].in_features, small[1].out_features)
    if cfg.rank > dim:
        raise UsageError(
            f"invalid model.lora.rank={cfg.rank}: larger than the dimension of {small[0]} "
            f"({small[1].in_features} -> {small[1].out_features}) in {what}; use a rank <= {dim}"
        )


def check_before_load(cfg: LoraConfig, hf_config: Any, what: str) -> None:
    """`check_targets` on the architecture built on the meta device from its HF config (no
    weights read): the refusal comes before any model loads."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    check_targets(model, cfg, what)


def peft_config(cfg: LoraConfig, base_name: str) -> Any:
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # annotated int; peft divides it by r as a float
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_name,
    )


def apply_lora(model: M, cfg: LoraConfig, base_name: str = "") -> M:
    """`model` with LoRA layers on the targets (rank 0: `model` untouched), base frozen and
    adapters trainable, in float32 (an adapter in bf16 would round its small updates away; the
    base stays in its own dtype). Returns the same object. The adapters' initial values (A random,
    B zero: the model's output is unchanged) come from torch's global RNG, seeded by the run."""
    if not lora_on(cfg):
        return model
    from peft import inject_adapter_in_model

    check_targets(model, cfg, base_name or type(model).__name__)
    config = peft_config(cfg, base_name)
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        adapter = is_adapter_name(name)
        p.requires_grad_(adapter)
        if adapter and p.dtype != torch.float32:
            p.data = p.data.float()
    model.exgrpo_lora = config  # type: ignore[assignment]  # read by save_adapter
    return model


def is_adapter_name(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def file_key(name: str) -> str:
    """Our parameter name -> the key peft writes: under `base_model.model.`, adapter name dropped."""
    return "base_model.model." + name.replace(f".{ADAPTER}.", ".")


def param_key(key: str) -> str:
    """A key of a peft adapter file -> our parameter name (file_key's inverse)."""
    name = key.removeprefix("base_model.model.")
    for part in ("lora_A", "lora_B"):
        name = name.replace(f".{part}.weight", f".{part}.{ADAPTER}.weight")
    return name


def adapter_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if is_adapter_name(n)}


def save_adapter(model: torch.nn.Module, folder: Path, parallel: DataParallel | None = None) -> None:
    """Write the adapter in peft's format into `folder` (rank 0 writes; a collective under FSDP2:
    every rank calls it, each adapter tensor is all-gathered)."""
    from safetensors.torch import save_file

    main = parallel is None or parallel.is_main
    tensors = {}
    for name, p in adapter_params(model).items():
        full = gather_full(p.detach())
        if main:
            tensors[file_key(name)] = full.to("cpu").contiguous().clone()
    if not main:
        return
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
    config: Any = getattr(model, "exgrpo_lora")  # noqa: B009 - set by apply_lora, undeclared
    config.save_pretrained(str(folder))  # adapter_config.json


def read_adapter_config(folder: Path) -> dict[str, Any]:
    """adapter_config.json as data (a size cap, a mapping), never trusted to choose code."""
    from exgrpo_cli.checkpoint import safe_read

    record = safe_read.read_json(folder / CONFIG, MAX_ADAPTER_CONFIG_BYTES)
    if not isinstance(record, dict):
        raise ValueError(f"{folder / CONFIG} is not a mapping")
    return record


def load_adapter(model: torch.nn.Module, folder: Path) -> None:
    """The adapter weights of `folder` (peft's format) into `model`'s adapters, each shape checked.
    Every rank reads the (small) file and keeps its own shard under FSDP2."""
    from safetensors.torch import load_file

    saved = {param_key(k): v for k, v in load_file(str(folder / WEIGHTS)).items()}
    own = adapter_params(model)
    if set(saved) != set(own):
        extra, missing = sorted(set(saved) - set(own)), sorted(set(own) - set(saved))
        raise ValueError(
            f"{folder / WEIGHTS} fits no adapter of this model (missing {missing[:3]}, extra {extra[:3]})"
        )
    with torch.no_grad():
        for name, param in own.items():
            full, p = saved[name], cast(Any, param)  # a DTensor under FSDP2
            if tuple(full.shape) != tuple(p.shape):
                raise ValueError(f"{folder / WEIGHTS}: {name} is {tuple(full.shape)}, not {tuple(p.shape)}")
            copy_full_into(p, full)  # an FSDP2 shard takes this rank's part of it


def recorded_shapes(folder: Path) -> dict[str, tuple[int, int]]:
    """Each adapted module's (in, out) features as the adapter file records them (A: r x in,
    B: out x r), keyed by module name, read from the safetensors header only."""
    from safetensors import safe_open

    shapes: dict[str, list[int]] = {}
    with safe_open(str(folder / WEIGHTS), framework="pt") as fh:
        for key in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
            module, _, part = param_key(key).rpartition(".lora_")
            shape = fh.get_slice(key).get_shape()
            slot = shapes.setdefault(module, [0, 0])
            if part.startswith("A"):
                slot[0] = int(shape[1])
            else:
                slot[1] = int(shape[0])
    return {m: (s[0], s[1]) for m, s in shapes.items()}


def base_mismatch(folder: Path, base_name: str, model: torch.nn.Module) -> str | None:
    """Why the adapter of `folder` does not belong on `model` (loaded from `base_name`), or None:
    the base it records by name, and each adapted module's shape."""
    record = read_adapter_config(folder)
    recorded = str(record.get("base_model_name_or_path") or "")
    if recorded and recorded != base_name:
        return f"the adapter in {folder} was trained on {recorded[:200]!r}, not on {base_name[:200]!r}"
    modules = dict(model.named_modules())
    for module, (fan_in, fan_out) in recorded_shapes(folder).items():
        m = modules.get(module)
        if m is None:
            return f"the adapter in {folder} adapts {module[:200]}, which {base_name[:200]!r} has not"
        base = getattr(m, "base_layer", m)
        got = (getattr(base, "in_features", -1), getattr(base, "out_features", -1))
        if got != (fan_in, fan_out):
            return (
                f"the adapter in {folder} adapts {module[:200]} as {fan_in} -> {fan_out}, "
                f"but {base_name[:200]!r} has it as {got[0]} -> {got[1]}"
            )
    return None


def lora_settings(folder: Path) -> LoraConfig:
    """The model.lora settings an adapter folder was written with (rank, alpha, dropout, targets),
    each checked to be a plain value of the right type."""
    record = read_adapter_config(folder)
    rank: Any = record.get("r")
    alpha: Any = record.get("lora_alpha")
    dropout: Any = record.get("lora_dropout", 0.0)
    names: Any = record.get("target_modules")
    if isinstance(names, str) or not isinstance(names, list):
        raise ValueError(f"{folder / CONFIG}: target_modules is not a list of names")
    ok = isinstance(rank, int) and not isinstance(rank, bool) and rank > 0
    ok = ok and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (alpha, dropout))
    ok = ok and all(isinstance(n, str) and n.isidentifier() for n in names)
    if not ok:
        raise ValueError(f"{folder / CONFIG}: r, lora_alpha, lora_dropout or target_modules is malformed")
    return LoraConfig(
        rank=int(rank), alpha=float(alpha), dropout=float(dropout), target_modules=sorted(names)
    )


# ----------------------------------------------------------------------------- merged export


def merged_tensors(model: torch.nn.Module, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for the state-dict `names` of a LoRA model as a plain HF model has
    them: each adapted projection's weight merged (W + alpha / r * B @ A), the adapter tensors left
    out, `.base_layer.` dropped from the names. A collective under FSDP2 (every rank iterates)."""
    from peft.tuners.lora import LoraLayer

    state = model.state_dict()
    layers = {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    for name in names:
        if is_adapter_name(name):
            continue
        full = gather_full(state[name])
        module, _, leaf = name.rpartition(".base_layer.")
        if module in layers and leaf == "weight":
            layer: Any = layers[module]
            a = gather_full(layer.lora_A[ADAPTER].weight.detach()).float()
            b = gather_full(layer.lora_B[ADAPTER].weight.detach()).float()
            scale = float(layer.scaling[ADAPTER])
            full = (full.float() + scale * (b @ a)).to(full.dtype)
            name = f"{module}.{leaf}"
        elif ".base_layer." in name:
            name = name.replace(".base_layer.", ".")
        yield name, full


def describe(model: torch.nn.Module) -> str:
    """One line for the log: trainable adapter parameters beside the total."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    share = 100 * trainable / max(total, 1)
    return f"LoRA: {trainable:,} trainable adapter parameters of {total:,} ({share:.2f}%)"


# ----------------------------------------------------------------------------- checks before loading


def check_base(cfg: ModelConfig, folder: str) -> None:
    """Before any weights load: model.lora's targets and rank against the architecture of the HF
    config in `folder` (model.path resolved). A GGUF file is checked at its load (apply_lora)."""
    if not lora_on(cfg.lora) or cfg.gguf_file:
        return
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(folder, trust_remote_code=cfg.trust_remote_code)
    check_before_load(cfg.lora, hf_config, cfg.path)


def resume_adapter(cfg: LoraConfig, base_name: str, checkpoint: Path) -> Path | None:
    """The adapter folder of `checkpoint` when the run trains LoRA (None for full fine-tuning),
    after refusing (UsageError, before any model loads) a checkpoint of the other kind, other
    LoRA settings, or an adapter trained on another base than `base_name` (model.path)."""
    folder = checkpoint / ADAPTER_DIR
    if not lora_on(cfg):
        if folder.is_dir():
            raise UsageError(
                f"{checkpoint} holds a LoRA adapter, and model.lora.rank=0: resume it with the "
                f"model.lora.* it was trained with (rank {_rank_of(folder)})"
            )
        return None
    if not folder.is_dir():
        raise UsageError(
            f"model.lora.rank={cfg.rank}, but {checkpoint} holds a fully fine-tuned model, no adapter: "
            "resume it without model.lora.rank, or start a new LoRA run from its model/ folder"
        )
    try:
        saved = lora_settings(folder)
        recorded = str(read_adapter_config(folder).get("base_model_name_or_path") or "")
    except (OSError, ValueError) as err:
        raise UsageError(f"{folder} cannot be used: {str(err)[:200]}") from None
    mine = (cfg.rank, cfg.alpha, cfg.dropout, sorted(cfg.target_modules))
    theirs = (saved.rank, saved.alpha, saved.dropout, saved.target_modules)
    if mine != theirs:
        raise UsageError(
            f"model.lora (rank, alpha, dropout, targets) = {mine}, but {checkpoint} was trained with "
            f"{theirs}: resume with those settings"
        )
    if recorded != base_name:
        raise UsageError(
            f"model.path={base_name[:200]}, but the adapter in {checkpoint} was trained on "
            f"{recorded[:200]!r}: resume with that base model"
        )
    return folder


def _rank_of(folder: Path) -> str:
    try:
        return str(lora_settings(folder).rank)
    except (OSError, ValueError):
        return "unreadable"


def frozen_base_dtype(cfg: ModelConfig, mixed_precision: str, on_gpu: bool) -> ModelConfig:
    """`cfg` with the dtype the frozen base is stored in under model.lora: the compute dtype.
    Mixed precision (trainer.fsdp_mixed_precision, on a GPU: a CPU ignores it) keeps float32
    master weights for the weights it trains; a frozen weight needs no master copy, so the base
    is loaded in the compute dtype (half the memory) and only the adapters are float32."""
    if not lora_on(cfg.lora) or not on_gpu or mixed_precision not in MIXED_PRECISION:
        return cfg
    import dataclasses

    return dataclasses.replace(cfg, dtype=MIXED_PRECISION[mixed_precision])
