"""Checkpoints: written atomically, read without pickle.

Layout of `<output_dir>/checkpoints/step_<N>/`:
  model/                  HF folder (safetensors + tokenizer): AutoModelForCausalLM.from_pretrained works
  optimizer.safetensors   optimizer tensors, flattened; optimizer.json: param groups and layout
  rng.safetensors         torch RNG state; trainer_state.json: step, sampler, RNGs, switch, W&B id
  replay/                 the experience buffer (arrays in safetensors + JSON index)
A checkpoint is written to a temporary folder, fsynced, renamed into place, and only then is the
`latest` pointer replaced, so a run killed mid-write never leaves a torn checkpoint to resume from.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where tensors are handled: inspect-buffer needs only paths
    import torch

LATEST = "latest"
# Set to a step number, the process SIGKILLs itself midway through writing that checkpoint:
# how the tests prove that a torn checkpoint is never resumed from.
FAULT_KILL_IN_CHECKPOINT = "EXGRPO_FAULT_KILL_IN_CHECKPOINT"


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


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True))


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def optimizer_to_files(optimizer: torch.optim.Optimizer, folder: Path) -> None:
    optimizer_state_to_files(optimizer.state_dict(), folder)


def optimizer_state_to_files(sd: dict[str, Any], folder: Path) -> None:
    import torch
    from safetensors.torch import save_file

    """An `optimizer.state_dict()`-layout dict (e.g. FSDP's gathered full state) to files."""
    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, dict[str, dict[str, Any]]] = {}
    for pid, st in sd["state"].items():
        layout[str(pid)] = {}
        for name, val in st.items():
            if torch.is_tensor(val):
                key = f"{pid}.{name}"
                tensors[key] = val.detach().cpu().contiguous()
                layout[str(pid)][name] = {"tensor": key}
            else:
                layout[str(pid)][name] = {"value": val}
    save_file(tensors, str(folder / "optimizer.safetensors"))
    write_json(folder / "optimizer.json", {"state": layout, "param_groups": sd["param_groups"]})


def optimizer_from_files(optimizer: torch.optim.Optimizer, folder: Path) -> None:
    optimizer.load_state_dict(optimizer_state_from_files(folder))


def optimizer_state_from_files(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    meta = read_json(folder / "optimizer.json")
    tensors = load_file(str(folder / "optimizer.safetensors"))
    state: dict[int, dict[str, Any]] = {}
    for pid, entries in meta["state"].items():
        state[int(pid)] = {
            n: tensors[e["tensor"]] if "tensor" in e else e["value"] for n, e in entries.items()
        }
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(ckpt_root: Path, step: int, write: Callable[[Path], None], keep: int) -> Path:
    """Run `write(tmp_folder)`, then atomically publish it as step_<step> and point `latest` at it."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step}"
    tmp = ckpt_root / f".tmp-step_{step}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    write(tmp)
    if os.environ.get(FAULT_KILL_IN_CHECKPOINT) == str(step):  # fault injection for the kill tests
        os.kill(os.getpid(), signal.SIGKILL)
    write_json(tmp / "COMPLETE", {"step": step})
    _fsync_tree(tmp)
    if final.exists():  # a re-save of the same step (e.g. the final one): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer_tmp = ckpt_root / f".{LATEST}.tmp"
    pointer_tmp.write_text(final.name)
    with open(pointer_tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(pointer_tmp, ckpt_root / LATEST)
    _prune(ckpt_root, keep, protect=final)
    return final


def _prune(ckpt_root: Path, keep: int, protect: Path) -> None:
    done = sorted(complete_checkpoints(ckpt_root), key=lambda p: int(p.name.split("_")[1]))
    for old in done[:-keep]:
        if old != protect:
            shutil.rmtree(old, ignore_errors=True)
    for stale in ckpt_root.glob(".tmp-step_*"):  # leftovers of a write that was killed
        shutil.rmtree(stale, ignore_errors=True)


def complete_checkpoints(ckpt_root: Path) -> list[Path]:
    if not ckpt_root.is_dir():
        return []
    return [p for p in ckpt_root.glob("step_*") if (p / "COMPLETE").is_file()]


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint `latest` names if complete, else the newest complete one, else None."""
    pointer = ckpt_root / LATEST
    if pointer.is_file():
        cand = ckpt_root / pointer.read_text().strip()
        if (cand / "COMPLETE").is_file():
            return cand
    done = complete_checkpoints(ckpt_root)
    return max(done, key=lambda p: int(p.name.split("_")[1])) if done else None
