"""replay.method=repo (replay/repo.py): every response stored with its reward, retrieval by reward
or recency, split advantages, and the off-policy term a clipped importance ratio."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from exgrpo_cli.algo.losses import ExgrpoLoss, LossInputs
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.mixing import Group, Response, build_mixed_batch
from exgrpo_cli.replay.repo import RepoReplay, clipped_offpolicy_loss, split_advantages

from conftest import REPLAY_RUN, train_in_process

K = 4


def _method(strategy: str, replayed: int = 2) -> RepoReplay:
    cfg = ExgrpoConfig()
    cfg.rollout.n, cfg.replay.method = K, "repo"
    cfg.replay.repo.strategy, cfg.replay.repo.replayed, cfg.replay.repo.min_stored = strategy, replayed, 1
    return RepoReplay(cfg)


def _stored(method: RepoReplay) -> ExperienceBuffer:
    """Question "a" seen at steps 1 and 2: right, wrong, wrong, wrong, then wrong, right, wrong, wrong."""
    buf = ExperienceBuffer(K)
    for step, right in ((1, 0), (2, 1)):
        rs = [Response([step, j], [-1.0, -1.0], reward=float(j == right)) for j in range(K)]
        groups = [Group(Question("a", "a", "1"), [1], rs)]
        rows = method.enters(groups, (0, K - 1))
        buf.observe_groups(groups, step, (0, K - 1), None, rows, method.keeps_prompts, method.stores_any)
        method.recorded(buf, groups, rows)
        method.end_step(buf, step, groups)
    return buf


def _retrieved(method: RepoReplay, buf: ExperienceBuffer) -> list[tuple[int, int]]:
    cands = buf.experiences("a")
    m = method.members(cands, method.values(buf, "a", cands, []), np.random.default_rng(0), K)
    assert m.fresh == K
    return [tuple(cands[i].response_ids.tolist()) for i in m.picks]


def test_every_response_is_stored_with_its_reward() -> None:
    method = _method("reward")
    buf = _stored(method)
    assert buf.num_experiences == 2 * K  # the wrong ones too
    assert sorted(buf.method_state["reward"]["a"].values()) == [0.0] * 6 + [1.0] * 2


def test_reward_oriented_retrieval_takes_the_highest_rewards() -> None:
    # the two right ones (step 1's [1, 0], step 2's [2, 1]), oldest first among equals
    assert _retrieved(_method("reward"), _stored(_method("reward"))) == [(1, 0), (2, 1)]


def test_recency_retrieval_takes_the_newest() -> None:
    assert _retrieved(_method("recency"), _stored(_method("recency"))) == [(2, 3), (2, 2)]


def test_advantages_are_split_between_fresh_and_replayed_rows() -> None:
    fresh = [Response([1], [0.0], reward=r) for r in (1.0, 0.0, 0.0, 0.0)]
    off = [Response([2], [0.0], reward=r, replayed=True) for r in (1.0, 1.0, 0.0)]
    batch = build_mixed_batch([Group(Question("a", "a", "1"), [1], fresh + off)])
    adv = split_advantages(batch, scale_by_std=False)
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, 1 / 3, 1 / 3, -2 / 3]))


def test_the_off_policy_term_is_the_clipped_ratio() -> None:
    w = torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]])  # pi_theta / pi_b per token
    x = LossInputs(
        logp=w.log(),
        behaviour_logp=torch.zeros(2, 3),
        advantages=torch.tensor([1.0, 1.0]),
        response_mask=torch.ones(2, 3),
        replay_mask=torch.tensor([False, True]),
    )
    base = ExgrpoLoss(clip_eps=None, beta=0.1)  # after the start: fresh rows unclipped
    losses, _ = clipped_offpolicy_loss(base, 0.2)(x)
    assert torch.allclose(losses[0], -w[0])  # on-policy: algo.loss's fresh rule
    # A > 0: max(-w, -clip(w, 0.8, 1.2)) = -min(w, 1.2); no f(w) = w / (w + 0.1)
    assert torch.allclose(losses[1], torch.tensor([-0.5, -1.0, -1.2]))


@pytest.mark.slow
def test_repo_trains_retrieving_by_reward_with_split_advantages() -> None:
    """The real path: with one stored response retrieved by reward, the replayed row is a right one
    (a partly solved group stored both kinds); the fresh and the replayed rows are centred apart;
    the replayed rows reach the loss weighed against their stored log-probs."""
    overrides = ["replay.method=repo", "replay.repo.min_stored=1", "replay.repo.replayed=1"]
    rows, updates = train_in_process([*REPLAY_RUN, *overrides])
    replaying = [(r, u) for r, u in zip(rows, updates) if r["replay/replayed_questions"] > 0]
    assert replaying, "the scenario must replay"
    for r, u in replaying:
        b = u.batch
        assert bool(b.replay_mask.any()) and bool((b.rewards[b.replay_mask] == 1).all())
        for g in b.group_index[b.replay_mask].unique().tolist():
            on = (b.group_index == g) & ~b.replay_mask
            assert torch.allclose(u.advantages[on], b.rewards[on] - b.rewards[on].mean())
            assert bool((u.advantages[(b.group_index == g) & b.replay_mask] == 0).all())  # one row
        assert u.plan.importance_correction and u.result.stats.replay_tokens > 0
        assert math.isfinite(r["loss/importance_weight_mean"])


def test_the_buffer_counts_a_replayed_question_over_its_fresh_responses() -> None:
    """K right fresh ones and 2 retrieved: k = K of K (the question retires), not K + 2 (refused)."""
    method, buf = _method("reward"), ExperienceBuffer(K)
    fresh = [Response([5, j], [-1.0, -1.0], reward=1.0) for j in range(K)]
    off = [Response([6, j], [-1.0, -1.0], reward=1.0, replayed=True) for j in range(2)]
    groups = [Group(Question("a", "a", "1"), [1], fresh + off, from_buffer=True)]
    seen = method.observed(groups)
    buf.observe_groups(seen, 3, (0, K - 1), None, method.enters(seen, (0, K - 1)), False, True)
    assert seen[0].num_correct == K and method.end_step(buf, 3, seen) == ["a"] and buf.is_retired("a")
