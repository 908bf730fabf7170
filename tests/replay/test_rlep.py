"""replay.method=rlep (replay/rlep.py): M stored successes beside K fresh rollouts, advantages over
the K + M, the replayed rows weighed as fresh ones (pi_old of the step, no f(w))."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.experience import Experience
from exgrpo_cli.replay.methods import Members
from exgrpo_cli.replay.mixing import Group, Response
from exgrpo_cli.replay.rlep import RlepReplay

from conftest import REPLAY_RUN, train_in_process

K, M = 4, 2


def _method(replayed: int = M) -> RlepReplay:
    cfg = ExgrpoConfig()
    cfg.rollout.n, cfg.replay.method, cfg.replay.rlep.replayed = K, "rlep", replayed
    return RlepReplay(cfg)


def _cands(n: int) -> list[Experience]:
    return [Experience(np.array([i + 1], np.int32), np.zeros(1, np.float32), step=i) for i in range(n)]


def test_m_distinct_successes_join_k_fresh() -> None:
    method, rng = _method(), np.random.default_rng(0)
    m = method.members(_cands(5), [], rng, K)
    assert m.fresh == K and len(m.picks) == M and len(set(m.picks)) == M
    assert method.members(_cands(1), [], rng, K) == Members((0,), K)  # fewer stored: all of them
    # drawn at random, not always the same two
    assert len({method.members(_cands(5), [], rng, K).picks for _ in range(20)}) > 1
    assert method.score is None and not method.importance_correction(True)


def test_the_buffer_counts_a_replayed_question_over_its_fresh_responses() -> None:
    fresh = [Response([7, j], [-1.0, -1.0], reward=float(j == 0)) for j in range(K)]
    stored = [Response([9, j], [-1.0, -1.0], reward=1.0, replayed=True) for j in range(M)]
    g = Group(Question("a", "a", "1"), [1], fresh + stored, from_buffer=True)
    (seen,) = _method().observed([g])
    assert seen.num_correct == 1 and seen.responses == fresh  # k = 1 of K, not 3 of K + M
    assert g.num_correct == 1 + M and len(g.responses) == K + M  # the batch keeps all K + M


@pytest.mark.slow
def test_rlep_trains_with_advantages_over_k_plus_m() -> None:
    """The real path: each replayed question's group holds K fresh and M stored rows, its
    advantages are centred over all K + M rewards, and the replayed rows reach the loss weighed
    against pi_old of the step (importance weight 1 on the step's single update)."""
    k = 4  # REPLAY_RUN's rollout.n
    rows, updates = train_in_process([*REPLAY_RUN, "replay.method=rlep", f"replay.rlep.replayed={M}"])
    replaying = [(r, u) for r, u in zip(rows, updates) if r["replay/replayed_questions"] > 0]
    assert replaying, "the scenario must replay"
    mixed_groups = distinct = 0
    for r, u in replaying:
        b = u.batch
        assert not u.plan.importance_correction
        for g in b.group_index.unique().tolist():
            rows_of = (b.group_index == g).nonzero().flatten()
            replayed = int(b.replay_mask[rows_of].sum())
            if replayed == 0:
                assert len(rows_of) == k
                continue
            mixed_groups += 1
            assert len(rows_of) - replayed == k and 1 <= replayed <= M
            rewards = b.rewards[rows_of]
            assert torch.allclose(u.advantages[rows_of], rewards - rewards.mean())  # over K + M
            fresh_mean = rewards[~b.replay_mask[rows_of]].mean()
            distinct += int(not torch.isclose(fresh_mean, rewards.mean()))  # K alone would differ
            assert bool((rewards[b.replay_mask[rows_of]] == 1).all())  # verified successes
        assert u.result.stats.replay_tokens > 0  # the replayed rows reached the loss
        assert math.isclose(r["loss/importance_weight_mean"], 1.0, rel_tol=1e-4)
        assert r["rollout/rows"] == r["rollout/responses"] + int(b.replay_mask.sum())
    assert mixed_groups > 0 and distinct > 0, "a group where K and K + M centre differently"
