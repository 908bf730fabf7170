"""Experience selection: which buffered questions and which stored trajectory to replay.

Place in the train step: first thing of a mixed step. ``n_replay`` sizes the replayed part of the
batch, and the rule that ``replay.question_selection`` names in ``QUESTION_SELECTION`` (built once,
with the settings its entry reads, when the trainer is built) picks that many buffered questions
(docs/algorithm.md §3);
replay/trajectory.py then picks the stored response to replay. Everything here is a pure function
of its inputs and an explicit ``np.random.Generator``, so a seeded run selects the same questions
after a resume.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np


class BucketedQuestions(Protocol):
    """The part of ``ExperienceBuffer`` that question selection reads."""

    def bucket_centres(self) -> list[float]: ...

    def bucket_sizes(self) -> list[int]: ...

    def questions_in_bucket(self, b: int) -> list[str]: ...

    def question_at(self, b: int, i: int) -> str: ...


def n_replay(ratio: float, batch_questions: int, valid_buffered: int) -> int:
    """n_replay = min(floor(rho * B), valid buffered questions)."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"replay.ratio must be in [0, 1] (got {ratio})")
    if batch_questions < 0 or valid_buffered < 0:
        raise ValueError(f"counts must be >= 0 (got B={batch_questions}, valid={valid_buffered})")
    # The 1e-9 absorbs float error: 0.29 * 100 = 28.999999999999996 must floor to 29.
    return min(math.floor(ratio * batch_questions + 1e-9), valid_buffered)


def gaussian_weights(bucket_centres: Sequence[float], mu: float, sigma: float) -> list[float]:
    """phi((c - mu) / sigma) per centre: the standard normal density of each centre's z-score.

    With sigma = 1/K this is the official code's pdf on the success-count scale
    (mu = K/2, sigma = 1). Unnormalised; ``bucket_probabilities`` normalises it.
    """
    if not sigma > 0:
        raise ValueError(f"replay.sigma must be > 0 (got {sigma})")
    z = (np.asarray(bucket_centres, dtype=np.float64) - mu) / sigma
    return [float(v) for v in np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)]


def bucket_probabilities(
    bucket_centres: Sequence[float], nonempty: Sequence[bool], mu: float, sigma: float
) -> list[float]:
    """Bucket sampling probabilities: Normal pdf(centre; mu, sigma), zero for empty buckets,
    normalised over the non-empty ones (all zeros when every bucket is empty).

    The pdf's constant 1/(sigma sqrt(2 pi)) cancels in the normalisation, so the result is
    the same on the accuracy scale (sigma = 1/8) and on the count scale (sigma = 1). The
    figures quoted for the official code with K = 8, mu = 0.5, sigma = 0.125,
    .0044 .0540 .2420 .3989 .2420 .0540 .0044, are the unnormalised pdf values
    (``gaussian_weights``). They sum to 0.99973, not 1, because the seven points miss the
    tails beyond +-3.5 sd, so normalising rescales them by 1/0.99973: to 4 decimals the
    result is .0044 .0540 .2420 .3991 .2420 .0540 .0044. Only the centre bucket moves, and
    only in the 4th decimal. To 3 decimals (.004 .054 .242 .399) both agree
    (docs/algorithm.md §9). Normalising is what makes these probabilities; values that sum to
    0.99973 are not a distribution.

    Computed in log space, so a narrow sigma cannot underflow every non-empty bucket to 0.
    """
    if len(bucket_centres) != len(nonempty):
        raise ValueError(f"{len(bucket_centres)} centres but {len(nonempty)} non-empty flags")
    if not sigma > 0:
        raise ValueError(f"replay.sigma must be > 0 (got {sigma})")
    mask = np.asarray(nonempty, dtype=bool)
    if not mask.any():
        return [0.0] * len(mask)
    z = (np.asarray(bucket_centres, dtype=np.float64) - mu) / sigma
    logw = np.where(mask, -0.5 * z * z, -np.inf)
    w = np.exp(logw - logw[mask].max())
    return [float(v) for v in w / w.sum()]


def sample_bucket_counts(
    n: int, probs: Sequence[float], capacities: Sequence[int], rng: np.random.Generator
) -> list[int]:
    """Draw how many questions each bucket gives: multinomial(n, probs), capped by capacity.

    A bucket asked for more than it holds gives its excess to the buckets that still have
    room, in proportion to their weights (by another multinomial draw), repeated until all
    are placed. If only zero-weight buckets have room left, the rest is spread over them
    in proportion to their room, i.e. uniformly over their questions, so that the total is
    always min(n, sum(capacities)). Each round places at least one question, so the loop ends.
    """
    p = np.asarray(probs, dtype=np.float64)
    cap = np.asarray(capacities, dtype=np.int64)
    if p.shape != cap.shape or p.ndim != 1:
        raise ValueError(f"probs and capacities must be 1-D of equal length ({p.shape} vs {cap.shape})")
    if n < 0 or (cap < 0).any() or not np.isfinite(p).all() or (p < 0).any():
        raise ValueError("n and capacities must be >= 0 and probs finite and >= 0")
    counts = np.zeros(len(cap), dtype=np.int64)
    left = int(min(n, int(cap.sum())))
    while left > 0:
        room = cap - counts
        w = np.where(room > 0, p, 0.0)
        if w.sum() <= 0:
            w = room.clip(min=0).astype(np.float64)
        placed = np.minimum(rng.multinomial(left, w / w.sum()), room)
        counts += placed
        left -= int(placed.sum())
    return counts.tolist()


def gaussian_selection(
    buffer: BucketedQuestions, n: int, *, mu: float, sigma: float, rng: np.random.Generator
) -> list[str]:
    """Bucket counts from ``sample_bucket_counts`` with ``bucket_probabilities``, then uniform
    without replacement inside each bucket; the result is grouped by bucket (ExGRPO's rule)."""
    sizes = buffer.bucket_sizes()
    n = min(int(n), sum(sizes))
    if n <= 0:
        return []
    probs = bucket_probabilities(buffer.bucket_centres(), [s > 0 for s in sizes], mu, sigma)
    out: list[str] = []
    # members are fetched by position (`question_at`), never by copying a bucket: with a million
    # buffered experiences a copy of the buckets cost more than all the rest of the selection
    for b, c in enumerate(sample_bucket_counts(n, probs, sizes, rng)):
        if c:
            out.extend(buffer.question_at(b, i) for i in rng.choice(sizes[b], size=c, replace=False).tolist())
    return out


def uniform_selection(buffer: BucketedQuestions, n: int, *, rng: np.random.Generator) -> list[str]:
    """Uniform without replacement over all buffered questions (the "w/o question selection"
    ablation)."""
    sizes = buffer.bucket_sizes()
    n = min(int(n), sum(sizes))
    if n <= 0:
        return []
    # position i of the buckets laid end to end: bucket b holds [starts[b], starts[b+1])
    starts = np.concatenate([[0], np.cumsum(sizes)])
    picks = rng.choice(int(starts[-1]), size=n, replace=False)
    owners = np.searchsorted(starts, picks, side="right") - 1
    return [buffer.question_at(int(b), int(i - starts[b])) for b, i in zip(owners, picks)]


class QuestionSelector(Protocol):
    """Pick min(n, buffered) distinct buffered questions to replay. Retired questions are never
    returned because ``end_step`` takes them out of the buckets: call it at the start of a step,
    not between observe and end_step."""

    def __call__(self, buffer: BucketedQuestions, n: int, *, rng: np.random.Generator) -> list[str]: ...


# `replay.question_selection`: name -> the rule, with the settings it reads from the run's config
# (a config.ExgrpoConfig, duck-typed: replay/ imports only algo/) bound. A new rule (knobs of its
# own included) is a function above and one entry here.
QUESTION_SELECTION: dict[str, Callable[[Any], QuestionSelector]] = {
    "gaussian": lambda cfg: partial(gaussian_selection, mu=cfg.replay.gaussian_mu(), sigma=cfg.replay.sigma),
    "uniform": lambda cfg: uniform_selection,
}
