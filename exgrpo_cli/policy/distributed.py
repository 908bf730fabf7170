"""Data-parallel training with FSDP2: process group, sharding, optimizer files.

Where it sits in the step: `init_distributed` runs once before the model is loaded and
`wrap_fsdp2` once after it; every rank then runs the same train step on its own share of the
questions on `DataParallel.device` (the compute device: `module_device` when none is at hand),
and FSDP2 averages the gradients over ranks inside `backward()`. A checkpoint writes the optimizer
state a shard per rank (`save_optimizer`; `load_optimizer` reads it on any number of ranks), while
the weights are gathered one parameter at a time by their consumers (policy/export.py for the
checkpoint, the vLLM weight sync). What the ranks exchange besides goes through the
`DataParallel` object that `init_distributed` returns (policy/sharding.py).

Launch with `torchrun --nproc_per_node N -m exgrpo_cli train ...` (or trainer.nproc); without it
the world has one rank: on a CPU no process group is created and every exchange is a no-op,
on one GPU a one-rank group lets FSDP2 wrap the model (`shards_alone`). On a CPU the
backend is gloo (FSDP2 works there; FSDP1's offloaded full-state-dict gather segfaults, so it is
not offered). Mixed precision is only applied on CUDA: bf16 matmuls are ~100x slower on a CPU.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch

from exgrpo_cli.errors import UsageError
from exgrpo_cli.policy.placement import NO_OFFLOAD, Offload
from exgrpo_cli.policy.sharding import DataParallel

log = logging.getLogger(__name__)

M = TypeVar("M", bound=torch.nn.Module)

PARAM_GROUPS = "param_groups.json"
# trainer.fsdp_mixed_precision -> the compute dtype's name (policy/lora.py stores a frozen base in it)
MIXED_PRECISION = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


def init_distributed(timeout_s: float = 1800.0, device: str = "auto") -> DataParallel:
    """Join the torchrun process group (nccl on CUDA, gloo on a CPU) and pick this rank's device.

    The timeout is always passed on: a rank that skips a collective (e.g. a rank-0-only branch
    that gathers) would otherwise hang the whole job for the backend's default, up to hours.
    """
    import torch.distributed as tdist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device)
    use_cuda = dev.type == "cuda"
    if use_cuda:
        dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    info = DataParallel(rank, world, local_rank, dev)
    if tdist.is_available() and tdist.is_initialized():
        return info
    if world == 1 and not use_cuda:
        return info  # one process on a CPU: plain PyTorch, no process group
    if not tdist.is_available():
        raise RuntimeError("this torch build has no torch.distributed (FSDP2 needs it)")
    backend = "nccl" if use_cuda else "gloo"
    kwargs: dict[str, Any] = {"device_id": dev} if use_cuda else {}
    if world == 1:  # one GPU without torchrun: a one-rank group, so that FSDP2 can wrap the model
        kwargs.update(init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    tdist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    log.info("rank %d/%d joined the %s process group on %s", rank, world, backend, dev)
    return info


def pick_device(name: str) -> torch.device:
    """`trainer.device` (auto, cpu or cuda) as a device; UsageError for cuda where none is visible."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("invalid trainer.device=cuda: no CUDA device is visible (allowed here: auto or cpu)")
    return torch.device(name)


def free_port() -> int:
    """A TCP port free on this host now (for a local rendezvous: a one-rank group, trainer.nproc)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def close_distributed() -> None:
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The transformer blocks, each its own FSDP unit (HF Qwen2/Llama/Mistral: model.model.layers)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no model.layers: cannot shard it layer by layer")
    return layers


def module_device(model: torch.nn.Module) -> torch.device:
    """The device `model` computes on, for code that has no `DataParallel` at hand (the run's code
    passes `dist.device`). Not simply its parameters' device: under FSDP2's CPU offload
    (trainer.offload=all) the parameters live in host memory while every forward runs on the GPU
    of their device mesh; a plain model computes where its parameters are."""
    param = next(model.parameters())
    mesh = getattr(param, "device_mesh", None)  # a DTensor's (FSDP2)
    if mesh is None or mesh.device_type == param.device.type:
        return param.device
    # FSDP2 computes on the mesh type's current device (the one init_distributed selected)
    index = torch.get_device_module(mesh.device_type).current_device()
    return torch.device(mesh.device_type, index)


def local_dist(model: torch.nn.Module) -> DataParallel:
    """The `DataParallel` of a caller that passes none: one process, computing on `module_device`."""
    return DataParallel(device=module_device(model))


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether `model`'s parameters are FSDP2 shards (DTensors): the case on every GPU run, one
    GPU included, where `DataParallel.distributed` is False."""
    return any(hasattr(p, "device_mesh") for p in model.parameters())


def shards_alone(dist: DataParallel) -> bool:
    """FSDP2 wraps the model of a one-process run too when it runs on a GPU, so that mixed
    precision and offload apply there; a one-process CPU run stays plain PyTorch."""
    return dist.distributed or dist.device.type == "cuda"


def wrap_fsdp2(
    model: M,
    dist: DataParallel,
    *,
    mixed_precision: str | None = None,
    offload: Offload = NO_OFFLOAD,
    reshard_after_forward: bool = True,
) -> M:
    """Shard `model` in place over all ranks: each decoder layer, then the root (embeddings, norm,
    lm_head). Returns the same module, now an FSDPModule whose parameters are DTensors.
    `offload` with params_on_host (trainer.offload=all): FSDP2's CPU offload (parameters,
    gradients and the optimizer step in host memory; see policy/offload.py for `optimizer`, which
    the optimizer itself does).

    One process on a CPU: returned untouched, so single-process code paths stay plain PyTorch.
    Every rank must hold the same initial weights (or load them with `load_sharded`) since each
    keeps its own shard.
    """
    if not shards_alone(dist):
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if mixed_precision:
        if mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision={mixed_precision!r}: use one of {sorted(MIXED_PRECISION)}")
        if dist.device.type == "cuda":
            # reduce in fp32: averaging bf16 gradients over ranks loses the small ones
            mp = MixedPrecisionPolicy(
                param_dtype=getattr(torch, MIXED_PRECISION[mixed_precision]), reduce_dtype=torch.float32
            )
        else:
            log.warning(
                "FSDP mixed precision %s ignored on a CPU (bf16 is ~100x slower there)", mixed_precision
            )
    on_host = offload.params_on_host
    placement = CPUOffloadPolicy(pin_memory=dist.device.type == "cuda") if on_host else OffloadPolicy()
    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    for layer in decoder_layers(model):
        fully_shard(
            layer,
            mesh=mesh,
            mp_policy=mp,
            offload_policy=placement,
            reshard_after_forward=reshard_after_forward,
        )
    # the root's parameters (embeddings, lm_head) are needed again right at the start of backward,
    # and the chunked log-probs use the head outside the model's own forward: kept unsharded
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=placement, reshard_after_forward=False)
    return model


def _fqn_order(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's own order: torch numbers them 0.. in this order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def load_full_optimizer_state_dict(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    dist: DataParallel,
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
    if dist.is_main:
        names = _fqn_order(model, optimizer)
        groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
        # copies all the way down: the broadcast swaps the values for DTensor shards in place
        sd = {"state": {names[int(i)]: dict(st) for i, st in state["state"].items()}, "param_groups": groups}
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_optimizer_state_dict(model, optimizer, sd, options=opts)


# ------------------------------------------------------------------ sharded optimizer files


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    """torch.distributed.checkpoint warns on every one-process save or load that it assumes one
    process, although `no_dist=True` asks for exactly that: the default run would print it at each
    checkpoint. Only that message is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield


def save_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path, dist: DataParallel
) -> None:
    """The optimizer state into `folder`, each rank writing its own shard of it (no gather: at 7B
    the full fp32 AdamW state is ~61 GB), with torch.distributed.checkpoint, which can reshard it
    onto another number of ranks at load. The param groups (lr, betas, ...) go to a JSON file.
    Collective under torchrun."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, optimizer)
    with _quiet_single_process():
        dcp.save({"state": osd["state"]}, checkpoint_id=str(folder), no_dist=not dist.distributed)
    if dist.is_main:
        (folder / PARAM_GROUPS).write_text(json.dumps(osd["param_groups"], indent=1))


def load_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path, dist: DataParallel
) -> None:
    """Inverse of `save_optimizer`, whatever the number of ranks that wrote it. The state is read
    into the optimizer's own (initialised) state tensors, where they are: no second copy, and an
    offloaded optimizer's moments stay in host memory."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from exgrpo_cli.policy.metadata_guard import METADATA_FILE, data_only_reader, read_metadata

    # torch's own reader would pickle.load the metadata: a checkpoint is data, never code. Checked
    # here first (NotDataError, not torch's wrapped error), then read by a reader that parses it so
    read_metadata(folder / METADATA_FILE)
    reader = data_only_reader(folder)
    osd = get_optimizer_state_dict(model, optimizer)  # the optimizer's own state tensors, by name
    with _quiet_single_process():
        dcp.load({"state": osd["state"]}, storage_reader=reader, no_dist=not dist.distributed)
    from exgrpo_cli.policy.optimizer_groups import check_saved_groups
    from exgrpo_cli.policy.safe_read import read_json

    saved = read_json(folder / PARAM_GROUPS, limit=2**20)
    check_saved_groups(saved, optimizer)  # only the optimizer's keys, numbers and flags
    for group, hyper in zip(optimizer.param_groups, saved):
        group.update({k: tuple(v) if k == "betas" else v for k, v in hyper.items() if k != "params"})


def read_optimizer_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a `save_optimizer` folder, whole, keyed like `state.<param>.exp_avg`: for
    tests and inspection, in one process, whatever the number of ranks that wrote it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from exgrpo_cli.policy.metadata_guard import METADATA_FILE, data_only_reader, read_metadata

    meta = read_metadata(folder / METADATA_FILE)
    template: dict[str, torch.Tensor] = {
        k: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in meta.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata)
    }
    with _quiet_single_process():
        dcp.load(template, storage_reader=data_only_reader(folder), no_dist=True)
    return template
