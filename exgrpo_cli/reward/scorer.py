"""Scoring a batch of responses: extraction, cheap pre-checks, then math-verify in the pool.

The reward stage of the train step: after rollouts are generated, `RewardScorer.score` turns each
response into a 0/1 reward, which then feeds the replay buffer update and the advantages.

Per item, in order:
1. extraction under the item's `AnswerRule` (default: the training rule of `requires_think`,
   i.e. `extract_answer`: think tags, last box, fallback); no answer scores 0.
2. An extracted answer longer than `max_answer_chars` (1000) scores 0 without parsing: real final
   answers are short, and this bounds what reaches the parser.
3. kind "choice": the letter A-J in the extracted answer against the gold letter, in this process.
   A gold answer that holds no letter scores 0 and counts as an error.
4. kind "math": an empty gold answer scores 0 and counts as an error; an answer that is empty
   after `normalise` (whitespace, `$`/box wrappers) scores 0; equal keys score 1 at once; two
   plain integers are compared as integers at once (math-verify would parse both to the same
   sympy Integers; wrong integer answers are most of an arithmetic or AIME-style batch, and each
   cost a worker round trip and a ~2 ms parse); anything else goes to a worker, which parses
   `$gold$` and `$pred$` with math-verify and checks equivalence under the hard per-item timeout
   (`pool.py`).

Only extracted strings, never the full responses, cross the process boundary.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from exgrpo_cli.reward.extract import AnswerRule, choice_letter, normalise, prepare_math, training_rule
from exgrpo_cli.reward.pool import VerifyPool

log = logging.getLogger(__name__)

KINDS = ("math", "choice")
_INTEGER = re.compile(r"[+-]?[0-9]+")  # a whole key, after normalise: no spaces, no wrappers
MAX_ANSWER_CHARS = 1000


@dataclass
class ScoreResult:
    """Outcome of one `RewardScorer.score` call; counts are for this call only."""

    rewards: list[float]  # 1.0 correct, 0.0 otherwise
    extracted: list[str | None]  # the answer each response was judged on (None: no answer)
    timeouts: int = 0  # items whose verification ran out of time (scored 0)
    errors: int = 0  # items whose worker crashed, or with an unusable gold answer (scored 0)
    unscored: int = 0  # items a reward function returned None for (scored 0)
    # reward.components: each kind's own rewards by name (`rewards` is their weighted sum); else None
    components: dict[str, list[float]] | None = None


class Backend(Protocol):
    """What scores responses (`RewardScorer`, a kind's backend, the run's `Reward`): a `ScoreResult`
    per call. `rules` is None unless the caller gives `rule_for_prompt` to validation (then: the
    scorer's own rule); `questions` are the samples' data rows (a reward function reads them)."""

    def score(
        self,
        responses: Sequence[str],
        answers: Sequence[str],
        kinds: Any = None,
        *,
        rules: Any = None,
        questions: Any = None,
    ) -> ScoreResult: ...

    def close(self) -> None: ...

    def metrics(self) -> dict[str, int]: ...


class RewardScorer:
    """Scores responses against gold answers; owns a pool of `workers` verification processes.

    Use as a context manager or call `close()`; the processes are also stopped when the scorer is
    garbage-collected and at interpreter exit. Safe to call from any thread (calls serialise).
    `metrics()` gives CUMULATIVE counts since construction; per-call counts are on `ScoreResult`.
    """

    def __init__(
        self,
        requires_think: bool = False,
        workers: int = 1,
        timeout_s: float = 5.0,
        *,
        max_answer_chars: int = MAX_ANSWER_CHARS,
        memory_limit_mb: int | None = 2048,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"reward timeout_s must be > 0, got {timeout_s}")
        self.requires_think = requires_think
        self.timeout_s = float(timeout_s)
        self.max_answer_chars = max_answer_chars
        self._pool = VerifyPool(workers=workers, memory_limit_mb=memory_limit_mb)
        self._totals = {"reward/timeouts": 0, "reward/errors": 0}
        self._totals_lock = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def worker_pids(self) -> list[int | None]:
        """Process ids of the verification workers (tests, diagnostics)."""
        return self._pool.pids()

    def metrics(self) -> dict[str, int]:
        """Cumulative {"reward/timeouts", "reward/errors"} since this scorer was built."""
        with self._totals_lock:
            return dict(self._totals)

    # ---- scoring ---------------------------------------------------------------------------
    def _precheck(self, pred: str | None, gold: str, kind: str) -> tuple[float | None, bool]:
        """(reward, gold is unusable); reward None means "ask a worker". Gold is checked first so
        that a bad data row is counted whatever the response."""
        if kind == "choice":
            gold_letter = choice_letter(gold)
            if gold_letter is None:
                return 0.0, True
            if pred is None or len(pred) > self.max_answer_chars:
                return 0.0, False
            return float(choice_letter(pred) == gold_letter), False
        gold_key = normalise(gold)
        if not gold_key:
            return 0.0, True
        if pred is None or len(pred) > self.max_answer_chars:
            return 0.0, False
        pred_key = normalise(pred)
        if not pred_key:
            return 0.0, False
        if pred_key == gold_key:
            return 1.0, False
        if _INTEGER.fullmatch(pred_key) and _INTEGER.fullmatch(gold_key):
            return float(int(pred_key) == int(gold_key)), False
        return None, False

    def score(
        self,
        responses: Sequence[str],
        answers: Sequence[str],
        kinds: Sequence[str] | None = None,
        *,
        timeout_s: float | None = None,
        rules: Sequence[AnswerRule] | None = None,
        questions: Sequence[object] | None = None,
    ) -> ScoreResult:
        """Reward per response; `kinds` per item is "math" (default) or "choice"; `rules` per item
        says where its answer is read (default: `training_rule(self.requires_think)`). `questions`
        (the reward stage's rows) are not needed: only `answers` are read."""
        n = len(responses)
        if len(answers) != n:
            raise ValueError(f"got {n} responses but {len(answers)} answers")
        kinds = ["math"] * n if kinds is None else list(kinds)
        if len(kinds) != n:
            raise ValueError(f"got {n} responses but {len(kinds)} kinds")
        bad = sorted({k for k in kinds if k not in KINDS})
        if bad:
            raise ValueError(f"unknown reward kind(s) {bad}; allowed: {', '.join(KINDS)}")
        rules = [training_rule(self.requires_think)] * n if rules is None else list(rules)
        if len(rules) != n:
            raise ValueError(f"got {n} responses but {len(rules)} answer rules")
        budget = self.timeout_s if timeout_s is None else float(timeout_s)
        if budget <= 0:
            raise ValueError(f"reward timeout_s must be > 0, got {budget}")

        extracted = [rule.extract(r) for r, rule in zip(responses, rules)]
        rewards = [0.0] * n
        errors = timeouts = 0
        to_verify: list[int] = []
        items: list[tuple[str, str]] = []
        for i, (pred, gold, kind) in enumerate(zip(extracted, answers, kinds)):
            settled, bad_gold = self._precheck(pred, str(gold), kind)
            if bad_gold:
                errors += 1
                log.warning("%s item %d: unusable gold answer %r", kind, i, str(gold)[:50])
            if settled is not None:
                rewards[i] = settled
            else:
                assert pred is not None  # _precheck settles every item without an answer
                to_verify.append(i)
                items.append((prepare_math(str(gold)), prepare_math(pred)))

        if items:
            for i, (status, correct) in zip(to_verify, self._pool.run(items, budget)):
                rewards[i] = 1.0 if (status == "ok" and correct) else 0.0
                timeouts += status == "timeout"
                errors += status == "error"

        with self._totals_lock:
            self._totals["reward/timeouts"] += timeouts
            self._totals["reward/errors"] += errors
        return ScoreResult(rewards=rewards, extracted=extracted, timeouts=timeouts, errors=errors)


_default: RewardScorer | None = None
_default_lock = threading.Lock()


def default_scorer() -> RewardScorer:
    """The module-level scorer behind `score()`: created on first use, no think tags required,
    min(2, CPUs) workers; stopped at interpreter exit."""
    global _default
    with _default_lock:
        if _default is None or _default._pool.closed:
            _default = RewardScorer(requires_think=False, workers=min(2, os.cpu_count() or 1))
        return _default


def score(responses: list[str], answers: list[str], timeout_s: float = 5.0) -> list[float]:
    """1.0 / 0.0 per response ("math" kind; text after the last `</think>` if present)."""
    return default_scorer().score(responses, answers, timeout_s=timeout_s).rewards
