"""FSDP2 on CPU/gloo with two ranks against a one-process reference (see fsdp_worker.py), and the
one-rank fallbacks of exgrpo_cli.parallel.fsdp."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from policy.gloo_ranks import run_gloo_ranks

from exgrpo_cli.checkpoint import optimizer_files
from exgrpo_cli.parallel import fsdp as D
from exgrpo_cli.parallel.sharding import DataParallel

from conftest import REPO, worker_env

WORKER = Path(__file__).resolve().parent / "fsdp_worker.py"


@pytest.mark.slow
def test_fsdp2_two_ranks_match_single_process(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    run_gloo_ranks(str(WORKER), str(out), env=worker_env(REPO / "tests"))
    report = json.loads(out.read_text())
    assert report["world_size"] == 2
    assert max(report["grad_diff"]) < 1e-5
    assert report["chunked_grad_diff"] < 1e-5  # the chunked head under FSDP2 (tied embeddings)
    assert max(report["weight_diff"]) < 1e-4
    assert report["state_dict_keys"] == 27  # 2 layers x 12 + norm + embed_tokens + (tied) lm_head
    assert report["loss"][1] < report["loss"][0]


def test_single_rank_is_plain_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    parallel = D.init_distributed(timeout_s=5, device="cpu")
    assert (parallel.rank, parallel.world_size, parallel.distributed, parallel.is_main) == (0, 1, False, True)
    assert not torch.distributed.is_initialized()
    model = torch.nn.Linear(3, 2)
    assert D.wrap_fsdp2(model, parallel, mixed_precision="bf16") is model
    assert not D.is_sharded(model)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    osd = opt.state_dict()  # a legacy checkpoint's layout
    fresh = torch.optim.AdamW(model.parameters())
    optimizer_files.load_full_optimizer_state_dict(model, fresh, osd, parallel)
    assert torch.equal(fresh.state[model.weight]["exp_avg"], opt.state[model.weight]["exp_avg"])


def test_decoder_layers_refuses_unknown_models() -> None:
    with pytest.raises(ValueError, match="model.layers"):
        D.decoder_layers(torch.nn.Linear(2, 2))


@pytest.mark.slow  # two torchrun ranks: 56 s measured on the shared 2-core machine
def test_rank0_reads_the_weights_and_a_two_rank_optimizer_resumes_on_one(tmp_path: Path) -> None:
    """Under torchrun rank 0 alone reads the model files (rank 1 opens none) and every rank ends
    with rank 0's weights; the optimizer state written sharded by two ranks loads, exactly, into a
    one-process run (torch.distributed.checkpoint reshards it)."""
    run_gloo_ranks(
        str(WORKER.parent / "load_worker.py"), str(tmp_path), env=worker_env(WORKER.parent, REPO / "tests")
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert abs(report["loss"] - report["reference"]) < 1e-5

    from safetensors.torch import load_file

    spec = importlib.util.spec_from_file_location("fsdp_worker", WORKER)
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    model = worker.build()
    model.load_state_dict(load_file(str(tmp_path / "weights.safetensors")), strict=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer_files.load_optimizer(model, opt, tmp_path / "optimizer", DataParallel())
    expected = load_file(str(tmp_path / "optimizer_full.safetensors"))
    state = opt.state_dict()["state"]
    assert len(state) == len({k.split(".")[0] for k in expected})
    for key, value in expected.items():
        i, name = key.split(".", 1)
        assert torch.equal(state[int(i)][name], value), key
