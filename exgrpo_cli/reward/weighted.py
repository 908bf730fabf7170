"""Several reward kinds at once (`reward.components`, e.g. {math: 1.0, model: 0.5}): the reward that
trains is the weighted sum of the kinds' rewards.

Place in the train step: the run's `Reward` (reward/stage.py) wraps this backend as it wraps a single
kind, so everything downstream reads the sum: advantages, `reward.correct_at` (a response is correct
when the *sum* is >= it: retirement, the buckets, the delayed start, pass@n), validation and eval.
Each call also returns every component's own (unweighted) rewards, which the reward stage of the
step (step/reward.py) logs as `reward/component/<name>`, the fresh responses' mean.

A component that errs or times out on an item scores it 0, as a single kind does; its counts add up
in `reward/errors` and `reward/timeouts`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exgrpo_cli.reward.scorer import Backend, ScoreResult


class WeightedReward:
    """The weighted sum of named backends; `components` of the last result hold each one's own
    rewards (unweighted), in the order of `weights`."""

    def __init__(self, parts: Mapping[str, Backend], weights: Mapping[str, float]) -> None:
        if not parts or set(parts) != set(weights):
            raise ValueError(f"components {sorted(parts)} and weights {sorted(weights)} differ")
        self.parts, self.weights = dict(parts), {name: float(weights[name]) for name in parts}

    @property
    def first_error(self) -> str:
        """The first component's first error, named (what the failure streak reports)."""
        for name, part in self.parts.items():
            first = getattr(part, "first_error", "")
            if first:
                return f"{name}: {first}"
        return ""

    def score(
        self, responses: Sequence[str], answers: Sequence[str], kinds: Any = None, **kw: Any
    ) -> ScoreResult:
        total = [0.0] * len(responses)
        components: dict[str, list[float]] = {}
        counts = {"timeouts": 0, "errors": 0, "unscored": 0}
        extracted: list[str | None] = [None] * len(responses)
        for name, part in self.parts.items():
            res = part.score(responses, answers, kinds, **kw)
            if len(res.rewards) != len(responses):
                raise RuntimeError(
                    f"reward component {name} gave {len(res.rewards)} rewards for {len(responses)}"
                )
            components[name] = [float(r) for r in res.rewards]
            total = [t + self.weights[name] * r for t, r in zip(total, components[name])]
            extracted = [e if e is not None else x for e, x in zip(extracted, res.extracted)]
            for key in counts:
                counts[key] += int(getattr(res, key, 0))
        return ScoreResult(total, extracted, components=components, **counts)

    def close(self) -> None:
        for part in self.parts.values():
            part.close()

    def metrics(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for part in self.parts.values():
            for key, value in part.metrics().items():
                out[key] = out.get(key, 0) + value
        return out
