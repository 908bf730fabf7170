"""From Hydra's composed DictConfig to the typed `ExgrpoConfig`, and the presets it was composed with.

Used by `dispatch` before any command runs, and by the commands that need other configs
(`exgrpo ablate` checks each variant; `exgrpo train` re-plans suggested overrides on its typed
config with `with_overrides`, and composes a suggested model preset, whose recipe comes from its
YAML, with `compose_in_app`). A module of its own so that those commands need not import the
package that dispatches to them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from exgrpo_cli.config.paths import hydra_config
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig


def to_typed(cfg: DictConfig | ListConfig) -> ExgrpoConfig:
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, ExgrpoConfig):
        raise TypeError(f"the composed config is a {type(obj).__name__}, not an ExgrpoConfig")
    return with_cache_paths(obj)


def with_cache_paths(cfg: ExgrpoConfig) -> ExgrpoConfig:
    """eval.data_dir and data.val_path with the benchmark cache's default folder as it is here:
    under XDG_CACHE_HOME="" Hydra's oc.env makes `/exgrpo/benchmarks` of it, which every reader
    of the paper recipes' `${eval.data_dir}/valid.parquet` would take as written."""
    from exgrpo_cli.data.pinned import resolve_cache_path

    data_dir, val = resolve_cache_path(cfg.eval.data_dir), resolve_cache_path(cfg.data.val_path)
    if (data_dir, val) == (cfg.eval.data_dir, cfg.data.val_path):
        return cfg
    return dataclasses.replace(
        cfg,
        eval=dataclasses.replace(cfg.eval, data_dir=data_dir),
        data=dataclasses.replace(cfg.data, val_path=val),
    )


def hydra_choices() -> dict[str, str]:
    """The presets Hydra composed the running command with (empty outside `@hydra.main`)."""
    hc = hydra_config()
    return {} if hc is None else {k: str(v) for k, v in hc.runtime.choices.items() if v is not None}


def with_preset_name(cfg: ExgrpoConfig, choices: dict[str, str]) -> ExgrpoConfig:
    """`model.preset`: the conf/model/ file the config was composed with (it names itself)."""
    chosen = choices.get("model")
    if not chosen or cfg.model.preset:
        return cfg
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, preset=chosen))


def with_overrides(cfg: ExgrpoConfig, overrides: Sequence[str]) -> ExgrpoConfig:
    """`cfg` with `key=value` overrides applied to its typed fields, each value read as on the
    command line; a ConfigError for a key or value the schema refuses. No Hydra: presets
    (`group=name`) are not keys here."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        return to_typed(OmegaConf.merge(OmegaConf.structured(cfg), OmegaConf.from_dotlist(list(overrides))))
    except OmegaConfBaseException as err:
        raise ConfigError(f"cannot apply {' '.join(overrides)}: {str(err).splitlines()[0]}") from None


def compose_in_app(extra: Sequence[str]) -> ExgrpoConfig | None:
    """The typed config of the running Hydra app's command line plus `extra` (a model preset's recipe
    comes along), named after its model preset; None outside a Hydra app."""
    from hydra import compose

    hc = hydra_config()
    if hc is None:
        return None
    task = list(hc.overrides.task)
    models = [o.split("=", 1)[1] for o in (*task, *extra) if o.startswith("model=")]
    typed = to_typed(compose(config_name="config", overrides=[*task, *extra]))
    return with_preset_name(typed, {"model": models[-1]} if models else {})


def compose_train(overrides: list[str]) -> ExgrpoConfig:
    """The typed, validated config of `exgrpo train <overrides>`, composed outside a Hydra run
    (make bench, the GPU check). Give trainer.output_dir: the Hydra run dir is not resolved there."""
    from hydra import compose, initialize_config_dir

    from exgrpo_cli.config.checks import validate
    from exgrpo_cli.config.paths import config_dir
    from exgrpo_cli.config.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = to_typed(compose("config", overrides=overrides))
    validate(cfg, "train")
    return cfg
