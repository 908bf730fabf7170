"""The schema (config/schema.py) as a flat list of dotted keys, each with its type, default and meaning.

Read by the command line before Hydra runs: `--help` prints these keys, the override check
(cli/overrides.py) refuses a key the schema does not declare and names the nearest ones, and
docs/configuration.md is generated from them (exgrpo_cli/config/reference.py). Nothing here imports
Hydra or torch: `exgrpo <command> --help` must answer at once.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.config.variant_names import NAMES


@dataclass(frozen=True)
class Key:
    name: str  # dotted, e.g. replay.ratio
    type: str  # as written in config/schema.py, e.g. Optional[float]
    default: Any  # the schema's default (a preset may set another)
    help: str
    free: bool = False  # a free dict by design: any key below it is allowed (ablation.variants)


def _is_section(f: dataclasses.Field[Any]) -> bool:
    factory = f.default_factory
    return factory is not dataclasses.MISSING and dataclasses.is_dataclass(factory)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def sections(cls: type = ExgrpoConfig, prefix: str = "") -> list[tuple[str, str, type]]:
    """(dotted name, meaning, dataclass) of every section and subsection, in schema order."""
    out: list[tuple[str, str, type]] = []
    for f in dataclasses.fields(cls):
        if _is_section(f):
            name, section = prefix + f.name, f.default_factory
            assert isinstance(section, type)  # a dataclass, as _is_section found
            out.append((name, str(f.metadata.get("help", "")), section))
            out.extend(sections(section, name + "."))
    return out


def keys(cls: type = ExgrpoConfig, prefix: str = "") -> list[Key]:
    """Every leaf key of the schema, in schema order (a subsection's keys where it sits)."""
    out = []
    for f in dataclasses.fields(cls):
        name = prefix + f.name
        if _is_section(f):
            out.extend(keys(f.default_factory, name + "."))  # type: ignore[arg-type]
            continue
        t = str(f.type)
        meaning = f.metadata.get("help", "")
        if name in NAMES:  # a registry's name: its names, generated from the registry
            meaning = f"{meaning}: {' | '.join(NAMES[name])}"
        out.append(Key(name, t, _default(f), meaning, free=t.startswith("dict[")))
    return out


def missing_help() -> list[str]:
    """The fields (sections included) that say nothing about what they mean."""
    bare = [k.name for k in keys() if not k.help.strip()]
    return bare + [name for name, h, _ in sections() if not h.strip()]


def lookup(dotted: str) -> Key | str | None:
    """The key `dotted` names, "section" for a section, "free" for a key inside a free dict, or None
    when the schema does not declare it."""
    if dotted in {name for name, _, _ in sections()}:
        return "section"
    for k in keys():
        if k.name == dotted:
            return k
        if k.free and dotted.startswith(k.name + "."):
            return "free"
    return None


def nearest(dotted: str, n: int = 3) -> list[str]:
    """The declared keys closest to a mistyped one: first by the whole name, then by its last part
    (`ratio` typed under the wrong section)."""
    names = [k.name for k in keys()]
    close = difflib.get_close_matches(dotted, names, n=n, cutoff=0.75)
    if not close:
        last = dotted.rsplit(".", 1)[-1]
        by_leaf = {k.name.rsplit(".", 1)[-1]: k.name for k in keys()}
        close = [by_leaf[m] for m in difflib.get_close_matches(last, list(by_leaf), n=n, cutoff=0.8)]
    return close


def presets(conf_dir: str) -> dict[str, list[str]]:
    """The config groups of conf/ and their presets (file names without .yaml), sorted."""
    root = Path(conf_dir)
    return {
        d.name: sorted(p.stem for p in d.glob("*.yaml"))
        for d in sorted(root.iterdir())
        if d.is_dir() and any(d.glob("*.yaml"))
    }


def default_presets(conf_dir: str) -> dict[str, str]:
    """group -> the preset conf/config.yaml chooses by default ("null": none)."""
    out = {}
    for line in (Path(conf_dir) / "config.yaml").read_text().splitlines():
        s = line.split("#", 1)[0].strip()
        if s.startswith("- ") and ":" in s:
            group, _, choice = s[2:].partition(":")
            out[group.strip()] = choice.strip()
    return out
