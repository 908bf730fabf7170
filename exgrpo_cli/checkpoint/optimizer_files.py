"""The optimizer's state in a checkpoint: written a shard per rank, read back on any number of
ranks, its metadata parsed as data (checkpoint/metadata_guard.py) and its hyper-parameters taken
from the config (checkpoint/optimizer_groups.py).

Where it sits in the step: `save_optimizer` runs when a step is checkpointed (step/state.py's
`RunState.save`), `load_optimizer` once at resume, before the first step. Every function is
collective under torchrun: each rank writes and reads its own shard.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from exgrpo_cli.parallel.fsdp import is_sharded
from exgrpo_cli.parallel.sharding import DataParallel

PARAM_GROUPS = "param_groups.json"


def _fqn_order(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's own order: torch numbers them 0.. in this order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def load_full_optimizer_state_dict(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    parallel: DataParallel,
) -> None:
    """A checkpoint's full optimizer state in the plain `optimizer.state_dict()` layout (integer
    parameter ids; what checkpoints written before the sharded format hold) into `optimizer`:
    rank 0 passes the state, the other ranks anything. Collective on a sharded model."""
    if not is_sharded(model):  # a one-process CPU run: plain tensors into plain AdamW
        optimizer.load_state_dict(state)
        return
    # FSDP2, one GPU included (a one-rank group, `dist.distributed` False): the state must become
    # DTensor shards like the parameters, which AdamW cannot step with plain tensors
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    sd: dict[str, Any] = {}
    if parallel.is_main:
        names = _fqn_order(model, optimizer)
        groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
        # copies all the way down: the broadcast swaps the values for DTensor shards in place
        sd = {"state": {names[int(i)]: dict(st) for i, st in state["state"].items()}, "param_groups": groups}
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_optimizer_state_dict(model, optimizer, sd, options=opts)


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    """torch.distributed.checkpoint warns on every one-process save or load that it assumes one
    process, although `no_dist=True` asks for exactly that: the default run would print it at each
    checkpoint. Only that message is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield


def save_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path, parallel: DataParallel
) -> None:
    """The optimizer state into `folder`, each rank writing its own shard of it (no gather: at 7B
    the full fp32 AdamW state is ~61 GB), with torch.distributed.checkpoint, which can reshard it
    onto another number of ranks at load. The param groups (lr, betas, ...) go to a JSON file.
    Collective under torchrun."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, optimizer)
    with _quiet_single_process():
        dcp.save({"state": osd["state"]}, checkpoint_id=str(folder), no_dist=not parallel.distributed)
    if parallel.is_main:
        (folder / PARAM_GROUPS).write_text(json.dumps(osd["param_groups"], indent=1))


def load_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path, parallel: DataParallel
) -> None:
    """Inverse of `save_optimizer`, whatever the number of ranks that wrote it. The state is read
    into the optimizer's own (initialised) state tensors, where they are: no second copy, and an
    offloaded optimizer's moments stay in host memory."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from exgrpo_cli.checkpoint.metadata_guard import METADATA_FILE, data_only_reader, read_metadata

    # torch's own reader would pickle.load the metadata: a checkpoint is data, never code. Checked
    # here first (NotDataError, not torch's wrapped error), then read by a reader that parses it so
    read_metadata(folder / METADATA_FILE)
    reader = data_only_reader(folder)
    osd = get_optimizer_state_dict(model, optimizer)  # the optimizer's own state tensors, by name
    with _quiet_single_process():
        dcp.load({"state": osd["state"]}, storage_reader=reader, no_dist=not parallel.distributed)
    from exgrpo_cli.checkpoint.optimizer_groups import check_saved_groups
    from exgrpo_cli.checkpoint.safe_read import read_json

    saved = read_json(folder / PARAM_GROUPS, limit=2**20)
    check_saved_groups(saved, optimizer)  # only the optimizer's keys, numbers and flags
    for group, hyper in zip(optimizer.param_groups, saved):
        group.update({k: tuple(v) if k == "betas" else v for k, v in hyper.items() if k != "params"})


def read_optimizer_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a `save_optimizer` folder, whole, keyed like `state.<param>.exp_avg`: for
    tests and inspection, in one process, whatever the number of ranks that wrote it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from exgrpo_cli.checkpoint.metadata_guard import METADATA_FILE, data_only_reader, read_metadata

    meta = read_metadata(folder / METADATA_FILE)
    template: dict[str, torch.Tensor] = {
        k: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in meta.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata)
    }
    with _quiet_single_process():
        dcp.load(template, storage_reader=data_only_reader(folder), no_dist=True)
    return template
