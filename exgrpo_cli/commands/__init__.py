"""Subcommands: thin functions that build the parts, run them, and report.

`dispatch` turns Hydra's DictConfig into the typed `ExgrpoConfig`, validates it (exit code 2 with
a message naming the key on a bad value, before any model is loaded) and calls the command.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig, OmegaConf

from exgrpo_cli.config import ConfigError, ExgrpoConfig, validate


def to_typed(cfg: DictConfig) -> ExgrpoConfig:
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, ExgrpoConfig), type(obj)
    return obj


def dispatch(command: str, cfg: DictConfig) -> None:
    typed = to_typed(cfg)
    try:
        validate(typed, command)
    except ConfigError as err:
        print(f"exgrpo {command}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if command == "train":
        from exgrpo_cli.commands.train import run
    elif command == "eval":
        from exgrpo_cli.commands.eval import run
    elif command == "ablate":
        from exgrpo_cli.commands.ablate import run
    elif command == "inspect-buffer":
        from exgrpo_cli.commands.inspect_buffer import run
    else:  # cli.main already refuses unknown commands
        raise AssertionError(command)
    run(typed)
