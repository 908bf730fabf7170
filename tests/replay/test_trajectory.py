"""Trajectory selection rules (docs/algorithm.md §3): exact picks from candidates and scores."""

import numpy as np
import pytest

from exgrpo_cli.replay import TRAJECTORY_SELECTION, Experience


def choose_trajectory(
    cands: list[Experience], scores: list[float], rule: str, rng: np.random.Generator
) -> int:
    return TRAJECTORY_SELECTION[rule].pick(cands, scores, rng)


def _candidates(*lengths: int) -> list[Experience]:
    return [
        Experience(np.arange(n, dtype=np.int32), np.full(n, -1.0, dtype=np.float32), step=1) for n in lengths
    ]


def test_scored_rules_pick_by_score():
    rng = np.random.default_rng(0)
    cands = _candidates(3, 4, 5, 6, 7)
    scores = [0.7, 0.2, 0.9, 0.2, 0.9]
    assert choose_trajectory(cands, scores, "lowest_entropy", rng) == 1  # ties: the oldest
    assert choose_trajectory(cands, scores, "lowest_nll", rng) == 1
    assert choose_trajectory(cands, scores, "highest_entropy", rng) == 2
    two = _candidates(3, 4)
    assert choose_trajectory(two, [float("nan"), 0.5], "lowest_entropy", rng) == 1  # NaN never wins
    assert choose_trajectory(two, [0.1, float("nan")], "highest_entropy", rng) == 0


def test_random_rule_draws_every_candidate_reproducibly():
    rng = np.random.default_rng(0)
    cands = _candidates(3, 4, 5, 6, 7)
    picks = [choose_trajectory(cands, [], "random", rng) for _ in range(500)]
    assert set(picks) == set(range(5))
    # the draws come from the generator alone: another seed, other picks; the seed's own picks
    # again from a fresh generator (as a resumed step's rng), and from a copy of its state
    seeded = [choose_trajectory(cands, [], "random", rng) for rng in [np.random.default_rng(3)] * 20]
    other = [choose_trajectory(cands, [], "random", rng) for rng in [np.random.default_rng(4)] * 20]
    assert seeded != other
    fresh = np.random.default_rng(3)
    assert [choose_trajectory(cands, [], "random", fresh) for _ in range(20)] == seeded
    copy = np.random.default_rng(0)
    copy.bit_generator.state = np.random.default_rng(3).bit_generator.state
    assert [choose_trajectory(cands, [], "random", copy) for _ in range(20)] == seeded


@pytest.mark.parametrize("name", list(TRAJECTORY_SELECTION))
def test_each_rule_draws_and_needs_scores_exactly_as_it_declares(name: str):
    """What others rely on: `draws` (inspect-buffer cannot say which response a drawing rule
    replays) and `score` (the trainer runs the scoring forward only for a rule that has one, and
    such a rule refuses to pick without one score per candidate)."""
    rule = TRAJECTORY_SELECTION[name]
    cands = _candidates(5, 3, 4, 6)
    scores = [0.4, 0.1, 0.3, 0.2] if rule.score is not None else []
    picks = {rule.pick(cands, scores, np.random.default_rng(seed)) for seed in range(30)}
    assert (len(picks) > 1) == rule.draws
    if rule.score is not None:
        with pytest.raises(ValueError, match="one score per candidate"):
            rule.pick(cands, [], np.random.default_rng(0))


def test_bad_input_is_refused():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        choose_trajectory([], [], "lowest_entropy", rng)
    with pytest.raises(ValueError, match="one score per candidate"):
        choose_trajectory(_candidates(3, 4), [0.1], "lowest_entropy", rng)


def test_shortest_rule_picks_the_fewest_tokens_without_scores():
    rule = TRAJECTORY_SELECTION["shortest"]
    assert rule.score is None and not rule.draws  # no forward pass; inspect-buffer can mark it
    rng = np.random.default_rng(0)
    assert choose_trajectory(_candidates(9, 4, 7, 4), [], "shortest", rng) == 1  # ties: the oldest
    assert choose_trajectory(_candidates(5), [], "shortest", rng) == 0
