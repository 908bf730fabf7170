"""The package's import graph (function-level imports included): no cycles, between modules or
between folders (exgrpo_cli/<folder> as one node: a folder that imports another which imports it
back is one layer, however its modules are wired), and every import goes down one floor table
(FLOORS): a folder imports its own modules and the folders on lower floors, never one on its own
floor or above (step/ never imports run/)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "exgrpo_cli"


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (a `from pkg import name` counts as pkg.name when
    that is a module, else as pkg)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = node.module
                if node.level:  # relative: resolve against this module's package
                    anchor = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    base = ".".join(anchor[: len(anchor) - node.level + 1] + [node.module])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t.startswith("exgrpo_cli") and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan). Every edge counts, a
    package's __init__ importing its own submodules too (as the project's import-cycle check
    counts them): a submodule that imports its package back closes a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert len(graph) > 50  # the package was found
    assert cycles(graph) == []


def test_the_cycle_finder_finds_one() -> None:
    graph = {
        "exgrpo_cli.a": {"exgrpo_cli.b"},
        "exgrpo_cli.b": {"exgrpo_cli.c"},
        "exgrpo_cli.c": {"exgrpo_cli.a"},
    }
    assert cycles(graph) == [["exgrpo_cli.a", "exgrpo_cli.b", "exgrpo_cli.c"]]


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """exgrpo_cli/<folder> -> the folders its modules import (a top-level module is its own node)."""

    def folder(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    out: dict[str, set[str]] = {folder(m): set() for m in graph}
    for mod, targets in graph.items():
        out[folder(mod)] |= {folder(t) for t in targets} - {folder(mod)}
    return out


def test_no_cycles_between_folders() -> None:
    folders = folder_graph(import_graph())
    assert {"exgrpo_cli.plan", "exgrpo_cli.policy", "exgrpo_cli.rollout"} <= set(folders)
    assert cycles(folders) == []


def test_a_function_level_import_closes_a_folder_cycle() -> None:
    """The cycle plan/rollout had: rollout/__init__ imported plan.memory, and plan/inputs imported
    rollout inside a function; two modules, no module cycle, one folder cycle."""
    graph = {
        "exgrpo_cli.rollout": {"exgrpo_cli.plan.memory"},
        "exgrpo_cli.plan.memory": set(),
        "exgrpo_cli.plan.inputs": {"exgrpo_cli.rollout"},
    }
    assert cycles(graph) == []
    assert cycles(folder_graph(graph)) == [["exgrpo_cli.plan", "exgrpo_cli.rollout"]]


# The floor table: a module imports only modules of its own folder and of folders on lower floors.
# Folders on one floor do not import each other. The leaves at the bottom import nothing of the
# package. run/ sits above evaluation/: a run's validation is the evaluation's sampling and grading.
FLOORS: list[tuple[str, ...]] = [
    ("errors", "host", "algo"),
    ("config",),
    ("data",),
    ("replay",),
    ("parallel",),
    ("checkpoint",),
    ("metrics",),
    ("policy",),
    ("rollout", "reward", "plan"),
    ("step", "evaluation"),
    ("run",),
    ("inspection", "ablation"),
    ("commands",),
    ("cli",),
    ("__main__",),
]
FLOOR = {folder: n for n, folders in enumerate(FLOORS) for folder in folders}


def _folder(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""  # "" is the package's own __init__


def floor_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import that breaks the floor table, as the rule it breaks."""
    out = []
    for mod in sorted(graph):
        here = _folder(mod)
        if here == "":
            continue  # the package's __init__: a docstring and the version
        for target in sorted(graph[mod]):
            there = _folder(target)
            if there == here:
                continue
            if here not in FLOOR or there not in FLOOR:
                out.append(
                    f"{mod} -> {target}: {here if here not in FLOOR else there}/ has no floor in FLOORS"
                )
            elif FLOOR[there] >= FLOOR[here]:
                out.append(
                    f"{mod} -> {target}: {here}/ (floor {FLOOR[here]}) may import only lower floors, "
                    f"not {there}/ (floor {FLOOR[there]})"
                )
    return out


def test_every_import_goes_down_the_floor_table() -> None:
    graph = import_graph()
    assert {_folder(m) for m in graph} - {""} == set(FLOOR)  # every folder has a floor, none is stale
    assert floor_breaches(graph) == []


def test_a_step_module_importing_run_breaks_the_table() -> None:
    graph = import_graph()
    graph["exgrpo_cli.step.loop"] = graph["exgrpo_cli.step.loop"] | {"exgrpo_cli.run.training"}
    assert floor_breaches(graph) == [
        "exgrpo_cli.step.loop -> exgrpo_cli.run.training: step/ (floor 9) may import only lower floors, "
        "not run/ (floor 10)"
    ]
    same_floor = {"exgrpo_cli.rollout.hf": {"exgrpo_cli.reward.stage"}, "exgrpo_cli.reward.stage": set()}
    assert floor_breaches(same_floor) == [
        "exgrpo_cli.rollout.hf -> exgrpo_cli.reward.stage: rollout/ (floor 8) may import only lower floors, "
        "not reward/ (floor 8)"
    ]


def test_the_schema_is_plain_data() -> None:
    """config/schema.py builds on its section modules (plain dataclasses) and the errors only; a
    section imports nothing but other sections (config/replay.py: the replay section and its methods'
    sections, which config/train.py's `replay` holds)."""
    graph = import_graph()
    sections = {
        "exgrpo_cli.config.model",
        "exgrpo_cli.config.train",
        "exgrpo_cli.config.commands",
        "exgrpo_cli.config.replay",
    }
    assert graph["exgrpo_cli.config.schema"] <= {"exgrpo_cli.errors"} | sections
    assert all(graph[m] <= sections for m in sections)


def test_the_code_map_shows_every_folder_and_the_floor_table() -> None:
    """docs/code-map.md is what a newcomer reads: every folder in its first table, with a module
    that exists, and the floor table as FLOORS has it."""
    import re

    page = (PACKAGE.parent / "docs" / "code-map.md").read_text()
    rooms = dict(re.findall(r"^\| `(\w+)/` \|.*\| `(\w+\.py)` \|$", page, re.M))
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert set(rooms) == folders
    assert all((PACKAGE / folder / module).is_file() for folder, module in rooms.items())
    floors = re.findall(r"^\| (\d+) \| (.+) \|$", page, re.M)
    shown = [tuple(re.findall(r"`(\w+)`", names)) for _, names in floors]
    assert shown == [f for f in FLOORS if f != ("__main__",)]
