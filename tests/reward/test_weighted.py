"""Several reward kinds at once (`reward.components`, reward/weighted.py): the weighted sum trains,
the threshold of "correct" reads the sum, and each kind is logged as `reward/component/<name>`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig, RewardConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.replay.mixing import Group, Response
from exgrpo_cli.reward.scorer import ScoreResult
from exgrpo_cli.reward.stage import Reward, describe, needs_answer, unreachable_threshold
from exgrpo_cli.reward.weighted import WeightedReward
from exgrpo_cli.step.reward import grade_step

from conftest import SMALL_RUN, metrics, train_ok


class Fixed:
    """A backend giving set rewards (and failure counts) per call."""

    def __init__(self, rewards: list[float], errors: int = 0, first_error: str = "") -> None:
        self.rewards, self.errors, self.first_error = rewards, errors, first_error

    def score(self, responses: Any, answers: Any, kinds: Any = None, **kw: Any) -> ScoreResult:
        n = len(responses)
        return ScoreResult(self.rewards[:n], [None] * n, errors=self.errors)

    def close(self) -> None: ...

    def metrics(self) -> dict[str, int]:
        return {"reward/errors": self.errors}


def test_the_weighted_sum_trains_the_threshold_reads_it_and_each_component_is_logged() -> None:
    math_r = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    model_r = [0.4, 1.0, 0.0, 0.2, 0.6, 0.6, 0.8, 0.8]
    backend = WeightedReward(
        {"math": Fixed(math_r), "model": Fixed(model_r, errors=1, first_error="boom")},
        {"math": 1.0, "model": 0.5},
    )
    groups = [
        Group(Question(f"q{g}", "x", "1"), [1], [Response([1], None) for _ in range(4)]) for g in range(2)
    ]
    groups[1].responses[3].replayed = True  # a replayed response: not in the fresh means
    m = grade_step(Reward(backend, correct_at=1.0), DataParallel(), groups, lambda ids: "t")
    want = [a + 0.5 * b for a, b in zip(math_r, model_r)]
    got = [r.reward for g in groups for r in g.responses]
    assert got == pytest.approx(want)
    # correct is the sum >= 1: 1 + 0.2 yes, 0 + 0.5 no (the model alone never makes a response correct)
    assert [r.correct for g in groups for r in g.responses] == [w >= 1.0 for w in want]
    fresh = range(7)
    assert m["reward/component/math"] == pytest.approx(sum(math_r[i] for i in fresh) / 7)
    assert m["reward/component/model"] == pytest.approx(sum(model_r[i] for i in fresh) / 7)
    assert m["reward/mean"] == pytest.approx(m["reward/component/math"] + 0.5 * m["reward/component/model"])
    assert m["reward/errors"] == 1 and backend.first_error == "model: boom"
    assert backend.metrics() == {"reward/errors": 1}


def test_a_single_kind_logs_no_components() -> None:
    groups = [Group(Question("q", "x", "1"), [1], [Response([1], None) for _ in range(2)])]
    m = grade_step(Reward(Fixed([1.0, 0.0]), 1.0), DataParallel(), groups, lambda ids: "t")
    assert not any(k.startswith("reward/component/") for k in m)


def test_components_config_names_ranges_and_refusals() -> None:
    from exgrpo_cli.commands.variants import check_variants
    from exgrpo_cli.config.checks import validate

    cfg = RewardConfig(components={"math": 1.0, "choice": 0.5})
    assert describe(cfg) == "reward.components={math: 1, choice: 0.5}" and needs_answer(cfg)
    assert unreachable_threshold(cfg) is None  # the sum reaches 1.5
    cfg.correct_at = 1.6
    assert unreachable_threshold(cfg).startswith("reward.correct_at=1.6 cannot be reached")  # type: ignore[union-attr]
    assert not needs_answer(RewardConfig(kind="math", components={"python": 1.0}))  # components win
    # a sigmoid never reaches 0 either: -1 x it stays below 0, so correct_at=0 is never met
    penalty = RewardConfig(components={"model": -1.0}, correct_at=0.0)
    penalty.model.normalise = "sigmoid"
    assert unreachable_threshold(penalty).startswith("reward.correct_at=0 cannot be reached")  # type: ignore[union-attr]
    penalty.correct_at = -0.5
    assert unreachable_threshold(penalty) is None
    for bad in ({"math": 0.0}, {"math": math.nan}):
        run = ExgrpoConfig()
        run.reward.components = bad
        with pytest.raises(ConfigError, match="reward.components"):
            validate(run)
    run = ExgrpoConfig()
    run.reward.components = {"math": 1.0, "nope": 1.0}
    with pytest.raises(ConfigError, match="reward.components"):
        check_variants(run, "train")


@pytest.mark.slow
def test_a_run_trains_on_two_kinds_and_logs_each(tiny_model: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train_ok(
        run, *SMALL_RUN, "trainer.steps=2", "+reward.components.math=1.0", "+reward.components.python=0.5",
        "reward.function=docs/examples/closeness.py:closeness",
    )  # fmt: skip
    steps = [r for r in metrics(run) if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        both = r["reward/component/math"] + 0.5 * r["reward/component/python"]
        assert r["reward/mean"] == pytest.approx(both, abs=1e-9)
        assert 0.0 <= r["reward/component/python"] <= 1.0
