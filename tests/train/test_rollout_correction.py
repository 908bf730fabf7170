"""algo.rollout_correction in the update, against a by-hand computation: a stand-in engine whose
log-probs are the trainer's pi_old shifted per token, enough to hit token_tis's cap and to leave
geo_mask's band (the real engines here run fp32, every ratio is ~1 and the check could not fail).

With one update the current policy is pi_old, so every fresh token's PPO ratio is exactly 1 and
its loss is -A; the Dr.GRPO objective divides the summed token losses by rows x L. The corrected
objective is then sum over fresh tokens of -A * weight / (rows x L), the weights worked out here by
hand from the shifts. Off (null), the update is today's: the same loss, bit for bit.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from update_plans import toy_plan

from exgrpo_cli.algo import group_advantages
from exgrpo_cli.algo.rollout_correction import RolloutCorrection
from exgrpo_cli.config.schema import ModelConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.policy.model import load_model, load_tokenizer
from exgrpo_cli.replay.mixing import Group, MixedBatch, Response, build_mixed_batch
from exgrpo_cli.step.update import UpdateResult, policy_update

from conftest import run_cli

L = 48  # toy_plan's max_response_tokens, the Dr.GRPO constant
# per-row shift pi_old - pi_engine of every token: e (cap 2 hits) on every other token of row 0,
# 1.003 (kept by geo_mask) on row 1, 1.05 (token_tis keeps it, geo_mask drops the row) on row 2
SHIFTS = [lambda t: 1.0 if t % 2 == 0 else 0.0, lambda t: 0.003, lambda t: 0.05]


def _setup(tiny_model: Path) -> tuple[Any, Any, MixedBatch, dict[int, list[float]]]:
    torch.manual_seed(0)
    cfg = ModelConfig(path=str(tiny_model))
    tok, model = load_tokenizer(cfg), load_model(cfg, torch.device("cpu"))
    texts = [
        "<think>1+2 = 3</think>\\boxed{3}<|im_end|>",
        "<think>3</think>\\boxed{4}",
        "\\boxed{5}<|im_end|>",
    ]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    prompt = tok("What is 1+2?", add_special_tokens=False)["input_ids"]
    q = Question("q", "What is 1+2?", "3")
    rewards = [1.0, 0.0, 0.0]
    # pi_old of each response: the trainer's own log-probs, from a null update at lr 0
    probe = build_mixed_batch(
        [Group(q, prompt, [Response(i, [0.0] * len(i), r) for i, r in zip(ids, rewards)])]
    )
    res = policy_update(
        copy.deepcopy(model),
        torch.optim.SGD(model.parameters(), lr=0.0),
        probe,
        group_advantages(probe.rewards, probe.group_index),
        toy_plan(),
        tok.pad_token_id,
    )
    engine = [[lp - SHIFTS[r](t) for t, lp in enumerate(res.trainer_logp[r])] for r in range(3)]
    batch = build_mixed_batch(
        [Group(q, prompt, [Response(i, e, r) for i, e, r in zip(ids, engine, rewards)])]
    )
    return model, tok, batch, res.trainer_logp


def _loss(
    model: torch.nn.Module, tok: Any, batch: MixedBatch, correction: RolloutCorrection | None
) -> tuple[UpdateResult, list[float]]:
    m = copy.deepcopy(model)
    adv = group_advantages(batch.rewards, batch.group_index)
    plan = toy_plan(rollout_correction=correction)
    res = policy_update(m, torch.optim.SGD(m.parameters(), lr=1e-3), batch, adv, plan, tok.pad_token_id)
    return res, adv.tolist()


def test_token_tis_and_geo_mask_match_a_by_hand_computation(tiny_model: Path) -> None:
    model, tok, batch, old = _setup(tiny_model)
    n = [len(old[r]) for r in range(3)]
    null, adv = _loss(model, tok, batch, None)
    assert null.loss_total == pytest.approx(sum(-a * k for a, k in zip(adv, n)) / (3 * L), rel=1e-5)
    assert null.correction.tokens == 0  # off: nothing computed, the loss is today's

    tis, _ = _loss(model, tok, batch, RolloutCorrection("token_tis", cap=2.0))
    weights = [[min(math.exp(SHIFTS[r](t)), 2.0) for t in range(n[r])] for r in range(3)]
    want = sum(-adv[r] * sum(weights[r]) for r in range(3)) / (3 * L)
    assert tis.loss_total == pytest.approx(want, rel=1e-4)
    assert tis.correction.cut == (n[0] + 1) // 2  # row 0's even tokens hit the cap
    assert tis.correction.weight_sum == pytest.approx(sum(map(sum, weights)), rel=1e-5)

    geo, _ = _loss(model, tok, batch, RolloutCorrection("geo_mask", low=0.99, high=1.01))
    # row 0: geometric mean exp(~0.5) -> dropped; row 1: 1.003 kept; row 2: 1.05 dropped
    mean0 = sum(SHIFTS[0](t) for t in range(n[0])) / n[0]
    assert math.exp(mean0) > 1.01
    assert geo.loss_total == pytest.approx(-adv[1] * n[1] / (3 * L), rel=1e-4)
    assert geo.correction.cut == n[0] + n[2] and geo.correction.weight_sum == n[1]
    # the check compares with a real difference: the three losses differ
    assert len({round(x.loss_total, 8) for x in (null, tis, geo)}) == 3


def test_top_p_below_1_with_a_correction_is_refused_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run_cli(
        ["train", "rollout.top_p=0.9", "algo.rollout_correction.mode=token_tis", f"hydra.run.dir={out}"],
        timeout=120,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "rollout.top_p" in lines[0] and "rollout_correction" in lines[0], lines
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()
