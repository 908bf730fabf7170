"""One rank of the sharded-optimizer checks, launched by tests/policy/test_sharded_optimizer.py
under torchrun (gloo, CPU): `python shard_worker.py MODE OUT_JSON`. Any failed check raises, so
the job exits non-zero; rank 0 writes what it measured to OUT_JSON.

host_adamw (2 ranks): a model whose last layer has one output row is sharded unevenly (rank 1's
  shard of it is empty), loaded as load_sharded loads (meta, fully_shard, to_empty, rank 0's
  weights broadcast), and trained with HostAdamW. After the optimizer is built a module-wide
  `_apply` (what to_empty and .to() run) makes FSDP2 replace every local shard object, re-padding
  the empty one; the steps must still equal plain AdamW's on one process.
one_rank_fsdp (1 rank): a one-GPU run's model (FSDP2 over a one-rank group, DTensor parameters)
  with the one-process DataParallel the trainer gives it (`distributed` False): a legacy checkpoint's
  full optimizer state (plain `optimizer.state_dict()` layout) loads into DTensor state and
  steps as the one-process reference does; the sharded optimizer files round-trip too.
"""

from __future__ import annotations

import json
import sys

import torch

from exgrpo_cli.checkpoint import optimizer_files
from exgrpo_cli.parallel import fsdp as D
from exgrpo_cli.parallel.offload import HostAdamW
from exgrpo_cli.parallel.offload import gather_full as full  # a DTensor shard's full tensor, else the tensor
from exgrpo_cli.parallel.process_end import ends_without_teardown
from exgrpo_cli.parallel.sharding import DataParallel

LR, STEPS = 1e-2, 3


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def sharded(parallel: DataParallel) -> torch.nn.Module:
    """As policy.model.load_sharded: the architecture on meta, sharded, materialised empty, then
    rank 0's weights broadcast into the shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = build()
    fully_shard(model, mesh=init_device_mesh("cpu", (parallel.world_size,)))
    model.to_empty(device="cpu")
    weights = build().state_dict() if parallel.is_main else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, weights, options=options)
    return model


def host_adamw(parallel: DataParallel) -> dict[str, float]:
    model = sharded(parallel)
    empty = [n for n, p in model.named_parameters() if p._local_tensor.numel() == 0]  # type: ignore[attr-defined]
    assert (parallel.rank == 1) == bool(empty), f"rank {parallel.rank}: empty shards {empty}"
    opt = HostAdamW(model.parameters(), lr=LR, weight_decay=0.01)
    before = [id(p._local_tensor) for p in model.parameters()]  # type: ignore[attr-defined]
    model._apply(lambda t: t.clone())
    replaced = sum(id(p._local_tensor) != b for p, b in zip(model.parameters(), before))  # type: ignore[attr-defined]
    assert replaced == len(before), f"FSDP2 kept {len(before) - replaced} local shard objects"

    ref = build()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=0.01, foreach=False)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))  # the same rows on every rank
    for _ in range(STEPS):
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad(set_to_none=True)
            m(x).pow(2).mean().backward()
            o.step()
    weight_diff = max(
        float((full(p.detach()) - r.detach()).abs().max())
        for p, r in zip(model.parameters(), ref.parameters())
    )
    moment_diff = max(
        float((full(opt.state[p][k]) - ref_opt.state[r][k]).abs().max())
        for p, r in zip(model.parameters(), ref.parameters())
        for k in ("exp_avg", "exp_avg_sq")
    )
    assert weight_diff < 1e-6 and moment_diff < 1e-6, (weight_diff, moment_diff)
    assert all(_local_state(opt, p).device.type == "cpu" for p in model.parameters())
    return {"weight_diff": weight_diff, "moment_diff": moment_diff, "replaced": replaced}


def _local_state(opt: torch.optim.Optimizer, p: torch.Tensor) -> torch.Tensor:
    m = opt.state[p]["exp_avg"]
    return m._local_tensor if hasattr(m, "_local_tensor") else m


def one_rank_fsdp(parallel: DataParallel) -> dict[str, float]:
    import copy
    import tempfile
    from pathlib import Path

    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    assert not parallel.distributed  # what the trainer's one-GPU run has
    mesh = init_device_mesh("cpu", (1,))
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    ref = build()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    for _ in range(2):
        ref_opt.zero_grad()
        ref(x).pow(2).mean().backward()
        ref_opt.step()
    # what checkpoint.optimizer_state_from_files returns: tensors of its own (on one rank the
    # loaded DTensor state may share them, and the reference's steps must not move it)
    legacy = copy.deepcopy(ref_opt.state_dict())

    model = fully_shard(build(), mesh=mesh)
    set_model_state_dict(model, ref.state_dict(), options=StateDictOptions(full_state_dict=True))
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    optimizer_files.load_full_optimizer_state_dict(model, opt, legacy, parallel)
    assert opt.param_groups[0]["lr"] == LR
    assert all(isinstance(opt.state[p]["exp_avg"], DTensor) for p in model.parameters())
    for m, o in ((model, opt), (ref, ref_opt)):
        o.zero_grad()
        m(x).pow(2).mean().backward()
        o.step()
    legacy_diff = max(
        float((full(p.detach()) - r.detach()).abs().max())
        for p, r in zip(model.parameters(), ref.parameters())
    )
    assert legacy_diff < 1e-6, legacy_diff

    with tempfile.TemporaryDirectory() as tmp:
        optimizer_files.save_optimizer(model, opt, Path(tmp), parallel)
        again = fully_shard(build(), mesh=mesh)
        again_opt = torch.optim.AdamW(again.parameters(), lr=0.5)
        again(x).sum().backward()  # AdamW's state exists once it has stepped
        again_opt.step()
        optimizer_files.load_optimizer(again, again_opt, Path(tmp), parallel)
    files_diff = max(
        float((full(opt.state[p][k]) - full(again_opt.state[q][k])).abs().max())
        for p, q in zip(model.parameters(), again.parameters())
        for k in ("exp_avg", "exp_avg_sq")
    )
    assert files_diff == 0.0, files_diff
    return {"legacy_diff": legacy_diff, "files_diff": files_diff}


MODES = {"host_adamw": host_adamw, "one_rank_fsdp": one_rank_fsdp}


def main(mode: str, out_path: str) -> None:
    torch.set_num_threads(1)
    parallel = D.init_distributed(timeout_s=60, device="cpu")
    if not torch.distributed.is_initialized():  # one CPU rank: FSDP2 needs a group all the same
        torch.distributed.init_process_group("gloo")
    report = MODES[mode](parallel)
    if parallel.is_main:
        with open(out_path, "w") as fh:
            json.dump({"world_size": parallel.world_size, **report}, fh)
    parallel.barrier()
    D.close_distributed()


if __name__ == "__main__":
    with ends_without_teardown():  # no race with gloo's threads at exit
        main(sys.argv[1], sys.argv[2])
