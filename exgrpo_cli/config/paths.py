"""Where exgrpo's own files are: the Hydra configs, and the running Hydra app's settings (its run
dir, its overrides). A leaf module: the CLI, the commands and the trainer read it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hydra.conf import HydraConf


def config_dir() -> str:
    """The conf/ folder: beside the package in a checkout, inside it in an installed wheel."""
    here = Path(__file__).resolve().parent.parent  # the package: exgrpo_cli/config/paths.py
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(f"exgrpo configs not found beside or inside {here}")


def hydra_config() -> HydraConf | None:
    """The running Hydra app's settings; None outside `@hydra.main` (e.g. a test composing configs)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get()
    except (ImportError, ValueError):
        return None


def run_dir_override(override: str) -> str | None:
    """The value of a command-line `hydra.run.dir=...` (also as `+hydra.run.dir=` or
    `++hydra.run.dir=`, which Hydra takes the same way), unquoted; None for any other override."""
    key, eq, value = override.partition("=")
    if not eq or key.lstrip("+") != "hydra.run.dir" or len(key) - len("hydra.run.dir") > 2:
        return None
    return value.strip("'\"")
