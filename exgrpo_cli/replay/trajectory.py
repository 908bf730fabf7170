"""Trajectory selection (docs/algorithm.md §3): which stored response of a selected question is
replayed.

Place in the train step: right after question selection (replay/selection.py). Each rule of
``TRAJECTORY_SELECTION`` (the `replay.trajectory_selection` names) declares what the current
policy must compute for every stored candidate first (``score``: an algo.logprobs.CandidateScore,
the mean token entropy or the mean negative log-likelihood, or nothing), and then picks one
candidate from the candidates and those scores. The trainer runs the scoring forward only for
rules that ask for it. A new rule is one function and one entry here.

Pure functions of their inputs and an explicit ``np.random.Generator`` (drawn from only by rules
that draw), so a seeded run replays the same responses after a resume.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from exgrpo_cli.algo.logprobs import ENTROPY, NLL, CandidateScore
from exgrpo_cli.replay.experience import Experience

Chooser = Callable[[Sequence[Experience], np.ndarray, np.random.Generator], int]


@dataclass(frozen=True)
class TrajectoryRule:
    score: CandidateScore | None  # what the current policy computes per candidate; None: no forward
    choose: Chooser  # (candidates, scores (empty when score is None), rng) -> index
    draws: bool = False  # the choice is random (inspect-buffer cannot say which one it replays)

    def pick(
        self, candidates: Sequence[Experience], scores: Sequence[float], rng: np.random.Generator
    ) -> int:
        """Index of the experience to replay among one question's candidates; `scores` are the
        rule's scores of the candidates under the current policy, one per candidate (empty for a
        rule without a score)."""
        if not candidates:
            raise ValueError("need at least one stored candidate")
        s = np.asarray(scores, dtype=np.float64)
        if self.score is not None and (s.ndim != 1 or s.size != len(candidates)):
            raise ValueError(
                f"a {self.score.name} rule needs one score per candidate ({len(candidates)}, got {s.shape})"
            )
        return self.choose(candidates, s, rng)


def _lowest(candidates: Sequence[Experience], scores: np.ndarray, rng: np.random.Generator) -> int:
    # ties go to the lowest index (the oldest experience); a NaN score never wins
    return int(np.argmin(np.where(np.isnan(scores), np.inf, scores)))


def _highest(candidates: Sequence[Experience], scores: np.ndarray, rng: np.random.Generator) -> int:
    return int(np.argmax(np.where(np.isnan(scores), -np.inf, scores)))


def _random(candidates: Sequence[Experience], scores: np.ndarray, rng: np.random.Generator) -> int:
    return int(rng.integers(len(candidates)))


def _shortest(candidates: Sequence[Experience], scores: np.ndarray, rng: np.random.Generator) -> int:
    # the fewest response tokens; ties go to the oldest
    return int(np.argmin([c.response_ids.size for c in candidates]))


# `replay.trajectory_selection`: name -> rule
TRAJECTORY_SELECTION: dict[str, TrajectoryRule] = {
    "lowest_entropy": TrajectoryRule(ENTROPY, _lowest),  # ExGRPO's rule
    "highest_entropy": TrajectoryRule(ENTROPY, _highest),  # the paper's contrast ablation
    "lowest_nll": TrajectoryRule(NLL, _lowest),  # Alg. 1 of the paper read literally
    "random": TrajectoryRule(None, _random, draws=True),  # the "w/o trajectory selection" ablation
    "shortest": TrajectoryRule(None, _shortest),  # the stored response with the fewest tokens
}
