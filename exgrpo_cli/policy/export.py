"""The trained weights as a Hugging Face folder, gathered one parameter at a time.

Where it sits: in every checkpoint (step/state.py). `from_pretrained` and vLLM load the folder as
they load any HF model: `config.json`, `generation_config.json`, the tokenizer, and the weights in
safetensors shards (`model.safetensors`, or `model-0000k-of-0000n.safetensors` with
`model.safetensors.index.json` beyond one shard). Under FSDP2 each parameter is all-gathered on
its own (every rank takes part) and rank 0 writes it into the current shard, so host memory holds
at most one shard (`MAX_SHARD_BYTES`) instead of the whole model: 30.5 GB at 7B in fp32.
Parameters shared by two names (tied embeddings) are written once, as `save_pretrained` does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from exgrpo_cli.parallel.offload import gather_full
from exgrpo_cli.policy import lora

if TYPE_CHECKING:
    from exgrpo_cli.parallel.sharding import DataParallel

MAX_SHARD_BYTES = 2 * 2**30
INDEX = "model.safetensors.index.json"


def unique_state_names(model: torch.nn.Module) -> list[str]:
    """The state-dict names to export: every persistent tensor once (a tied output embedding is
    the input embedding's Parameter under a second name, and is left out, as HF does)."""
    every = dict(model.named_parameters(remove_duplicate=False))
    first = dict(model.named_parameters())  # each Parameter once, under its first name
    return [name for name in model.state_dict() if name not in every or name in first]


def export_hf(
    model: torch.nn.Module, folder: Path, tokenizer: Any, parallel: DataParallel | None = None
) -> None:
    """Write `model` (possibly FSDP2-sharded) as an HF folder into `folder`. A collective under
    FSDP: every rank calls it in step; rank 0 writes. A failed write on rank 0 (disk full) still
    takes part in every gather, then raises its OSError."""
    from safetensors.torch import save_file

    main = parallel is None or parallel.is_main
    names = unique_state_names(model)
    # model.lora: the adapted weights merged, under the plain model's names
    tensors = lora.merged_tensors(model, names) if lora.is_lora(model) else _plain(model, names)
    written: list[str] = []
    shards: list[dict[str, torch.Tensor]] = [{}]
    shard_bytes, error = 0, None
    files: list[str] = []

    def flush() -> None:
        nonlocal error
        if error is None and shards[-1]:
            name = f"model-{len(files) + 1:05d}.safetensors"
            try:
                save_file(shards[-1], str(folder / name), metadata={"format": "pt"})
            except OSError as err:
                error = err
            files.append(name)
        shards[-1] = {}

    if main:
        folder.mkdir(parents=True, exist_ok=True)
    for name, full in tensors:  # each a collective under FSDP2 (on the GPU when offloaded)
        written.append(name)
        if not main:
            continue
        full = full.detach().to("cpu").contiguous()
        if shard_bytes + full.nbytes > MAX_SHARD_BYTES and shards[-1]:
            flush()
            shard_bytes = 0
        shards[-1][name] = full.clone() if full.untyped_storage().size() > full.nbytes else full
        shard_bytes += full.nbytes
    if not main:
        return
    flush()
    if error is not None:
        raise error
    _finish(model, folder, files, written, tokenizer)


def _plain(model: torch.nn.Module, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    state = model.state_dict()
    for name in names:
        yield name, gather_full(state[name])


def _finish(model: torch.nn.Module, folder: Path, files: list[str], names: list[str], tokenizer: Any) -> None:
    """Name the shards as HF does and write the index, the configs and the tokenizer."""
    if len(files) == 1:
        (folder / files[0]).rename(folder / "model.safetensors")
    else:
        total = len(files)
        weight_map: dict[str, str] = {}
        for k, old in enumerate(files, start=1):
            new = f"model-{k:05d}-of-{total:05d}.safetensors"
            (folder / old).rename(folder / new)
            from safetensors import safe_open

            with safe_open(str(folder / new), framework="pt") as fh:
                weight_map.update({key: new for key in fh.keys()})  # noqa: SIM118 - safe_open has no __iter__
        size = sum((folder / f).stat().st_size for f in set(weight_map.values()))
        index = {"metadata": {"total_size": size}, "weight_map": {n: weight_map[n] for n in names}}
        (folder / INDEX).write_text(json.dumps(index, indent=1))
    for part in (getattr(model, "config", None), getattr(model, "generation_config", None), tokenizer):
        if part is not None:
            part.save_pretrained(folder)
