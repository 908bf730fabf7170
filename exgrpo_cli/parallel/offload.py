"""Host-memory offload of the training state (`trainer.offload`), for models that do not fit the
GPU otherwise (e.g. a 7B model on one 80 GB GPU, where fp32 weights, gradients and AdamW's two
moments alone are 16 bytes a parameter: 122 GB).

Where it sits: when the trainer is built. `all` is FSDP2's CPU offload (parallel/fsdp.py):
parameters, gradients and the optimizer step live in host memory, each layer is copied to the GPU
for its forward and backward. `optimizer` keeps weights and gradients on the GPU and only AdamW's
moments (8 bytes a parameter, half the state) in host memory: `HostAdamW` brings each
parameter's moments to its device for that parameter's update and writes them back, so at most
one parameter's moments are on the GPU at a time.

Collectives on offloaded tensors (`gather_full`, `clip_grad_norm`): the process group is NCCL's,
which refuses CPU tensors, and under `all` the shards and gradients live in host memory. A shard is
moved to the compute device before its gather (one parameter at a time: the GPU holds it briefly,
the gather runs over NVLink rather than through a host backend); the gradient norm is summed on the
host and only the scalar crosses ranks, on the compute device. One GPU never gathers (a one-rank
mesh skips the collective), so only 2+ GPUs with `all` take these paths.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from exgrpo_cli.parallel.sharding import DataParallel


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), or the tensor itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t  # type: ignore[no-any-return]


def _as_state(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` (host memory, shaped like `p`'s local shard) as `p`'s optimizer state: a DTensor with
    the same placement when `p` is one, so that checkpointing sees an ordinary sharded state."""
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        return DTensor.from_local(
            local, device_mesh=p.device_mesh, placements=p.placements, run_check=False, shape=p.shape,
            stride=p.stride(),
        )  # fmt: skip
    return local


class HostAdamW(torch.optim.AdamW):
    """AdamW (decoupled weight decay, bias correction, as torch's) whose moments live in host
    memory. Parameters and gradients stay where they are; its state dict is AdamW's.

    The moments of all parameters are views into one pinned buffer, allocated once: pinned blocks
    of their own would each be rounded up to a power of two by torch's pinned allocator (7B's
    56.7 GiB of moments took 108 GiB that way)."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        sizes = [[_local(p).numel() for p in g["params"]] for g in self.param_groups]
        total = sum(map(sum, sizes))
        # pinned where a GPU is (faster, asynchronous copies), allocated pinned at once: pinning an
        # ordinary buffer afterwards copies it, holding the moments twice in host memory meanwhile
        pool = torch.zeros(2 * total, dtype=torch.float32, pin_memory=torch.cuda.is_available())
        # flat views by position in param_groups, shaped at the first step: FSDP2 may replace a
        # parameter's local shard object after this (a module-wide `_apply` such as to_empty or
        # .to() re-pads uneven shards), so neither its id() nor its tensor can serve as the key
        self._views: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        offset = 0
        for gi, group_sizes in enumerate(sizes):
            for pi, n in enumerate(group_sizes):
                m, v = pool[offset : offset + n], pool[total + offset : total + offset + n]
                self._views[(gi, pi)] = (m, v)
                offset += n

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("HostAdamW does not take a closure")
        for gi, group in enumerate(self.param_groups):
            beta1, beta2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                state = self.state[p]
                param, grad = _local(p), _local(p.grad)
                if not state:
                    m0, v0 = (flat.view(param.shape) for flat in self._views[(gi, pi)])
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"], state["exp_avg_sq"] = _as_state(p, m0), _as_state(p, v0)
                host_m, host_v = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
                m = host_m.to(param.device, non_blocking=True)
                v = host_v.to(param.device, non_blocking=True)
                state["step"] += 1
                step = float(state["step"])
                param.mul_(1.0 - lr * wd)
                m.lerp_(grad, 1.0 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                denom = (v.sqrt() / math.sqrt(1.0 - beta2**step)).add_(eps)
                param.addcdiv_(m, denom, value=-lr / (1.0 - beta1**step))
                if m.data_ptr() != host_m.data_ptr():  # on another device: copy the moments back
                    host_m.copy_(m, non_blocking=True)
                    host_v.copy_(v, non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the host copies are complete before anyone reads them


def gather_full(t: torch.Tensor) -> torch.Tensor:
    """The full tensor of an FSDP2 DTensor shard (a collective: every rank calls it in step), else
    `t` itself. A shard offloaded to host memory while its mesh is CUDA's (trainer.offload=all on
    GPUs: the group is NCCL's) moves to the current CUDA device, the trainer's (init_distributed
    set it), before its gather; the full tensor is then there too."""
    if not hasattr(t, "full_tensor"):
        return t
    mesh = getattr(t, "device_mesh", None)
    if mesh is not None and t.device.type != mesh.device_type:
        t = t.to(mesh.device_type)  # a DTensor keeps its placements: only the local shard moves
    return t.full_tensor()  # type: ignore[no-any-return]


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float, parallel: DataParallel) -> float:
    """torch's clip_grad_norm_ (global norm under FSDP2), unless the gradients are offloaded to host
    memory on several ranks: torch's would all-reduce a host tensor over NCCL. Then each rank's
    squared norm is summed on the host, the ranks' sums reduced as one scalar on the compute
    device, and the gradients scaled as torch's does (coefficient max_norm / (norm + 1e-6), at
    most 1)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not parallel.distributed or all(_local(g).device == parallel.device for g in grads):
        return float(torch.nn.utils.clip_grad_norm_(list(params), max_norm))
    local = sum(float(torch.linalg.vector_norm(_local(g), dtype=torch.float64)) ** 2 for g in grads)
    norm = math.sqrt(parallel.sum({"sq": local})["sq"])
    coef = min(max_norm / (norm + 1e-6), 1.0)  # NaN stays NaN: the update is then skipped
    for g in grads:
        _local(g).mul_(coef)
    return norm
