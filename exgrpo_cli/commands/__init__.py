"""Subcommands: thin functions that build the parts, run them, and report.

`dispatch` turns Hydra's DictConfig into the typed `ExgrpoConfig`, validates it (ranges, then the
variants' names against their registries: exit code 2 with a message naming the key, before any
model is loaded) and calls the command. Library code and commands raise `ExgrpoError`s; here
(`errors.exit_on_error`) they become one line on stderr and the error's exit code.
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

from exgrpo_cli.commands.compose import hydra_choices, to_typed, with_preset_name
from exgrpo_cli.config.checks import validate
from exgrpo_cli.config.paths import hydra_config
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import exit_on_error

__all__ = ["dispatch", "hydra_choices", "to_typed", "with_preset_name"]


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


def _model_chosen() -> bool:
    """Whether the command line chose the model preset (model=... or experiment=..., which does)."""
    hc = hydra_config()
    task = list(hc.overrides.task) if hc is not None else []
    return any(o.lstrip("+").split("=", 1)[0] in ("model", "experiment") for o in task)


def dispatch(command: str, cfg: DictConfig) -> None:
    from exgrpo_cli.commands.run_dir import discard_if_untouched

    try:
        with exit_on_error(command):
            typed = with_preset_name(to_typed(cfg), hydra_choices())
            validate(typed, command)
            from exgrpo_cli.commands.variants import check_variants

            check_variants(typed, command)
            from exgrpo_cli.commands.model_preset import check_model_preset

            check_model_preset(typed, command, _model_chosen())
            if command in ("train", "eval") and typed.logger.wandb.mode != "disabled":
                from exgrpo_cli.metrics.tracker_env import check_tracker_env

                check_tracker_env()  # before a run dir's lock, logger or model
            _command(command)(typed)
    except SystemExit as stop:
        if stop.code == 2:  # refused: the run folder Hydra made holds only its own files
            discard_if_untouched()
        raise
    # a dry run or a read-only command (inspect-buffer without plots) wrote nothing of its own
    discard_if_untouched()
