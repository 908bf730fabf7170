"""Held-out scores per data source, and the validation score `trainer.best_metric` names.

Place: after each validation of `exgrpo train` (run/training.py `validate`), on the graded samples of
evaluation/validate.py; `checkpoints/best` keeps the step where the named score peaked. The
official trainer scores each `data_source` of valid.parquet apart (`val/test_score/<source>`) and
keeps as best the step with the highest unweighted mean of those scores, Minerva left out
(`avg_score_stable` in mix_trainer_experience.py): a benchmark with many rows (AIME's 30 x 8
repeats) weighs as much as one with few. `val/accuracy` instead pools every sample, so "best" by it
can be another step. Pure maths here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from exgrpo_cli.config.checks import BEST_METRICS
from exgrpo_cli.data.types import Question
from exgrpo_cli.errors import UsageError

UNKNOWN = "unknown"  # the official name for a row without a data_source
# every sample pooled; the mean over sources; the official criterion: the mean over sources, every
# source naming Minerva left out
POOLED, SOURCE_MEAN, SOURCE_MEAN_NO_MINERVA = BEST_METRICS


def source_of(q: Question) -> str | None:
    source = q.meta.get("data_source")
    return None if source is None else str(source)


def source_scores(questions: Sequence[Question], correct: Sequence[Sequence[float]]) -> dict[str, float]:
    """`val/accuracy/<source>` (the mean reward of the source's samples) for each source, and the
    two unweighted means over sources; {} when no question names a source (nothing to split)."""
    if all(source_of(q) is None for q in questions):
        return {}
    by_source: dict[str, list[float]] = {}
    for q, row in zip(questions, correct):
        by_source.setdefault(source_of(q) or UNKNOWN, []).extend(row)
    per = {s: float(np.mean(v)) for s, v in by_source.items() if v}
    out = {f"{POOLED}/{s}": v for s, v in per.items()}
    out[SOURCE_MEAN] = float(np.mean(list(per.values())))
    stable = [v for s, v in per.items() if "minerva" not in s.lower()]
    if stable:
        out[SOURCE_MEAN_NO_MINERVA] = float(np.mean(stable))
    return out


def check_best_metric(best_metric: str, keep_best: bool, val_questions: Sequence[Question]) -> None:
    """Refuse, before any model loads, a best criterion the held-out set cannot give: the source
    means need held-out rows with a `data_source` (the official valid.parquet has one per row), and
    the Minerva-free mean a source other than Minerva."""
    if not keep_best or best_metric == POOLED or not val_questions:
        return
    sources = {source_of(q) for q in val_questions} - {None}
    if not sources:
        raise UsageError(
            f"trainer.best_metric={best_metric} needs held-out rows with a data_source, and this "
            "held-out set names none: use trainer.best_metric=val/accuracy or a val file with data_source"
        )
    if best_metric == SOURCE_MEAN_NO_MINERVA and all("minerva" in str(s).lower() for s in sources):
        raise UsageError(f"trainer.best_metric={best_metric}: every held-out source is Minerva")
