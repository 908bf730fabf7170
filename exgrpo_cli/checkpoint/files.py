"""File helpers of checkpoint/store.py: JSON and fsync, SHA-256, the ranks' shared hashing.

Where it sits: under store.py, at every save and every verification of a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exgrpo_cli.parallel.sharding import DataParallel

COMPLETE = "COMPLETE"
_BLOCK = 8 * 2**20


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[str]:
    """Every file under `folder` (relative paths, sorted), the marker excluded."""
    out = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
    return sorted(f for f in out if f != COMPLETE)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                os.fsync(fh.fileno())
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _shared_digests(folder: Path, names: list[str], parallel: DataParallel) -> dict[str, dict[str, Any]]:
    """{name: {"bytes", "sha256"}} of `names` under `folder`, each rank hashing every W-th file
    (missing files are left out)."""
    mine = {}
    for name in [names[i] for i in parallel.mine(len(names))]:
        path = folder / name
        if path.is_file():
            mine[name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return {k: v for part in parallel.gather(mine) for k, v in part.items()}


# ----------------------------------------------------------------------------- legacy optimizer files


def optimizer_state_from_files(folder: Path) -> dict[str, Any]:
    """The optimizer state of a checkpoint written before the sharded format (format 1:
    optimizer.safetensors + optimizer.json, in `optimizer.state_dict()` layout)."""
    from safetensors.torch import load_file

    from exgrpo_cli.checkpoint.safe_read import read_json

    meta = read_json(folder / "optimizer.json")
    tensors = load_file(str(folder / "optimizer.safetensors"))
    state: dict[int, dict[str, Any]] = {}
    for pid, entries in meta["state"].items():
        state[int(pid)] = {
            n: tensors[e["tensor"]] if "tensor" in e else e["value"] for n, e in entries.items()
        }
    return {"state": state, "param_groups": meta["param_groups"]}


_OS_MESSAGES = (
    "No space left on device",
    "Disk quota exceeded",
    "Read-only file system",
    "Permission denied",
)


def os_error_in(err: BaseException, depth: int = 0) -> BaseException | None:
    """The disk error inside a failed checkpoint write, or None when it is something else. torch's
    writer wraps an OSError of a rank in a CheckpointException (a BaseException, with `failures`);
    safetensors reports one as a SafetensorError whose text holds the OS message."""
    if isinstance(err, OSError):
        return err
    if depth > 4 or isinstance(err, (KeyboardInterrupt, SystemExit)):
        return None
    inner = [pair[0] for pair in getattr(err, "failures", {}).values() if isinstance(pair, tuple) and pair]
    for nxt in (*inner, err.__cause__, err.__context__):
        found = os_error_in(nxt, depth + 1) if nxt is not None else None
        if found is not None:
            return found
    text = str(err)
    return err if any(m in text for m in _OS_MESSAGES) else None
