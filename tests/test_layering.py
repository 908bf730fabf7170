"""Data parallelism has one owner: no module outside exgrpo_cli/parallel/ talks to the other ranks
itself. Read from the modules' syntax trees, so comments and docstrings do not count and imports
inside functions do: outside parallel/ nothing imports torch.distributed (or reaches it as
`torch.distributed.<x>`), nor the names of the old rank object and collective helpers. Two
exemptions: run/launch.py, which starts the ranks with torch's elastic launcher (torchrun's own
code) before any of them exists, and checkpoint/'s optimizer files, whose on-disk format is
torch.distributed.checkpoint's (read and written there, each rank its own shard)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "exgrpo_cli"
OWNER = PACKAGE / "parallel"
# the names of the collective helpers and the rank object the owner replaced
HELPERS = {"barrier", "broadcast_object", "all_reduce_dict", "all_gather_object", "rank0_first", "DistInfo"}
# module -> the torch.distributed modules it may import: the torchrun launcher
DCP = {"torch.distributed.checkpoint", "torch.distributed.checkpoint.metadata"}
EXEMPT = {
    "run/launch.py": {"torch.distributed.elastic.multiprocessing.errors", "torch.distributed.launcher.api"},
    "checkpoint/optimizer_files.py": DCP | {"torch.distributed.checkpoint.state_dict"},
    "checkpoint/metadata_guard.py": DCP | {"torch.distributed.checkpoint.filesystem"},
}


def _is_dist(name: str) -> bool:
    return name == "torch.distributed" or name.startswith("torch.distributed.")


def collective_uses(source: str) -> list[str]:
    """What `source` (one module) imports or reaches of torch.distributed and the helpers, one
    entry per use: `import torch.distributed`, `from torch import distributed`, `from x import
    barrier`, `torch.distributed.barrier()`, ..."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_dist(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if _is_dist(node.module):
                found.append(node.module)
            elif node.module == "torch":
                found += ["torch.distributed" for a in node.names if a.name == "distributed"]
            found += [f"{node.module}.{a.name}" for a in node.names if a.name in HELPERS]
        elif isinstance(node, ast.Attribute) and node.attr == "distributed":
            if isinstance(node.value, ast.Name) and node.value.id == "torch":
                found.append("torch.distributed (attribute)")
    return found


def violations() -> dict[str, list[str]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if OWNER in path.parents:
            continue
        rel = str(path.relative_to(PACKAGE))
        uses = [u for u in collective_uses(path.read_text()) if u not in EXEMPT.get(rel, set())]
        if uses:
            out[rel] = uses
    return out


def test_only_parallel_talks_to_the_other_ranks() -> None:
    assert len(list(PACKAGE.rglob("*.py"))) > 50  # the package was found
    assert violations() == {}


def test_the_launcher_exemption_is_still_needed() -> None:
    """The exemption names what run/launch.py imports today; an exemption that outlived its
    import would hide a new one."""
    for rel, allowed in EXEMPT.items():
        assert set(collective_uses((PACKAGE / rel).read_text())) == allowed, rel


def test_the_reader_finds_every_way_in_and_ignores_words() -> None:
    source = '''
"""Docstrings may say torch.distributed and barrier()."""
# so may comments: import torch.distributed
import torch
import torch.distributed as tdist
from torch import distributed
from torch.distributed.fsdp import fully_shard
from exgrpo_cli.parallel.fsdp import barrier, free_port


def f():
    from exgrpo_cli.parallel.sharding import DistInfo
    return torch.distributed.get_rank()
'''
    assert sorted(collective_uses(source)) == sorted(
        [
            "torch.distributed",
            "torch.distributed",
            "torch.distributed.fsdp",
            "exgrpo_cli.parallel.fsdp.barrier",
            "exgrpo_cli.parallel.sharding.DistInfo",
            "torch.distributed (attribute)",
        ]
    )
    assert (
        collective_uses('"""torch.distributed barrier"""\nimport torch\n# import torch.distributed\n') == []
    )
