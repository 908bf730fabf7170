"""Subcommands: thin functions that build the parts, run them, and report.

`dispatch` turns Hydra's DictConfig into the typed `ExgrpoConfig`, validates it (ranges, then the
variants' names against their registries: exit code 2 with a message naming the key, before any
model is loaded) and calls the command. Library code raises `ExgrpoError`s; here they become one
line on stderr and the error's exit code.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from omegaconf import DictConfig

from exgrpo_cli.commands.typed import to_typed
from exgrpo_cli.config import ExgrpoConfig, validate
from exgrpo_cli.errors import ExgrpoError

__all__ = ["dispatch", "hydra_choices", "to_typed", "with_preset_name"]


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


def _command(command: str) -> Callable[[ExgrpoConfig], None]:
    if command == "train":
        from exgrpo_cli.commands.train import run
    elif command == "eval":
        from exgrpo_cli.commands.eval import run
    elif command == "ablate":
        from exgrpo_cli.commands.ablate import run
    elif command == "inspect-buffer":
        from exgrpo_cli.commands.inspect_buffer import run
    else:  # cli.main already refuses unknown commands
        raise ValueError(f"unknown command {command!r}")
    return run


def dispatch(command: str, cfg: DictConfig) -> None:
    try:
        typed = with_preset_name(to_typed(cfg), hydra_choices())
        validate(typed, command)
        from exgrpo_cli.variants import check_variants

        check_variants(typed, command)
        _command(command)(typed)
    except ExgrpoError as err:
        print(f"exgrpo {command}: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
