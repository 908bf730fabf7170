"""The official objective on 1 or 2 ranks against the official 8-GPU formula re-computed by hand.

Imported by tests/algo/test_aggregation.py for one process, and run under torchrun (gloo, CPU) by
it for two ranks. Every rank builds the same ten-group step; rank r trains on groups r, r+R, ...
(as the trainer deals them), and the gradient FSDP2 combines from the ranks must equal the gradient
of the official run's objective for that whole step, computed in one plain process without any of
exgrpo's aggregation code: what 8 GPUs, each holding the groups g with g mod 8 = its rank and
cutting them into the official micro-batches, would have averaged.
"""

from __future__ import annotations

import json
import sys

import torch
from update_plans import toy_plan

from exgrpo_cli.algo.advantages import group_advantages
from exgrpo_cli.algo.aggregation import Aggregation, AggregationSettings, official
from exgrpo_cli.algo.losses import ExgrpoLoss
from exgrpo_cli.data.types import Question
from exgrpo_cli.parallel import fsdp as D
from exgrpo_cli.parallel.process_end import ends_without_teardown
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.replay.mixing import Group, MixedBatch, Response, build_mixed_batch
from exgrpo_cli.step.update import policy_update

from conftest import tiny_qwen2

L, BETA, COEF, PROMPT = 16, 0.1, 0.05, 6
# GA = 64 / 32 = 2; the official micro-batches' token budget is 40 tokens per GPU
SETTINGS = AggregationSettings(ppo_mini_batch_size=64, ppo_micro_batch_size=32, ppo_max_token_len_per_gpu=40)
GPUS, GA = 8, 2
# response lengths per group (group 3 also holds a replayed row of 4 tokens); prompts are 6 tokens
RESPONSES = [[10, 4], [5, 6], [3, 2], [5, 3], [7, 1], [2, 2], [4, 4], [1, 6], [8, 3], [2, 7]]
# On 8 GPUs, GPU 0 holds groups 0 and 8 (sequences 16, 10, 14, 9: 49 tokens), GPU 1 groups 1 and 9
# (11, 12, 8, 13: 44), every other GPU one group (under 40). The count is the max over GPUs of
# ceil(tokens / 40) = 2, so each GPU cuts its rows into 2 balanced micro-batches (by hand: longest
# first, each to the lighter): rows as (group, index in group)
OFFICIAL_MICRO_BATCHES = [
    [(0, 0), (8, 1)], [(8, 0), (0, 1)],  # GPU 0: 16 + 9, 14 + 10
    [(9, 1), (9, 0)], [(1, 1), (1, 0)],  # GPU 1: 13 + 8, 12 + 11
    [(2, 0)], [(2, 1)],
    [(3, 0)], [(3, 2), (3, 1)],  # 11 | 10 (the replayed row) + 9
    [(4, 0)], [(4, 1)],
    [(5, 0)], [(5, 1)],
    [(6, 0)], [(6, 1)],
    [(7, 0)], [(7, 1)],
]  # fmt: skip


def model() -> torch.nn.Module:
    return tiny_qwen2(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2)


def step_groups() -> list[Group]:
    g = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 64, (n,), generator=g).tolist()

    groups = []
    for k, lengths in enumerate(RESPONSES):
        rewards = [1.0, 0.0] if k % 3 else [0.0, 1.0]
        responses = [Response(ids(n), None, r) for n, r in zip(lengths, rewards)]
        groups.append(Group(Question(f"q{k}", "q", "1"), ids(PROMPT), responses))
    groups[3].responses.append(Response(ids(4), [-2.0] * 4, 1.0, replayed=True))
    return groups


def official_gradient(net: torch.nn.Module) -> list[torch.Tensor]:
    """The gradient of the official 8-GPU objective over the whole step, from each row alone."""
    groups = step_groups()
    batch = build_mixed_batch(groups)
    adv = group_advantages(batch.rewards, batch.group_index)
    key_of, row = {}, 0
    for gi, group in enumerate(groups):
        for ri in range(len(group.responses)):
            key_of[(gi, ri)] = row
            row += 1
    losses, entropies = [], []
    for i in range(len(batch)):
        prompt, resp = batch.prompt_ids[i], batch.response_ids[i]
        logits = net(torch.tensor([prompt + resp])).logits[0, len(prompt) - 1 : -1].float()
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(-1, torch.tensor(resp)[:, None])[:, 0]
        entropies.append(-(logp_all.exp() * logp_all).sum(-1))
        if bool(batch.replay_mask[i]):
            w = torch.exp(logp - torch.tensor(batch.behavior_logp[i]))
            losses.append(-adv[i] * w / (w + BETA))
        else:
            losses.append(-adv[i] * torch.exp(logp - logp.detach()))
    assert sorted(key_of) == sorted(k for mb in OFFICIAL_MICRO_BATCHES for k in mb)
    # each GPU: per micro-batch (sum of token losses / L - coef x token-mean entropy) / GA; FSDP's mean
    total = torch.zeros(())
    for mb in OFFICIAL_MICRO_BATCHES:
        rows = [key_of[k] for k in mb]
        tokens = sum(len(batch.response_ids[i]) for i in rows)
        share = sum(losses[i].sum() for i in rows) / L - COEF * sum(entropies[i].sum() for i in rows) / tokens
        total = total + share / GA
    objective = total / GPUS
    net.zero_grad()
    objective.backward()
    return [p.grad.detach().clone() for p in net.parameters()]


class Capture(torch.optim.Optimizer):
    """An optimizer whose step only records the (full, unsharded) gradients it was given."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        super().__init__(params, {})
        self.grads: list[torch.Tensor] = []

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        grads = [p.grad for g in self.param_groups for p in g["params"]]
        self.grads = [(g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone() for g in grads]


def exgrpo_gradient(net: torch.nn.Module, parallel: DataParallel, budget: int) -> list[torch.Tensor]:
    """This rank's share of the step through exgrpo's update (FSDP2 on several ranks)."""
    groups = step_groups()
    mine = parallel.mine(len(groups))
    batch: MixedBatch = build_mixed_batch([groups[i] for i in mine], step_groups=mine)
    adv = group_advantages(batch.rewards, batch.group_index)
    return update_gradient(net, batch, adv, official(SETTINGS), budget, parallel)


def update_gradient(
    net: torch.nn.Module,
    batch: MixedBatch,
    adv: torch.Tensor,
    aggregation: Aggregation,
    budget: int,
    parallel: DataParallel | None = None,
) -> list[torch.Tensor]:
    """The gradient exgrpo's update hands the optimizer for `batch` under `aggregation`, in memory
    micro-batches of `budget` tokens (also test_aggregation.py's, for each aggregation)."""
    plan = toy_plan(
        loss=ExgrpoLoss(clip_eps=None, beta=BETA),
        aggregation=aggregation,
        entropy_coef=COEF,
        max_response_tokens=L,
        micro_batch_tokens=budget,
        grad_clip=1e9,
        skip_grad_norm_above=float("inf"),
    )
    opt = Capture(list(net.parameters()))
    policy_update(net, opt, batch, adv, plan, pad_id=0, parallel=parallel)
    return opt.grads


def max_difference(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((g - w).abs().max()) for g, w in zip(got, want))


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    parallel = D.init_distributed(timeout_s=60)
    assert parallel.distributed and parallel.device.type == "cpu", parallel
    want = official_gradient(model())
    report = {
        "world_size": parallel.world_size,
        "max_diff": [],
        "max_abs_grad": max(float(w.abs().max()) for w in want),
    }
    for budget in (24, 4096):  # exgrpo's memory micro-batches: 1-2 rows, or all rows at once
        got = exgrpo_gradient(D.wrap_fsdp2(model(), parallel), parallel, budget)
        report["max_diff"].append(max_difference(got, want))
    if parallel.is_main:
        with open(out_path, "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    with ends_without_teardown():  # no race with gloo's threads at exit
        main(sys.argv[1])
