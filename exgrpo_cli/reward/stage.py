"""The reward stage's choice (`reward.kind`) and what every kind shares: the correctness threshold
and the stop after steps of total failure.

Place in the train step: built once with the trainer (run/setup.py), then called after the
rollouts with this rank's responses and their data rows (step/reward.py) and by validation.
A backend scores a call's responses; `Reward` wraps it with `reward.correct_at` (a response is
correct when its reward is >= it: what retires a question, fills the buckets' counts and decides
pass@n) and counts the steps in a row on which every item failed. Each kind declares the range
of its rewards where it is known, so that a threshold no reward can reach is named at start-up
(`unreachable_threshold`) instead of silently switching replay off.

    math     math-verify against the gold answer, 1 or 0 (the default, today's run)
    choice   the answer's letter A-J against the gold letter, 1 or 0
    python   the user's function (reward/user_function.py), any finite numbers
    model    a sequence-classification reward model (reward/reward_model.py), its logit
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exgrpo_cli.config.schema import RewardConfig
from exgrpo_cli.errors import ExgrpoError
from exgrpo_cli.reward.scorer import Backend, RewardScorer, ScoreResult
from exgrpo_cli.reward.weighted import WeightedReward

if TYPE_CHECKING:
    import torch


class RewardFailed(ExgrpoError):
    """Every item of the reward failed for `reward.max_failed_steps` steps in a row."""


class ChoiceScorer(RewardScorer):
    """`RewardScorer` with every item of the "choice" kind unless the caller says otherwise."""

    def score(
        self, responses: Sequence[str], answers: Sequence[str], kinds: Any = None, **kw: Any
    ) -> ScoreResult:
        return super().score(
            responses, answers, ["choice"] * len(responses) if kinds is None else kinds, **kw
        )


def _function(cfg: RewardConfig, requires_think: bool, device: torch.device) -> Backend:
    from exgrpo_cli.reward.user_function import FunctionReward

    return FunctionReward(cfg.function, cfg.timeout_s, cfg.memory_limit_mb)


def _model(cfg: RewardConfig, requires_think: bool, device: torch.device) -> Backend:
    from exgrpo_cli.reward.reward_model import ModelReward

    return ModelReward(cfg.model, device)


@dataclass(frozen=True)
class RewardRange:
    """What a kind's rewards can be: at least `low`, at most `high`, and `high` itself only when
    `high_reached`, `low` only when `low_reached` (a sigmoid comes as close to 0 and 1 as it
    likes but, short of float rounding at a logit beyond ~37, never gets there)."""

    low: float
    high: float
    high_reached: bool
    low_reached: bool = True

    def reaches(self, threshold: float) -> bool:
        """Whether a reward of this range can be >= `threshold` (be correct)."""
        return threshold < self.high or (self.high_reached and threshold == self.high)


ZERO_ONE = RewardRange(0.0, 1.0, high_reached=True)


def _model_range(reward: RewardConfig) -> RewardRange | None:
    sigmoid = reward.model.normalise == "sigmoid"
    return RewardRange(0.0, 1.0, high_reached=False, low_reached=False) if sigmoid else None


@dataclass(frozen=True)
class RewardKind:
    build: Callable[[RewardConfig, bool, torch.device], Backend]
    needs_answer: bool  # a data row without a gold answer is a bad row
    # the rewards' range under this config; None: not known before the run (a function, logits)
    reward_range: Callable[[RewardConfig], RewardRange | None]


# `reward.kind`: name -> how to build it and what it needs
REWARDS: dict[str, RewardKind] = {
    "math": RewardKind(
        lambda c, think, d: RewardScorer(requires_think=think, workers=1), True, lambda c: ZERO_ONE
    ),
    "choice": RewardKind(
        lambda c, think, d: ChoiceScorer(requires_think=think, workers=1), True, lambda c: ZERO_ONE
    ),
    "python": RewardKind(_function, needs_answer=False, reward_range=lambda c: None),
    "model": RewardKind(_model, needs_answer=False, reward_range=_model_range),
}


def reward_kinds(cfg: RewardConfig) -> dict[str, float]:
    """The kinds the run's reward sums, with their weights: `reward.components`, or `reward.kind`
    alone with weight 1."""
    return {str(k): float(v) for k, v in cfg.components.items()} if cfg.components else {cfg.kind: 1.0}


def needs_answer(cfg: RewardConfig) -> bool:
    """Whether a data row without a gold answer is a bad row: when any kind summed needs one."""
    return any(REWARDS[k].needs_answer for k in reward_kinds(cfg))


def _sum_range(cfg: RewardConfig) -> RewardRange | None:
    """The range of sum(w x kind's reward) when every kind's range is known (else None)."""
    low = high = 0.0
    reached = True
    for name, w in reward_kinds(cfg).items():
        kind = REWARDS.get(name)
        span = kind.reward_range(cfg) if kind is not None else None
        if span is None:
            return None
        low += min(w * span.low, w * span.high)
        high += max(w * span.low, w * span.high)
        # a negative weight takes the sum's top from the kind's low end
        reached = reached and (span.high_reached if w > 0 else span.low_reached)
    return RewardRange(low, high, reached)


def unreachable_threshold(cfg: RewardConfig) -> str | None:
    """The start-up line for a `reward.correct_at` that no reward of the chosen kind(s) can reach
    (nothing is ever correct: nothing is stored or retires, reward/accuracy stays 0 and the delayed
    start never fires), with the fix; None when it can be reached or the range is not known."""
    span = _sum_range(cfg)
    if span is None or span.reaches(cfg.correct_at):
        return None
    top = f"up to {span.high:g}" if span.high_reached else f"below {span.high:g}"
    middle = (span.low + span.high) / 2
    return (
        f"reward.correct_at={cfg.correct_at:g} cannot be reached: {describe(cfg)} gives rewards {top}, so "
        "no response will count as correct, nothing will be stored in or retired from the replay "
        "buffer, and reward/accuracy will stay 0 (the delayed start never fires): set "
        f"reward.correct_at to the reward a good answer reaches (e.g. reward.correct_at={middle:g})"
    )


def describe(cfg: RewardConfig) -> str:
    """How the run's messages name its reward."""
    if cfg.components:
        return "reward.components={" + ", ".join(f"{k}: {v:g}" for k, v in reward_kinds(cfg).items()) + "}"
    if cfg.kind == "python":
        return f"reward.function={cfg.function}"
    if cfg.kind == "model":
        return f"reward.model.path={cfg.model.path}"
    return f"reward={cfg.kind}"


class Reward:
    """The run's reward: a backend, the threshold of "correct", and the failure streak."""

    def __init__(
        self, backend: Backend, correct_at: float, max_failed_steps: int = 3, name: str = "reward"
    ) -> None:
        self.backend, self.correct_at, self.name = backend, float(correct_at), name
        self.max_failed_steps = max_failed_steps
        self.failed_steps = 0  # steps in a row on which every item failed

    def score(
        self, responses: Sequence[str], answers: Sequence[str], kinds: Any = None, **kw: Any
    ) -> ScoreResult:
        return self.backend.score(responses, answers, kinds, **kw)

    def is_correct(self, reward: float) -> bool:
        return reward >= self.correct_at

    def close(self) -> None:
        self.backend.close()

    def metrics(self) -> dict[str, int]:
        return self.backend.metrics()

    def end_step(self, failed: int, total: int) -> None:
        """Count a step whose `failed` items (errors and timeouts, all ranks) were all of them;
        raise RewardFailed at the `max_failed_steps`-th such step in a row."""
        self.failed_steps = self.failed_steps + 1 if total and failed >= total else 0
        if self.failed_steps >= self.max_failed_steps:
            first = getattr(self.backend, "first_error", "") or "every item scored as an error"
            raise RewardFailed(
                f"{self.name} failed on every response for {self.failed_steps} steps in a row "
                f"(reward.max_failed_steps={self.max_failed_steps}); first error: {first}"
            )


def build_reward(cfg: RewardConfig, requires_think: bool, device: torch.device) -> Reward:
    if cfg.components:  # several kinds: their weighted sum (reward/weighted.py)
        weights = reward_kinds(cfg)
        parts = {name: REWARDS[name].build(cfg, requires_think, device) for name in weights}
        backend: Backend = WeightedReward(parts, weights)
    else:
        backend = REWARDS[cfg.kind].build(cfg, requires_think, device)
    return Reward(backend, cfg.correct_at, cfg.max_failed_steps, describe(cfg))
