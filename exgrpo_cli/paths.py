"""Where exgrpo's own files are: the Hydra configs (a leaf module: the CLI and the commands read it)."""

from __future__ import annotations

from pathlib import Path


def config_dir() -> str:
    """The conf/ folder: beside the package in a checkout, inside it in an installed wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "conf", here / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(f"exgrpo configs not found beside or inside {here}")
