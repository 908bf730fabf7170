"""How token losses add up (docs/algorithm.md): the update's gradient equals an independent
re-computation of each aggregation's formula, whatever the memory micro-batch budget, and for
`official` whatever the number of ranks (objective_worker.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from algo import objective_worker as worker
from policy.gloo_ranks import run_gloo_ranks

from exgrpo_cli.algo.advantages import group_advantages
from exgrpo_cli.algo.aggregation import (
    AggregationSettings,
    UpdateShape,
    balanced_partition,
    drgrpo,
    official,
)
from exgrpo_cli.data.types import Question
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.replay.mixing import Group, MixedBatch, Response, build_mixed_batch

from conftest import REPO, tiny_qwen2, worker_env

WORKER = Path(__file__).resolve().parent / "objective_worker.py"

L = 16  # max response tokens: the constant of both aggregations
BETA, COEF = 0.1, 0.05


def _model() -> torch.nn.Module:
    return tiny_qwen2(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2)


def _batch() -> MixedBatch:
    """Two groups; sequence lengths (prompt + response) 30, 20, 12, 10 and a replayed row."""
    g = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 64, (n,), generator=g).tolist()

    q = Question("q", "q", "1")
    first = Group(q, ids(14), [Response(ids(16), None, 1.0), Response(ids(6), None, 0.0)])
    second = Group(q, ids(6), [Response(ids(6), None, 1.0), Response(ids(4), None, 0.0)])
    second.responses.append(Response(ids(5), [-2.0] * 5, 1.0, replayed=True))
    return build_mixed_batch([first, second])


def _token_terms(model: torch.nn.Module, batch: MixedBatch, adv: torch.Tensor) -> list[tuple]:
    """Per row, computed alone (no padding, no packing): (token losses, token entropies)."""
    out = []
    for i in range(len(batch)):
        prompt, resp = batch.prompt_ids[i], batch.response_ids[i]
        logits = model(torch.tensor([prompt + resp])).logits[0, len(prompt) - 1 : -1].float()
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(-1, torch.tensor(resp)[:, None])[:, 0]
        ent = -(logp_all.exp() * logp_all).sum(-1)
        if bool(batch.replay_mask[i]):
            w = torch.exp(logp - torch.tensor(batch.behavior_logp[i]))
            loss = -adv[i] * w / (w + BETA)
        else:
            loss = -adv[i] * torch.exp(logp - logp.detach())
        out.append((loss, ent))
    return out


def _grads(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("budget", [24, 4096])  # memory micro-batches of 1-2 rows, or all rows at once
def test_official_on_one_rank_is_the_official_8_gpu_objective(budget: int) -> None:
    """One process trains on the whole step: its gradient is the 8 GPUs' averaged one, not 8x it."""
    want = worker.official_gradient(worker.model())
    got = worker.exgrpo_gradient(worker.model(), DataParallel(), budget)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_official_on_two_ranks_is_the_official_8_gpu_objective(tmp_path: Path) -> None:
    """Two gloo ranks under FSDP2, each with half the step's groups, combine to the same gradient."""
    out = tmp_path / "report.json"
    run_gloo_ranks(str(WORKER), str(out), env=worker_env(REPO / "tests"), timeout=240)
    report = json.loads(out.read_text())
    assert report["world_size"] == 2
    assert report["max_abs_grad"] > 1e-3  # the comparison is not between two near-zero gradients
    assert max(report["max_diff"]) < 1e-6, report


@pytest.mark.parametrize("budget", [24, 4096])
def test_drgrpo_gradient_matches_its_formula(budget: int) -> None:
    model, batch = _model(), _batch()
    adv = group_advantages(batch.rewards, batch.group_index)
    terms = _token_terms(model, batch, adv)
    tokens = sum(len(r) for r in batch.response_ids)
    expected = (
        sum(t[0].sum() for t in terms) / (len(batch) * L) - COEF * sum(t[1].sum() for t in terms) / tokens
    )
    want = _grads(model, expected)
    for w, g in zip(want, worker.update_gradient(model, batch, adv, drgrpo, budget)):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def test_official_counts_micro_batches_as_the_official_actor() -> None:
    # 8 ranks, this one holding group 0's three rows (step groups g go to rank g mod 8)
    keys = [(0, 0), (0, 1), (0, 2)]
    shape = UpdateShape([10, 10, 10], [40, 40, 40], rows_mean=3, max_response_tokens=8192, row_keys=keys)
    settings = AggregationSettings(64, 64, 100)  # GA 1; 120 tokens -> ceil(1.2) = 2 micro-batches
    others = [[((g, 0), 40, 10)] for g in range(1, 8)]
    norms = official(settings)(shape, lambda mine: [mine, *others])
    assert norms.policy == 8192  # on the official 8 ranks: the official per-rank divisors
    assert sorted(norms.entropy) == [10.0, 20.0, 20.0]  # one row alone, two together
    # another rank needs 3: every rank then cuts 3 (the official all-reduces the count with MAX)
    heavy = [[((1, i), 60, 10) for i in range(4)], *others[1:]]  # 240 tokens: ceil(2.4) = 3
    assert official(settings)(shape, lambda mine: [mine, *heavy]).entropy == [10.0, 10.0, 10.0]
    # the same rows in one process: the 8 GPUs' average, so every divisor is 8x the per-GPU one
    alone = official(settings)(shape, lambda mine: [mine])
    assert alone.policy == 8192 * 8 and sorted(alone.entropy) == [80.0, 160.0, 160.0]
    assert AggregationSettings(64, 8, 32768).gradient_accumulation == 8
    with pytest.raises(ValueError, match="row_keys"):  # two ranks' rows under one key
        official(settings)(shape, lambda mine: [mine, mine])


def test_balanced_partition() -> None:
    assert balanced_partition([30, 20, 12, 10], 2) == [[0, 3], [1, 2]]
    assert balanced_partition([5, 5], 4) == [[0], [1]]  # never more groups than rows
    parts = balanced_partition([7, 3, 9, 1, 4, 6], 3)
    assert sorted(i for p in parts for i in p) == list(range(6)) and all(parts)
    sums = [sum([7, 3, 9, 1, 4, 6][i] for i in p) for p in parts]
    assert max(sums) - min(sums) <= max([7, 3, 9, 1, 4, 6])
    assert math.isclose(sum(sums), 30)
