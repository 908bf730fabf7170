"""`exgrpo eval ... eval.adapter=<run>/checkpoints/step_N`: a LoRA adapter evaluated on its base.

Where it sits: at the start of `exgrpo eval` (evaluation/runner.py `run_eval`), before any model
loads, and right after the base loads. The base comes from the command (`model.path`); the
adapter's folder (a checkpoint's `adapter/`, or any folder in peft's format) is checked against
it: the base the adapter records by name (adapter_config.json, read as data), and, once the base
is built, each adapted module's shape. A checkpoint's adapter files are verified against its
manifest first, as every checkpoint read is. The settings the adapter was trained with (rank,
alpha, dropout, targets) become model.lora, so the base is built with the same LoRA layers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig
from exgrpo_cli.policy import lora

if TYPE_CHECKING:
    import torch

    from exgrpo_cli.parallel.sharding import DataParallel


def adapter_folder(value: str, parallel: DataParallel | None = None) -> Path:
    """The adapter folder eval.adapter names: a checkpoint (its adapter/, verified), a run dir (its
    latest checkpoint's) or a folder in peft's format. ConfigError otherwise."""
    from exgrpo_cli.checkpoint import store as ckpt

    p = Path(value).expanduser()
    if not p.is_dir():
        raise ConfigError(f"invalid eval.adapter={value!r}: no such folder")
    if not (p / lora.CONFIG).is_file() and not (p / lora.ADAPTER_DIR).is_dir():
        found = ckpt.latest_checkpoint(p / "checkpoints")
        p = found if found is not None else p
    if (p / lora.ADAPTER_DIR / lora.CONFIG).is_file():
        reason = (
            ckpt.verify(p, prefix=f"{lora.ADAPTER_DIR}/", parallel=parallel)
            if (p / ckpt.COMPLETE).exists()
            else None
        )
        if reason:
            raise ConfigError(f"invalid eval.adapter={value!r}: the checkpoint does not verify: {reason}")
        p = p / lora.ADAPTER_DIR
    if not (p / lora.CONFIG).is_file() or not (p / lora.WEIGHTS).is_file():
        raise ConfigError(
            f"invalid eval.adapter={value!r}: holds no LoRA adapter ({lora.CONFIG} and {lora.WEIGHTS}); "
            "a checkpoint of a model.lora run, its adapter/ folder or its run dir"
        )
    return p


def with_adapter(cfg: ExgrpoConfig, parallel: DataParallel | None = None) -> ExgrpoConfig:
    """`cfg` with eval.adapter resolved to its folder and model.lora set to the adapter's settings;
    `cfg` itself without eval.adapter. Refuses (ConfigError, before any model loads) an adapter
    whose recorded base is not model.path, eval.compare beside it, and an engine that does not run
    the trainer's model (vLLM loads its own weights)."""
    if not cfg.eval.adapter:
        return cfg
    if cfg.eval.compare:
        raise ConfigError("eval.adapter applies to model.path: evaluate it without eval.compare")
    from exgrpo_cli.config.registry import pick
    from exgrpo_cli.rollout import ENGINES

    if not pick(ENGINES, "rollout.engine", cfg.rollout.engine).needs_trainer_model:
        raise ConfigError(f"eval.adapter runs on rollout=hf only (rollout.engine={cfg.rollout.engine})")
    folder = adapter_folder(cfg.eval.adapter, parallel)
    try:
        settings = lora.lora_settings(folder)
        recorded = str(lora.read_adapter_config(folder).get("base_model_name_or_path") or "")
    except (OSError, ValueError) as err:
        raise ConfigError(f"invalid eval.adapter={cfg.eval.adapter!r}: {str(err)[:200]}") from None
    if recorded != cfg.model.path:
        raise ConfigError(
            f"invalid eval.adapter={cfg.eval.adapter!r}: trained on {recorded[:200]!r}, but "
            f"model.path={cfg.model.path[:200]}: give its base as model.path"
        )
    model = dataclasses.replace(cfg.model, lora=settings)
    return dataclasses.replace(cfg, model=model, eval=dataclasses.replace(cfg.eval, adapter=str(folder)))


def load_into(cfg: ExgrpoConfig, model: torch.nn.Module | None) -> None:
    """The adapter of eval.adapter (resolved by `with_adapter`) into the base just built with its
    LoRA layers, after each adapted module's shape is checked against the base."""
    if not cfg.eval.adapter or model is None:
        return
    folder = Path(cfg.eval.adapter)
    wrong = lora.base_mismatch(folder, cfg.model.path, model)
    if wrong:
        raise ConfigError(f"invalid eval.adapter: {wrong}")
    lora.load_adapter(model, folder)


def adapter_label(cfg: ExgrpoConfig, label: str) -> str:
    """The results' name of the evaluated model: the base's, with the adapter's folder beside it."""
    return f"{label} + {cfg.eval.adapter}" if cfg.eval.adapter else label
