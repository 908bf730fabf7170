"""Data-parallel training with FSDP2: the process group and the model's sharding.

Where it sits in the step: `init_distributed` runs once before the model is loaded and
`wrap_fsdp2` once after it; every rank then runs the same train step on its own share of the
questions on `DataParallel.device` (the compute device: `module_device` when none is at hand),
and FSDP2 averages the gradients over ranks inside `backward()`. A checkpoint writes the optimizer
state a shard per rank (checkpoint/optimizer_files.py), while the weights are gathered one
parameter at a time by their consumers (policy/export.py for the checkpoint, the vLLM weight
sync). What the ranks exchange besides goes through the
`DataParallel` object that `init_distributed` returns (parallel/sharding.py).

Launch with `torchrun --nproc_per_node N -m exgrpo_cli train ...` (or trainer.nproc); without it
the world has one rank: on a CPU no process group is created and every exchange is a no-op,
on one GPU a one-rank group lets FSDP2 wrap the model (`shards_alone`). On a CPU the
backend is gloo (FSDP2 works there; FSDP1's offloaded full-state-dict gather segfaults, so it is
not offered). Mixed precision is only applied on CUDA: bf16 matmuls are ~100x slower on a CPU.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any, TypeVar

import torch

from exgrpo_cli.errors import UsageError
from exgrpo_cli.parallel import process_end
from exgrpo_cli.parallel.placement import NO_OFFLOAD, Offload
from exgrpo_cli.parallel.sharding import DataParallel

log = logging.getLogger(__name__)

M = TypeVar("M", bound=torch.nn.Module)

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
    process_end.note_group_opened()  # the process ends without the interpreter's teardown
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


def shards_alone(parallel: DataParallel) -> bool:
    """FSDP2 wraps the model of a one-process run too when it runs on a GPU, so that mixed
    precision and offload apply there; a one-process CPU run stays plain PyTorch."""
    return parallel.distributed or parallel.device.type == "cuda"


def wrap_fsdp2(
    model: M,
    parallel: DataParallel,
    *,
    mixed_precision: str | None = None,
    offload: Offload = NO_OFFLOAD,
    reshard_after_forward: bool = True,
) -> M:
    """Shard `model` in place over all ranks: each decoder layer, then the root (embeddings, norm,
    lm_head). Returns the same module, now an FSDPModule whose parameters are DTensors.
    `offload` with params_on_host (trainer.offload=all): FSDP2's CPU offload (parameters,
    gradients and the optimizer step in host memory; see parallel/offload.py for `optimizer`, which
    the optimizer itself does).

    One process on a CPU: returned untouched, so single-process code paths stay plain PyTorch.
    Every rank must hold the same initial weights (or load them with `load_sharded`) since each
    keeps its own shard.
    """
    if not shards_alone(parallel):
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if mixed_precision:
        if mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision={mixed_precision!r}: use one of {sorted(MIXED_PRECISION)}")
        if parallel.device.type == "cuda":
            # reduce in fp32: averaging bf16 gradients over ranks loses the small ones
            mp = MixedPrecisionPolicy(
                param_dtype=getattr(torch, MIXED_PRECISION[mixed_precision]), reduce_dtype=torch.float32
            )
        else:
            log.warning(
                "FSDP mixed precision %s ignored on a CPU (bf16 is ~100x slower there)", mixed_precision
            )
    on_host = offload.params_on_host
    placement = CPUOffloadPolicy(pin_memory=parallel.device.type == "cuda") if on_host else OffloadPolicy()
    mesh = init_device_mesh(parallel.device.type, (parallel.world_size,))
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


def fill_shards_from_main(
    model: torch.nn.Module,
    weights: dict[str, Any],
    buffers: dict[str, torch.Tensor],
    parallel: DataParallel,
) -> None:
    """Rank 0's full `weights` (its state dict) and `buffers` broadcast into every rank's sharded
    `model`; the other ranks pass empty dicts. Buffers that are not in the state dict (rotary
    frequencies) were left uninitialised by `to_empty`: rank 0's values, computed at its load, are
    broadcast too. Collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(
        model, weights, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    for name, buf in model.named_buffers():
        if parallel.is_main:
            buf.copy_(buffers[name])
        parallel.fill_from_main(buf)


def copy_full_into(param: Any, full: torch.Tensor) -> None:
    """A parameter's full value into `param`: this rank's part of it when `param` is an FSDP2
    shard (a DTensor), else the whole tensor."""
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        local = distribute_tensor(full.to(param.dtype), param.device_mesh, param.placements).to_local()
        param.to_local().copy_(local)
    else:
        param.copy_(full)
