"""The command line checked before Hydra runs: a mistake is one line and exit code 2, before any
run folder is made or any model loads.

The schema is closed: an override (`key=`, `+key=`, `++key=`, `~key`) must name a key config/schema.py
declares, except below a free dict by design (`ablation.variants`, `ablation.compare_to`) and under
`hydra.`; an unknown key names the nearest declared ones. A value must fit its key's type, a preset
must exist in its group (the error lists the group's presets), and Hydra's own flags must parse.
Without -m the whole config is then composed once, so that any other composition error is one line
here instead of Hydra's message and exit code 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn

from exgrpo_cli.config import keys as schema_keys
from exgrpo_cli.errors import UsageError

RUN_MODES = ("run", "multirun", "cfg", "info", "shell_completion")  # Hydra allows one at a time


def parse_flags(args: list[str]) -> argparse.Namespace:
    """Hydra's own command line (its argparse parser), with a usage error as a UsageError."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def refuse(message: str) -> NoReturn:
        raise UsageError(message)

    parser.error = refuse  # type: ignore[method-assign]
    ns = parser.parse_args(args)
    modes = [m for m in RUN_MODES if getattr(ns, m)]
    if len(modes) > 1:
        flags = ", ".join("--" + m.replace("_", "-") for m in modes)
        raise UsageError(f"{flags}: only one of --run, --multirun, --cfg, --info can be given")
    return ns


def check(command: str, args: list[str], conf_dir: str) -> argparse.Namespace:
    """Refuse (UsageError) a command line whose overrides the schema or conf/ does not know."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    ns = parse_flags(args)
    parser = OverridesParser.create()
    parsed = []
    for line in ns.overrides:
        try:
            parsed += parser.parse_overrides([line])
        except HydraException as err:
            raise UsageError(f"cannot read the override {line!r}: {_first_line(err)}") from None
    groups = schema_keys.presets(conf_dir)
    # --config-dir DIR and hydra.searchpath=[file://DIR] add DIR/<group>/<preset>.yaml (a custom
    # sweep file is DIR/ablation/<name>.yaml)
    for extra in ([ns.config_dir] if ns.config_dir else []) + _search_dirs(parsed):
        if Path(extra).is_dir():
            for group, names in schema_keys.presets(extra).items():
                groups[group] = sorted(set(groups.get(group, [])) | set(names))
    for o in parsed:
        key = o.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        if key in groups and not o.is_delete():
            _check_preset(key, _values(o), groups[key])
        else:
            _check_key(command, o.input_line or key, key, o, _values(o))
    return ns


def _search_dirs(parsed: list[Any]) -> list[str]:
    """The folders of `hydra.searchpath=[file://DIR, ...]` (pkg:// entries name packages: skipped)."""
    dirs = []
    for o in parsed:
        if o.key_or_group == "hydra.searchpath" and not o.is_delete():
            value = o.value()
            for entry in value if isinstance(value, list) else [value]:
                if isinstance(entry, str) and entry.startswith("file://"):
                    dirs.append(entry[len("file://") :])
    return dirs


def _values(o: Any) -> list[Any]:
    if o.is_delete():
        return []
    if o.is_sweep_override():
        try:
            return list(o.sweep_iterator())
        except Exception:  # a glob or interval sweep: its values are not listed ahead
            return []
    return [o.value()]


def _check_preset(group: str, values: list[Any], names: list[str]) -> None:
    for v in values:
        if v is not None and str(v) not in names:
            raise UsageError(f"unknown preset {group}={v}: the {group} presets are {', '.join(names)}")


def _check_key(command: str, line: str, key: str, o: Any, values: list[Any]) -> None:
    found = schema_keys.lookup(key)
    if found is None:
        near = schema_keys.nearest(key)
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        raise UsageError(f"unknown key {key} in {line!r}{hint}; every key: exgrpo {command} --help-all")
    if isinstance(found, str):  # a section or inside a free dict: Hydra types what is below
        return
    if o.is_add():
        raise UsageError(f"{key} is declared already: set it with {line.lstrip('+')}")
    for v in values:
        _check_type(found, v, line)


def _check_type(key: schema_keys.Key, value: Any, line: str) -> None:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(value, str) and "${" in value:  # an interpolation: resolved later
        return
    section, _, leaf = key.name.rpartition(".")
    cls = {name: c for name, _, c in schema_keys.sections()}[section]
    node = OmegaConf.structured(cls)
    try:
        node[leaf] = value
    except OmegaConfBaseException as err:
        raise UsageError(f"invalid {line}: {key.name} is {key.type} ({_first_line(err)})") from None


def _first_line(err: BaseException) -> str:
    """Hydra's and OmegaConf's messages on one line: the sentence, and Hydra's advice when it gives
    one on the next line (never the full_key / object_type lines)."""
    lines = [s.strip() for s in str(err).splitlines() if s.strip()]
    if not lines:
        return type(err).__name__
    if len(lines) > 1 and not lines[1].startswith(("full_key", "reference_type", "object_type")):
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def compose(command: str, overrides: list[str], conf_dir: str, extra_dir: str | None) -> dict[str, Any]:
    """The composed config of a single run as a plain dict (for --help's values), with any
    composition error as one line. `extra_dir`: --config-dir, searched too."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    user = [
        o for o in overrides if o.startswith("hydra.searchpath") or not o.lstrip("+~").startswith("hydra")
    ]
    if extra_dir:
        user.append(f"hydra.searchpath=[file://{extra_dir}]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=conf_dir, version_base=None, job_name=command):
            cfg = hydra_compose("config", overrides=user)
            cfg.trainer.output_dir = "."  # Hydra's run dir is only known in a run
            out = OmegaConf.to_container(cfg, resolve=False)
    except UsageError:
        raise
    except Exception as err:  # Hydra's and OmegaConf's own: one line, whatever their kind
        raise UsageError(_first_line(err)) from None
    finally:
        GlobalHydra.instance().clear()
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}
