"""A model path given without the preset it needs: refused at start-up, before anything loads.

The settings that depend on the model (the prompt template, the dtype, the rollout engine, the
response length) come from its preset (conf/model/). `model.path=<a HF id or folder>` alone keeps
the default preset, the built-in tiny model's (template think_short, float32, the HF engine),
which silently evaluates or trains another model with the wrong template. So with the default
preset, `model.path` must be the tiny model or a checkpoint of an exgrpo run made with it; any
other path needs `model=<preset>` (or `model=tiny` given explicitly, to keep these settings).

Nothing is read from a foreign folder; from an exgrpo run only the preset name its composed config
records (.hydra/hydra.yaml, parsed as YAML data), to say which preset to add.
"""

from __future__ import annotations

from pathlib import Path

from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig

DEFAULT_PRESET = "tiny"


def run_dir_of_model(path: str) -> Path | None:
    """The exgrpo run a model path belongs to: a run dir, a checkpoint or its model/ folder."""
    p = Path(path).expanduser()
    for ckpt in (p, p.parent):  # <ckpt> or <ckpt>/model
        marked = (ckpt / "trainer_state.json").is_file() or (ckpt / "COMPLETE").is_file()
        if marked and ckpt.parent.name == "checkpoints":
            return ckpt.parent.parent
    return p if (p / "checkpoints").is_dir() else None


def _recorded_preset(run: Path) -> str | None:
    """The model preset the run was composed with: Hydra's record of its choices (hydra.yaml)."""
    from omegaconf import OmegaConf

    record = run / ".hydra" / "hydra.yaml"
    if not record.is_file():
        return None
    try:
        preset = OmegaConf.select(OmegaConf.load(record), "hydra.runtime.choices.model")
    except Exception:  # an unreadable record says nothing about the preset
        return None
    return str(preset) if preset else None


def problem(path: str) -> str | None:
    """Why `path` cannot run with the default preset's settings; None when it can."""
    if path.startswith("builtin:tiny"):
        return None
    run = run_dir_of_model(path)
    if run is not None:
        preset = _recorded_preset(run)
        if preset in (None, DEFAULT_PRESET):
            return None  # a checkpoint of a tiny-model run (or one that does not say): as before
        return f"it is a checkpoint of a model={preset} run: add model={preset}"
    return "add model=<preset> for its template, dtype and engine (exgrpo train --help lists the presets)"


def check_model_preset(cfg: ExgrpoConfig, command: str, chosen_explicitly: bool) -> None:
    """Refuse (ConfigError) a model path of another model under the default preset's settings."""
    if command not in ("train", "eval") or chosen_explicitly or cfg.model.preset != DEFAULT_PRESET:
        return
    paths = list(cfg.eval.compare) if command == "eval" and cfg.eval.compare else [cfg.model.path]
    for path in paths:
        why = problem(path)
        if why:
            key = "eval.compare" if cfg.eval.compare and command == "eval" else "model.path"
            raise ConfigError(
                f"{key}={path} runs with the built-in tiny model's preset (template think_short, "
                f"float32, the hf engine): {why}; model=tiny keeps those settings"
            )
