"""replay.bucket_by: the count rule and the reward-std rule (replay/bucketing.py), and the buffer
that files questions by them, saves its rule and refuses another on load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.bucketing import count_levels, reward_std_levels
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.mixing import Group, Response


def _group(uid: str, rewards: list[float], correct_at: float = 1.0) -> Group:
    rs = [Response([7, i], [-0.1, -0.2], reward=r, correct=r >= correct_at) for i, r in enumerate(rewards)]
    return Group(Question(uid, "x", "1"), [1], rs)


def test_reward_std_levels_are_min_max_normalised_over_the_step() -> None:
    groups = [
        _group("flat", [0.5, 0.5, 0.5, 0.5]),  # std 0: the step's lowest
        _group("wide", [0.0, 1.0, 0.0, 1.0]),  # std 0.5: the step's highest
        _group("mid", [0.0, 0.5, 0.0, 0.5]),  # std 0.25: half way
    ]
    assert reward_std_levels(groups, 4) == [0, 4, 2]
    assert reward_std_levels(groups[:1], 4) == [0]  # no spread: all level 0
    assert count_levels(groups, 4) == [0, 2, 0]  # k: rewards >= correct_at (1.0)
    # 0/1 rewards: the std is the same for p and 1 - p, and peaks at p = 1/2
    sym = [
        _group("p1", [1, 0, 0, 0]),
        _group("p3", [1, 1, 1, 0]),
        _group("p2", [1, 1, 0, 0]),
        _group("p0", [0] * 4),
    ]
    levels = reward_std_levels(sym, 4)
    assert levels[0] == levels[1] and levels[2] == 4 and levels[3] == 0


def test_buffer_under_reward_std_stores_correct_responses_in_the_std_bucket(tmp_path: Path) -> None:
    buf = ExperienceBuffer(4, bucket_by="reward_std")
    assert buf.num_buckets == 3 and buf.bucket_centres() == pytest.approx([0.125, 0.5, 0.875])
    groups = [
        _group("a", [1.0, 0.9, 0.9, 0.9]),  # one correct, small std
        _group("b", [1.0, 0.0, 1.0, 0.0]),  # two correct, the largest std
        _group("c", [0.3, 0.3, 0.3, 0.3]),  # none correct: nothing to store
    ]
    buf.observe_groups(groups, step=1, bounds=(0, 3), logprobs=None)
    assert buf.num_questions == 2 and buf.num_experiences == 3
    assert buf.questions_in_bucket(0) == ["a"] and buf.questions_in_bucket(2) == ["b"]
    count = ExperienceBuffer(4)  # the same step under the count rule: by k
    count.observe_groups(groups, step=1, bounds=(0, 3), logprobs=None)
    assert count.questions_in_bucket(0) == ["a"] and count.questions_in_bucket(1) == ["b"]

    buf.save(str(tmp_path / "replay"))
    again = ExperienceBuffer.load(str(tmp_path / "replay"))
    assert again.bucket_by == "reward_std" and again.digest() == buf.digest()
    with pytest.raises(ValueError, match="bucketed by reward_std, this run uses replay.bucket_by=count"):
        ExperienceBuffer(4).load_state_dict(buf.state_dict())
    state = count.state_dict()
    del state["index"]["bucket_by"]  # a buffer saved before the rule existed: count
    ExperienceBuffer(4).load_state_dict(state)
    with pytest.raises(ValueError):
        ExperienceBuffer(4, bucket_by="nope")
    assert np.array_equal(again.experiences("b")[0].response_ids, [7, 0])


def _bucket_weights(buf: ExperienceBuffer, mu: float, sigma: float) -> dict[str, float]:
    """Each buffered question's bucket weight: the Gaussian at its bucket's centre, what question
    selection draws buckets by (before the normalisation, which keeps the order)."""
    from exgrpo_cli.replay.selection import gaussian_weights

    weights = gaussian_weights(buf.bucket_centres(), mu, sigma)
    return {uid: weights[b] for b in range(buf.num_buckets) for uid in buf.questions_in_bucket(b)}


def test_default_mu_under_reward_std_ranks_0_1_questions_as_count_does() -> None:
    """0/1 rewards, K = 8, one step with every success count 0..8: under the default replay.mu the
    reward_std buckets prefer the questions the count buckets prefer (medium accuracy first) and
    never the reverse. With mu = 0.5 on the std scale (the default before issue 48) the order is
    inverted: the 1-of-8 and 7-of-8 questions (std level 5) outweigh the 4-of-8 ones (level 8)."""
    from exgrpo_cli.config.schema import ExgrpoConfig

    K = 8
    groups = [_group(f"k{k}", [1.0] * k + [0.0] * (K - k)) for k in range(K + 1)]
    by_count, by_std = ExperienceBuffer(K), ExperienceBuffer(K, bucket_by="reward_std")
    for buf in (by_count, by_std):
        buf.observe_groups(groups, step=1, bounds=(0, K - 1), logprobs=None)
    cfg = ExgrpoConfig()
    count_w = _bucket_weights(by_count, cfg.replay.gaussian_mu(), cfg.replay.sigma)
    cfg.replay.bucket_by = "reward_std"
    std_w = _bucket_weights(by_std, cfg.replay.gaussian_mu(), cfg.replay.sigma)
    assert sorted(count_w) == sorted(std_w) == [f"k{k}" for k in range(1, K)]

    def inversions(w: dict[str, float]) -> list[tuple[str, str]]:
        return [(a, b) for a in count_w for b in count_w if count_w[a] > count_w[b] and w[a] < w[b]]

    assert inversions(std_w) == []
    assert std_w["k4"] > std_w["k1"] and std_w["k3"] > std_w["k7"]  # it ranks, not only ties
    old = _bucket_weights(by_std, 0.5, cfg.replay.sigma)  # mu 0.5 read on the std scale
    assert old["k1"] > 10 * old["k4"] and len(inversions(old)) > 0
    cfg.replay.mu = 0.5  # an explicit mu is taken as given under either rule
    assert cfg.replay.gaussian_mu() == 0.5
