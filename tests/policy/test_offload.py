"""trainer.offload and gradient checkpointing: HostAdamW is AdamW with its moments in host
memory; FSDP2 is asked for its CPU offload; checkpointing is the non-reentrant kind and changes no
gradient (issue #11 points 4 and 5)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from exgrpo_cli.checkpoint import optimizer_files
from exgrpo_cli.config.schema import ModelConfig
from exgrpo_cli.parallel import fsdp as D
from exgrpo_cli.parallel import sharding as S
from exgrpo_cli.parallel.offload import HostAdamW
from exgrpo_cli.parallel.placement import OFFLOAD_MODES
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy.model import load_model, materialize


def _steps(opt_cls: type[torch.optim.Optimizer], **kw: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    opt = opt_cls(model.parameters(), lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99), **kw)
    x = torch.randn(11, 5, generator=torch.Generator().manual_seed(1))
    for _ in range(4):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    return model, opt


def test_host_adamw_is_adamw() -> None:
    ref, ref_opt = _steps(torch.optim.AdamW, foreach=False)
    got, opt = _steps(HostAdamW)
    for a, b in zip(got.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)
    for p_ref, p in zip(ref.parameters(), got.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(opt.state[p][key], ref_opt.state[p_ref][key], atol=1e-7, rtol=0)
        assert opt.state[p]["exp_avg"].device.type == "cpu"


def test_host_adamw_state_round_trips_in_place(tmp_path: Path) -> None:
    model, opt = _steps(HostAdamW)
    optimizer_files.save_optimizer(model, opt, tmp_path, DataParallel())
    fresh = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    opt2 = HostAdamW(fresh.parameters(), lr=0.5)
    optimizer_files.load_optimizer(fresh, opt2, tmp_path, DataParallel())
    assert opt2.param_groups[0]["lr"] == 1e-2 and opt2.param_groups[0]["betas"] == (0.9, 0.99)
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(opt.state[p]["exp_avg_sq"], opt2.state[q]["exp_avg_sq"])
        assert opt2.state[q]["exp_avg"].device.type == "cpu"


def test_offload_all_asks_fsdp2_for_its_cpu_offload(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.device_mesh as mesh_mod
    import torch.distributed.fsdp as fsdp

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(mesh_mod, "init_device_mesh", lambda *a, **k: "mesh")
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: calls.append(kw))
    model = load_model(ModelConfig(), torch.device("cpu"))
    two_ranks = DataParallel(rank=0, world_size=2)
    D.wrap_fsdp2(model, two_ranks, offload=OFFLOAD_MODES["all"])
    layers = len(model.model.layers)
    assert len(calls) == layers + 1  # each decoder layer, then the root
    assert all(type(c["offload_policy"]).__name__ == "CPUOffloadPolicy" for c in calls)
    assert calls[-1]["reshard_after_forward"] is False
    calls.clear()
    D.wrap_fsdp2(model, two_ranks)
    assert all(type(c["offload_policy"]).__name__ == "OffloadPolicy" for c in calls)
    # one process: FSDP2 on a GPU (mixed precision and offload apply), plain PyTorch on a CPU
    assert D.shards_alone(DataParallel(device=torch.device("cuda", 0)))
    assert not D.shards_alone(DataParallel())


def test_gradient_checkpointing_is_non_reentrant_and_exact() -> None:
    cfg = ModelConfig()
    plain = load_model(cfg, torch.device("cpu"))
    ckpt = load_model(ModelConfig(gradient_checkpointing=True), torch.device("cpu"))
    assert ckpt.model.gradient_checkpointing and not plain.model.gradient_checkpointing
    assert ckpt.model._gradient_checkpointing_func.keywords["use_reentrant"] is False
    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    grads = []
    for m in (plain, ckpt):
        m.train()
        m(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        grads.append([p.grad for p in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_offload_all_materialises_the_shards_in_host_memory_and_the_buffers_on_the_device() -> None:
    """load_sharded's to_empty: FSDP2's CPU offload refuses parameter shards off the host at the
    first forward, while the buffers belong where the model computes (here `meta` stands in for
    the GPU, the parameters being plain tensors)."""

    class Rotary(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.register_buffer("inv_freq", torch.ones(2), persistent=False)

    gpu = torch.device("meta")
    with torch.device("meta"):
        offloaded, placed = Rotary(), Rotary()
    materialize(offloaded, gpu, params_on_host=True)
    assert {p.device.type for p in offloaded.parameters()} == {"cpu"}
    assert offloaded.inv_freq.device == gpu and "inv_freq" in offloaded._non_persistent_buffers_set
    materialize(placed, gpu, params_on_host=False)
    assert {t.device for t in [*placed.parameters(), *placed.buffers()]} == {gpu}


# ---------------------------------------------------------------- collectives under trainer.offload=all
CUDA = torch.device("cuda", 0)  # the compute device as the trainer names it (never allocated here)
HOST = torch.device("cpu")


class HostShard:
    """An FSDP2 DTensor shard in host memory on a CUDA mesh (its process group NCCL's): its gather
    refuses a CPU local tensor, as NCCL does; `.to(device)` moves it (keeping the placement)."""

    device_mesh = SimpleNamespace(device_type="cuda")

    def __init__(self, value: torch.Tensor, device: torch.device = HOST) -> None:
        self.value, self.device, self.dtype = value, device, value.dtype

    def is_floating_point(self) -> bool:
        return True

    def to(self, target: torch.device | torch.dtype | str) -> HostShard:
        if isinstance(target, torch.dtype):
            return HostShard(self.value.to(target), self.device)
        return HostShard(self.value, torch.device(target))

    def full_tensor(self) -> torch.Tensor:
        if self.device.type == "cpu":
            raise RuntimeError("NCCL stand-in: Tensors must be CUDA and dense")
        return torch.cat([self.value, self.value])  # both ranks' shards (on the host: no GPU here)


def test_the_vllm_sync_gathers_offloaded_shards_on_the_compute_device() -> None:
    from exgrpo_cli.rollout.vllm_weights import named_tensors

    shards = {"a": HostShard(torch.ones(2)), "b": HostShard(torch.full((3,), 2.0))}
    got = dict(named_tensors(shards, torch.bfloat16))  # type: ignore[arg-type]
    assert {k: v.tolist() for k, v in got.items()} == {"a": [1.0] * 4, "b": [2.0] * 6}
    assert all(v.dtype == torch.bfloat16 for v in got.values())
    with pytest.raises(RuntimeError, match="NCCL stand-in"):  # gathered where it lies: refused
        shards["a"].full_tensor()


def test_the_checkpoint_export_gathers_on_the_compute_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exgrpo_cli.policy import export

    model = torch.nn.Linear(2, 2)
    shards = {k: HostShard(v.detach()) for k, v in model.state_dict().items()}
    monkeypatch.setattr(model, "state_dict", lambda: shards)
    monkeypatch.setattr(export, "_finish", lambda *a: None)  # the configs: not what is tested
    export.export_hf(model, tmp_path, None, DataParallel(rank=0, world_size=2, device=CUDA))
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "model-00001.safetensors"))
    assert saved["weight"].shape == (4, 2) and saved["bias"].shape == (4,)


def test_grad_clipping_of_offloaded_gradients_reduces_one_scalar_on_the_compute_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from exgrpo_cli.parallel import offload

    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    params[0].grad, params[1].grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 4.0])
    reduced: list[dict[str, float]] = []

    def all_reduce(values: dict[str, float], parallel: DataParallel, op: str = "mean") -> dict[str, float]:
        reduced.append(dict(values))  # plain floats, sent as one tensor on dist.device
        assert op == "sum"
        return {k: v * 2 for k, v in values.items()}  # two ranks holding the same shard norms

    def nccl_clip(*args: Any, **kwargs: Any) -> torch.Tensor:  # torch's: a host tensor over NCCL
        raise RuntimeError("NCCL stand-in: Tensors must be CUDA and dense")

    monkeypatch.setattr(S, "all_reduce_dict", all_reduce)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", nccl_clip)
    norm = offload.clip_grad_norm(params, 1.0, DataParallel(rank=0, world_size=2, device=CUDA))
    assert reduced == [{"sq": 25.0}] and norm == pytest.approx(50**0.5)
    coef = 1.0 / (50**0.5 + 1e-6)
    torch.testing.assert_close(params[0].grad, torch.tensor([3.0 * coef, 0.0, 0.0]))
    torch.testing.assert_close(params[1].grad, torch.tensor([0.0, 4.0 * coef]))
    with pytest.raises(RuntimeError, match="NCCL stand-in"):  # gradients on the compute device: torch's
        offload.clip_grad_norm(params, 1.0, DataParallel(rank=0, world_size=2, device=HOST))
