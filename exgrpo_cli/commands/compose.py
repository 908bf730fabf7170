"""From Hydra's composed DictConfig to the typed `ExgrpoConfig`, and the presets it was composed with.

Used by `dispatch` before any command runs, and by the commands that compose configs of their own
(`exgrpo ablate` checks each variant, `exgrpo train` re-plans suggested overrides). A module of its
own so that those commands need not import the package that dispatches to them.
"""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf

from exgrpo_cli.config import ExgrpoConfig


def to_typed(cfg: DictConfig) -> ExgrpoConfig:
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, ExgrpoConfig):
        raise TypeError(f"the composed config is a {type(obj).__name__}, not an ExgrpoConfig")
    return obj


def hydra_choices() -> dict[str, str]:
    """The presets Hydra composed the running command with (empty outside `@hydra.main`)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return {k: str(v) for k, v in HydraConfig.get().runtime.choices.items() if v is not None}
    except ValueError:  # not under @hydra.main (a test composing configs)
        return {}


def with_preset_name(cfg: ExgrpoConfig, choices: dict[str, str]) -> ExgrpoConfig:
    """`model.preset`: the conf/model/ file the config was composed with (it names itself)."""
    chosen = choices.get("model")
    if not chosen or cfg.model.preset:
        return cfg
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, preset=chosen))


def compose_train(overrides: list[str]) -> ExgrpoConfig:
    """The typed, validated config of `exgrpo train <overrides>`, composed outside a Hydra run
    (make bench, the GPU check). Give trainer.output_dir: the Hydra run dir is not resolved there."""
    from hydra import compose, initialize_config_dir

    from exgrpo_cli.config import register_configs
    from exgrpo_cli.config_checks import validate
    from exgrpo_cli.paths import config_dir

    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = to_typed(compose("config", overrides=overrides))
    validate(cfg, "train")
    return cfg
