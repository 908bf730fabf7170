"""One source of defaults: the schema (exgrpo_cli/config/schema.py) holds every default; a group preset
holds only what differs from it, and the code reads only declared keys.

A preset that repeats a default is a trap: editing the default in config/schema.py then changes nothing
for a CLI run. experiment/ and ablation/ files (and recipe/, which model presets pull in) pin
every official value on purpose and are exempt.
"""

from __future__ import annotations

import ast
import dataclasses
from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from exgrpo_cli.config.paths import config_dir
from exgrpo_cli.config.schema import ExgrpoConfig

CONF = Path(config_dir())
PACKAGE = Path(__file__).resolve().parent.parent / "exgrpo_cli"
GROUPS = ("model", "algo", "replay", "rollout", "data", "eval", "logger")


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def _default(group: str, dotted: str) -> Any:
    obj = attrgetter(f"{group}.{dotted}")(ExgrpoConfig())
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def _group_presets() -> list[Path]:
    return sorted(p for g in GROUPS for p in (CONF / g).glob("*.yaml"))


@pytest.mark.parametrize("preset", _group_presets(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_group_presets_hold_only_what_differs_from_the_schema(preset: Path) -> None:
    raw = OmegaConf.to_container(OmegaConf.load(preset), resolve=False) or {}
    assert isinstance(raw, dict)
    raw.pop("defaults", None)  # a model preset may pull in its paper recipe (conf/recipe/)
    repeated = {k: v for k, v in _leaves(raw).items() if _default(preset.parent.name, k) == v}
    assert not repeated, f"{preset.relative_to(CONF)} repeats schema defaults: {repeated}"


def test_the_check_finds_a_repeated_default(tmp_path: Path) -> None:
    """The rule above is not vacuous: a preset repeating `replay.ratio: 0.5` is caught."""
    (tmp_path / "replay").mkdir()
    bad = tmp_path / "replay" / "bad.yaml"
    bad.write_text("ratio: 0.5\nbeta: 0.2\n")
    raw = OmegaConf.to_container(OmegaConf.load(bad))
    assert isinstance(raw, dict)
    assert {k for k, v in _leaves(raw).items() if _default("replay", k) == v} == {"ratio"}


# ----------------------------------------------------------------------------- undeclared keys


def _config_reads(tree: ast.AST) -> list[tuple[int, list[str]]]:
    """Attribute chains read off a config: `cfg.a.b`, `self.cfg.a.b`, `run_cfg.a` ... -> (line, [a, b])."""
    reads = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain: list[str] = []
        cur: ast.AST = node
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
        chain.reverse()
        root = cur.id if isinstance(cur, ast.Name) else ""
        if root == "self" and chain and chain[0] == "cfg":
            chain, root = chain[1:], "cfg"
        if root in ("cfg", "run_cfg", "typed") and chain:
            reads.append((node.lineno, chain))
    return reads


def _undeclared(chain: list[str]) -> str | None:
    obj: Any = ExgrpoConfig()
    for i, name in enumerate(chain):
        if not dataclasses.is_dataclass(obj):
            return None  # past the schema (a list, a str method...)
        if name not in {f.name for f in dataclasses.fields(obj)}:
            if callable(getattr(type(obj), name, None)):
                return None  # a method of a config section (e.g. replay.experience_bounds), not a key
            return ".".join(chain[: i + 1])
        obj = getattr(obj, name)
    return None


def test_code_reads_only_declared_keys() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for line, chain in _config_reads(tree):
            if chain[0] not in {f.name for f in dataclasses.fields(ExgrpoConfig)}:
                continue  # a method of the config object or a local name, not a key
            key = _undeclared(chain)
            if key:
                bad.append(f"{path.relative_to(PACKAGE)}:{line}: cfg.{key}")
        for node in ast.walk(tree):  # getattr with a default is how undeclared keys hide
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                target = ast.unparse(node.args[0]) if node.args else ""
                if target.split(".")[0] in ("cfg", "run_cfg") or target.startswith("self.cfg"):
                    bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "config keys read but not declared in exgrpo_cli/config/schema.py:\n" + "\n".join(bad)


def test_the_reader_check_sees_an_undeclared_key() -> None:
    tree = ast.parse(
        "def f(cfg):\n    return cfg.rollout.sleep_mod, cfg.logger.wandb.mode, cfg.data.synthetic.ops"
    )
    found = [_undeclared(chain) for _, chain in _config_reads(tree)]
    assert "rollout.sleep_mod" in found and found.count(None) >= 2
