"""Hydra's composed DictConfig as the typed `ExgrpoConfig`.

Where it sits: before any command runs (`commands.dispatch`), and wherever a command composes
configs of its own (the suggested fixes of the memory plan, the ablation's variants). Its own
module so that those commands import it without importing the `commands` package that
dispatches to them.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from exgrpo_cli.config import ExgrpoConfig


def to_typed(cfg: DictConfig) -> ExgrpoConfig:
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, ExgrpoConfig):
        raise TypeError(f"the composed config is a {type(obj).__name__}, not an ExgrpoConfig")
    return obj
