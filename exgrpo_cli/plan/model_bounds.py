"""A model folder's config.json checked against its weights and the memory before anything loads.

Where it sits: before a command builds a model from a local folder (train and resume in
run/setup.py, on every rank; eval per model; inspect-buffer's scoring): a checkpoint's `model/`
or any model.path. transformers allocates what
config.json describes: a crafted config with 50,000 layers builds a huge module tree, and its
missing weights are initialised at random with a warning. So the config's parameter count (the
plan's formula, plan/arch.py) must match the tensors the safetensors headers declare, and its
weights must fit the memory available, or the load is refused in one line.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from exgrpo_cli.checkpoint import safe_read
from exgrpo_cli.errors import UsageError
from exgrpo_cli.host import MEMINFO, proc_bytes

MAX_CONFIG_BYTES = 1 << 20
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header
SLACK = 0.05  # the plan's formula leaves out small tensors (rotary buffers, extra norms)


class ModelFolderRefused(UsageError):
    """A model folder whose config.json does not match its weights or the memory."""


def stored_elements(folder: Path) -> int:
    """Elements of every tensor the folder's safetensors files declare (headers only); 0 if none."""
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        with open(file, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > MAX_HEADER_BYTES:
                raise ModelFolderRefused(f"{file}: a header of {n} bytes, not a safetensors file")
            header = json.loads(fh.read(n))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for d in entry["shape"]:
                    count *= int(d)
                total += count
    return total


def _available_bytes() -> int:
    return proc_bytes(MEMINFO, "MemAvailable") or 0


def check_model(path: str, gguf_file: str, dtype: str) -> None:
    """`check_model_folder` for a model setting: local folders only (not a hub id, builtin or GGUF)."""
    if not gguf_file and Path(path).is_dir():
        check_model_folder(Path(path), {"float32": 4}.get(dtype, 2))


def check_model_folder(folder: Path, bytes_per_param: int) -> None:
    """Refuse (ModelFolderRefused) a local model folder whose config.json describes more
    parameters than its weights hold, or weights larger than the memory available. A folder the
    plan cannot describe (another architecture, no config.json) is left to transformers."""
    from exgrpo_cli.plan.arch import ArchitectureUnavailable, arch_from_config_json

    file = folder / "config.json"
    if not file.exists():
        return
    try:
        arch = arch_from_config_json(safe_read.read_json(file, MAX_CONFIG_BYTES), str(file))
    except (ValueError, OSError) as err:
        raise ModelFolderRefused(f"{file} cannot be used: {str(err)[:200]}") from None
    except ArchitectureUnavailable:
        return
    try:
        stored = stored_elements(folder)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as err:
        raise ModelFolderRefused(f"{folder}: unreadable weights ({type(err).__name__})") from None
    if stored and arch.params > stored * (1 + SLACK):
        raise ModelFolderRefused(
            f"{file} describes {arch.params / 1e6:.1f}M parameters ({arch.num_layers} layers), but "
            f"the weights in {folder} hold {stored / 1e6:.1f}M: the config does not match its weights"
        )
    need, free = arch.params * bytes_per_param, _available_bytes()
    if free and need > free:
        raise ModelFolderRefused(
            f"{file} describes {need / 2**30:.1f} GiB of weights, more than the "
            f"{free / 2**30:.1f} GiB of memory available"
        )
