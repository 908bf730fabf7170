"""The reward stage shared by every kind: the threshold of "correct", the failure streak, and the
step's grading and metrics (reward/stage.py, step/reward.py)."""

from __future__ import annotations

from typing import Any

import pytest

from exgrpo_cli.data.types import Question
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.replay.mixing import Group, Response
from exgrpo_cli.reward.scorer import ScoreResult
from exgrpo_cli.reward.stage import REWARDS, Reward, RewardFailed
from exgrpo_cli.step.reward import grade_step


class Fixed:
    """A backend returning given rewards (and failure counts) per call; records what it got."""

    def __init__(self, rewards: list[float], errors: int = 0) -> None:
        self.rewards, self.errors, self.calls = rewards, errors, []
        self.first_error = "ValueError: bad row"

    def score(self, responses: Any, answers: Any, kinds: Any = None, **kw: Any) -> ScoreResult:
        self.calls.append((list(responses), kw.get("questions")))
        return ScoreResult(self.rewards[: len(responses)], [None] * len(responses), errors=self.errors)

    def close(self) -> None: ...

    def metrics(self) -> dict[str, int]:
        return {}


def _groups(n: int, k: int) -> list[Group]:
    return [
        Group(Question(f"q{g}", "x", "1"), [1], [Response([1], None) for _ in range(k)]) for g in range(n)
    ]


def test_a_fractional_reward_on_the_threshold_is_correct() -> None:
    # documented: correct when reward >= reward.correct_at
    assert Reward(Fixed([]), correct_at=0.7).is_correct(0.7)
    assert not Reward(Fixed([]), correct_at=0.75).is_correct(0.7)
    # 0/1 rewards: any threshold in (0, 1] is today's "reward > 0.5"
    for at in (1e-9, 0.5, 1.0):
        assert [Reward(Fixed([]), at).is_correct(r) for r in (0.0, 1.0)] == [False, True]


def test_grade_step_marks_correctness_and_logs_mean_and_accuracy() -> None:
    backend = Fixed([1.0, 0.7, 0.2, 0.0, 0.7, 0.7, 0.7, 0.7])
    groups = _groups(2, 4)
    m = grade_step(Reward(backend, correct_at=0.7), DataParallel(), groups, lambda ids: "t")
    assert [r.correct for r in groups[0].responses] == [True, True, False, False]
    assert [g.num_correct for g in groups] == [2, 4]
    assert m["reward/mean"] == pytest.approx((1.9 + 2.8) / 8)
    assert m["reward/accuracy"] == pytest.approx(6 / 8)  # the share >= correct_at: the delayed start's
    assert m["reward/solved_all"] == 0.5 and m["reward/solved_none"] == 0.0
    texts, rows = backend.calls[0]
    assert [q.uid for q in rows] == ["q0"] * 4 + ["q1"] * 4  # each response with its data row


def test_a_reward_failing_on_every_item_stops_the_run_after_n_steps() -> None:
    reward = Reward(
        Fixed([0.0] * 4, errors=4), correct_at=1.0, max_failed_steps=3, name="reward.function=f.py:g"
    )
    grade_step(reward, DataParallel(), _groups(1, 4), lambda ids: "t")
    grade_step(reward, DataParallel(), _groups(1, 4), lambda ids: "t")
    with pytest.raises(
        RewardFailed, match=r"reward.function=f.py:g failed on every response for 3 steps.*bad row"
    ):
        grade_step(reward, DataParallel(), _groups(1, 4), lambda ids: "t")
    # a step with one success breaks the streak
    partly = Reward(Fixed([0.0] * 4, errors=3), correct_at=1.0, max_failed_steps=1)
    grade_step(partly, DataParallel(), _groups(1, 4), lambda ids: "t")


def test_registry_says_which_kinds_need_an_answer() -> None:
    assert {n: k.needs_answer for n, k in REWARDS.items()} == {
        "math": True,
        "choice": True,
        "python": False,
        "model": False,
    }


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ({"kind": "model", "normalise": "sigmoid"}, True),  # in (0, 1): 1.0 is never reached
        ({"kind": "model", "normalise": "sigmoid", "correct_at": 0.5}, False),
        ({"kind": "model", "normalise": "none"}, False),  # raw logits: range unknown
        ({"kind": "math"}, False),  # 0/1: 1.0 is reached
        ({"kind": "choice", "correct_at": 1.5}, True),
        ({"kind": "python", "correct_at": 1e9}, False),  # a function: range unknown
    ],
)
def test_a_threshold_the_kind_cannot_reach_is_named_at_start_up(overrides: dict, said: bool) -> None:
    from exgrpo_cli.config.schema import RewardConfig, RewardModelConfig
    from exgrpo_cli.reward.stage import unreachable_threshold

    cfg = RewardConfig(kind=overrides["kind"], correct_at=overrides.get("correct_at", 1.0))
    cfg.model = RewardModelConfig(normalise=overrides.get("normalise", "none"))
    line = unreachable_threshold(cfg)
    assert (line is not None) == said
    if line is not None:
        assert "\n" not in line and line.startswith(f"reward.correct_at={cfg.correct_at:g} cannot be reached")
        assert line.endswith("(e.g. reward.correct_at=0.5)")  # the fix, inside the range


def test_the_threshold_decides_all_four_places_alike() -> None:
    """Retirement, buckets and solved_all/none (Group.num_correct), what the buffer stores
    (storable), val/pass@n and eval's scores all read the one reward.correct_at."""
    from exgrpo_cli.evaluation.scoring import avg_at_n, mean_pass_at_k
    from exgrpo_cli.evaluation.validate import SampledResult
    from exgrpo_cli.replay.bucketing import storable

    rewards = [0.7, 0.7, 0.2, 0.0]
    for at, k in ((0.7, 2), (0.75, 0)):
        groups = _groups(1, 4)
        grade_step(Reward(Fixed(rewards), correct_at=at), DataParallel(), groups, lambda ids: "t")
        assert groups[0].num_correct == k
        assert len(storable(groups, (-1, 4))) == k
        res = SampledResult([groups[0].question], [["t"] * 4], [rewards], correct_at=at)
        assert res.pass_at_n == (1.0 if k else 0.0)
        assert avg_at_n([rewards], correct_at=at) == k / 4
        assert mean_pass_at_k([rewards], 2, correct_at=at) == (5 / 6 if k else 0.0)
