"""Per-source held-out scores and the official best-checkpoint criterion (evaluation/val_scores.py,
docs/algorithm.md §8): the mean over sources, Minerva left out, not every sample pooled."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from evaluation.test_validate import CharTokenizer

from exgrpo_cli.data.types import Question
from exgrpo_cli.errors import UsageError
from exgrpo_cli.evaluation.val_scores import check_best_metric, source_scores


def _q(i: int, source: str | None) -> Question:
    return Question(f"q{i}", "x", "1", meta={} if source is None else {"data_source": source})


def _val_set() -> tuple[list[Question], list[list[float]]]:
    # aime: 8 rows (the official x8 repeats), all wrong; math: 2 rows, right; minerva: 2 rows, right
    qs = [_q(i, "aime") for i in range(8)] + [
        _q(8, "math"),
        _q(9, "math"),
        _q(10, "minerva"),
        _q(11, "minerva"),
    ]
    correct = [[0.0]] * 8 + [[1.0]] * 4
    return qs, correct


def test_sources_weigh_alike_and_minerva_is_left_out_of_the_official_mean() -> None:
    qs, correct = _val_set()
    out = source_scores(qs, correct)
    assert out["val/accuracy/aime"] == 0.0 and out["val/accuracy/math"] == 1.0
    assert out["val/accuracy/minerva"] == 1.0
    assert out["val/source_mean"] == pytest.approx(2 / 3)  # pooled would be 4 / 12
    assert out["val/source_mean_no_minerva"] == pytest.approx(0.5)  # (aime + math) / 2


def test_no_source_no_split() -> None:
    assert source_scores([_q(0, None), _q(1, None)], [[1.0], [0.0]]) == {}


def test_rows_without_a_source_count_as_the_official_unknown() -> None:
    out = source_scores([_q(0, "aime"), _q(1, None)], [[1.0, 0.0], [0.0, 0.0]])
    assert out["val/accuracy/aime"] == 0.5 and out["val/accuracy/unknown"] == 0.0


def test_the_training_validation_logs_the_per_source_scores() -> None:
    """run/training.py `validate`: what every validation of `exgrpo train` logs (and what
    checkpoints/best compares under trainer.best_metric)."""
    from exgrpo_cli.data.templates import TEMPLATES
    from exgrpo_cli.parallel.sharding import DataParallel
    from exgrpo_cli.reward.scorer import ScoreResult
    from exgrpo_cli.rollout.base import Rollout
    from exgrpo_cli.run.training import validate

    class Engine:
        def generate(self, prompts: Any, n: list[int], spec: Any) -> list[Rollout]:
            return [Rollout(i, [ord("1")], None, True) for i, k in enumerate(n) for _ in range(k)]

        def release(self, keep_weights: bool = False) -> None:
            pass

    class Scorer:  # "aime" questions wrong, the others right
        def score(
            self, responses: Any, answers: Any, kinds: Any = None, *, rules: Any = None, questions: Any = None
        ) -> ScoreResult:
            return ScoreResult([float(a == "1") for a in answers], [None] * len(responses))

    qs = [Question(f"a{i}", "x", "0", meta={"data_source": "aime"}) for i in range(8)]
    qs += [Question(f"m{i}", "x", "1", meta={"data_source": s}) for i, s in enumerate(["math", "minerva"])]
    cfg = SimpleNamespace(
        trainer=SimpleNamespace(val_temperature=0.6, seed=0, val_samples=1),
        rollout=SimpleNamespace(temperature=1.0, top_p=1.0, validation_sleep_level=2),
        model=SimpleNamespace(max_response_tokens=4),
    )
    trainer = SimpleNamespace(
        cfg=cfg,
        engine=Engine(),
        tokenizer=CharTokenizer(),
        template=TEMPLATES["plain"],
        scorer=Scorer(),
        parallel=DataParallel(),
    )
    out = validate(trainer, qs)  # type: ignore[arg-type]
    assert out["val/accuracy"] == pytest.approx(0.2)  # 2 of 10 rows
    assert out["val/accuracy/aime"] == 0.0 and out["val/accuracy/minerva"] == 1.0
    assert out["val/source_mean_no_minerva"] == pytest.approx(0.5)


def test_a_criterion_the_held_out_set_cannot_give_is_refused() -> None:
    no_source = [_q(0, None)]
    check_best_metric("val/accuracy", True, no_source)  # pooled: always there
    check_best_metric("val/source_mean", False, no_source)  # no best kept: nothing to refuse
    with pytest.raises(UsageError, match="data_source"):
        check_best_metric("val/source_mean_no_minerva", True, no_source)
    with pytest.raises(UsageError, match="Minerva"):
        check_best_metric("val/source_mean_no_minerva", True, [_q(0, "minerva")])
    check_best_metric("val/source_mean_no_minerva", True, _val_set()[0])
