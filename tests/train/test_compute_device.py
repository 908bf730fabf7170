"""The step computes on the run's device, not where the parameters are.

Under FSDP2's CPU offload (trainer.offload=all) the parameters live in host memory while every
forward runs on the GPU: batches packed on the parameters' device would meet CUDA hidden states
on the CPU, and the micro-batch budget and the memory metrics would be the CPU's. Here the
parameters are plain CPU tensors while `dist.device` says `meta` (or `cuda`), which a CPU-only
machine can stand in for honestly: the batches are recorded on their way into the forward.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from toy_trainer import toy_state
from update_plans import toy_plan

from exgrpo_cli.algo import group_advantages
from exgrpo_cli.algo.logprobs import NLL
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.parallel import fsdp as D
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy import scoring
from exgrpo_cli.policy.forward import SequenceBatch
from exgrpo_cli.replay.mixing import Group, Response, build_mixed_batch
from exgrpo_cli.run.setup import choices
from exgrpo_cli.step import update
from exgrpo_cli.step.loop import Trainer

META = torch.device("meta")


class Reached(Exception):
    """Raised by the stand-in forward once it has seen the batch."""


def _recording_forward(seen: list[torch.device]) -> Callable[..., None]:
    def forward(model: torch.nn.Module, batch: SequenceBatch, **kwargs: object) -> None:
        seen.append(batch.input_ids.device)
        raise Reached

    return forward


def test_the_update_packs_its_batches_on_the_dist_device(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[torch.device] = []
    monkeypatch.setattr(update, "forward_logprobs", _recording_forward(seen))
    model = torch.nn.Linear(2, 2)  # parameters on the CPU
    group = Group(Question("q", "q", "1"), [1, 2], [Response([3, 4], None, 1.0), Response([5], None, 0.0)])
    batch = build_mixed_batch([group])
    plan = toy_plan(max_response_tokens=8, micro_batch_tokens=64, skip_grad_norm_above=1e9)
    adv = group_advantages(batch.rewards, batch.group_index)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.raises(Reached):
        update.policy_update(model, opt, batch, adv, plan, pad_id=0, parallel=DataParallel(device=META))
    assert seen == [META]


def test_candidate_scoring_packs_on_the_dist_device(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[torch.device] = []
    monkeypatch.setattr(scoring, "forward_logprobs", _recording_forward(seen))
    with pytest.raises(Reached):
        scoring.score_candidates(
            torch.nn.Linear(2, 2),
            [[1, 2]],
            [[3, 4]],
            kind=NLL,
            temperature=1.0,
            pad_id=0,
            token_budget=64,
            max_rows=4,
            parallel=DataParallel(device=META),
        )
    assert seen == [META]


def test_the_trainer_budgets_micro_batches_for_the_dist_device() -> None:
    """algo.micro_batch_tokens=0 means the compute device's default: the GPU's, not the CPU's
    where offloaded parameters sit."""
    cfg = ExgrpoConfig()
    assert cfg.algo.micro_batch_tokens == 0
    state = toy_state()
    state.model = torch.nn.Linear(2, 2)
    cuda = DataParallel(device=torch.device("cuda", 0))
    trainer = Trainer(cfg, state, None, None, None, None, choices(cfg), parallel=cuda)  # type: ignore[arg-type]
    assert trainer.device == torch.device("cuda", 0)
    assert (
        trainer.token_budget
        == 16384
        != Trainer(cfg, state, None, None, None, None, choices(cfg)).token_budget
    )  # type: ignore[arg-type]


def test_module_device_is_the_fsdp_mesh_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a DataParallel (the HF engine, library callers): an FSDP2 parameter in host memory
    computes on its mesh's device; a plain parameter where it is."""
    plain = torch.nn.Linear(2, 2)
    assert D.module_device(plain) == torch.device("cpu") == D.local_dist(plain).device
    offloaded = torch.nn.Linear(2, 2)
    offloaded.weight.device_mesh = SimpleNamespace(device_type="cuda")  # type: ignore[attr-defined]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert D.module_device(offloaded) == torch.device("cuda", 3)
