"""How token losses add up (ALGORITHM.md 4): the update's gradient equals an independent
re-computation of each aggregation's formula, whatever the memory micro-batch budget."""

from __future__ import annotations

import math

import pytest
import torch

from exgrpo_cli.algo.advantages import group_advantages
from exgrpo_cli.algo.aggregation import (
    Aggregation,
    AggregationSettings,
    UpdateShape,
    balanced_partition,
    drgrpo,
    official,
)
from exgrpo_cli.algo.losses import LossSettings, exgrpo_loss
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.mixing import Group, MixedBatch, Response, build_mixed_batch
from exgrpo_cli.train.update import UpdatePlan, policy_update

from conftest import tiny_qwen2

L = 16  # max response tokens: the constant of both aggregations
BETA, COEF = 0.1, 0.05


class Capture(torch.optim.Optimizer):
    """An optimizer whose step only records the gradients it was given."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        super().__init__(params, {})
        self.grads: list[torch.Tensor] = []

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        self.grads = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]]


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


def _ours(
    model: torch.nn.Module, batch: MixedBatch, adv: torch.Tensor, aggregation: Aggregation, budget: int
) -> list[torch.Tensor]:
    plan = UpdatePlan(
        loss=exgrpo_loss,
        loss_settings=LossSettings(clip_eps=None, beta=BETA),
        aggregation=aggregation,
        entropy_coef=COEF,
        importance_correction=True,
        max_response_tokens=L,
        updates=1,
        micro_batch_tokens=budget,
        grad_clip=1e9,
        skip_grad_norm_above=float("inf"),
    )
    opt = Capture(list(model.parameters()))
    policy_update(model, opt, batch, adv, plan, pad_id=0)
    return opt.grads


@pytest.mark.parametrize("budget", [24, 4096])  # memory micro-batches of 1-2 rows, or all rows at once
def test_official_gradient_matches_the_official_formula(budget: int) -> None:
    model, batch = _model(), _batch()
    adv = group_advantages(batch.rewards, batch.group_index)
    # official settings: GA = 64 / 32 = 2; 83 tokens / budget 45 -> ceil(1.84) = 2 dynamic
    # micro-batches, whose most balanced split (by hand) is {30, 11} and {20, 12, 10}: 41 and 42
    settings = AggregationSettings(
        ppo_mini_batch_size=64, ppo_micro_batch_size=32, ppo_max_token_len_per_gpu=45
    )
    lengths = [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)]
    assert lengths == [30, 20, 12, 10, 11]
    official_microbatches = [[0, 4], [1, 2, 3]]
    terms = _token_terms(model, batch, adv)
    expected = sum(
        (
            sum(terms[i][0].sum() for i in mb) / L
            - COEF * sum(terms[i][1].sum() for i in mb) / sum(len(batch.response_ids[i]) for i in mb)
        )
        / 2
        for mb in official_microbatches
    )
    want = _grads(model, expected)
    got = _ours(model, batch, adv, official(settings), budget)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


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
    for w, g in zip(want, _ours(model, batch, adv, drgrpo, budget)):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def test_official_counts_micro_batches_as_the_official_actor() -> None:
    shape = UpdateShape([10, 10, 10], [40, 40, 40], rows_mean=3, max_response_tokens=8192)
    settings = AggregationSettings(64, 64, 100)  # GA 1; 120 tokens -> ceil(1.2) = 2 micro-batches
    norms = official(settings)(shape, lambda n: n)
    assert norms.policy == 8192
    assert sorted(norms.entropy) == [10.0, 20.0, 20.0]  # one row alone, two together
    # another rank needs 3: every rank then cuts 3 (the official all-reduces the count with MAX)
    assert official(settings)(shape, lambda n: 3).entropy == [10.0, 10.0, 10.0]
    assert AggregationSettings(64, 8, 32768).gradient_accumulation == 8


def test_balanced_partition() -> None:
    assert balanced_partition([30, 20, 12, 10], 2) == [[0, 3], [1, 2]]
    assert balanced_partition([5, 5], 4) == [[0], [1]]  # never more groups than rows
    parts = balanced_partition([7, 3, 9, 1, 4, 6], 3)
    assert sorted(i for p in parts for i in p) == list(range(6)) and all(parts)
    sums = [sum([7, 3, 9, 1, 4, 6][i] for i in p) for p in parts]
    assert max(sums) - min(sums) <= max([7, 3, 9, 1, 4, 6])
    assert math.isclose(sum(sums), 30)
