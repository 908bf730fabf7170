"""The reward stage of one train step: grade this rank's share, share the rewards, log them.

Place in the train step (step/loop.py `Trainer.score`): after the rollouts, before the delayed
start switch and the mixed batch. Each rank grades its share of the groups (`grade_share`: one
call of the run's `Reward`, reward/stage.py), every rank gets every group's rewards, and every
response is marked correct when its reward is >= `reward.correct_at`. Grading has a time budget,
so if every rank graded every group, a timeout on one rank only would leave the ranks with
different rewards, then different buffers, then mismatched collectives.

Metrics: `reward/mean` (the fresh responses' mean reward), `reward/max` (their highest),
`reward/accuracy` (their share that is correct: what the delayed start reads, whatever the
reward's scale), `reward/solved_all`,
`reward/solved_none` and `reward/fresh_solved_none` (groups whose responses are all / none
correct), `reward/replayed_accuracy`, and the step's `reward/timeouts`, `reward/errors`
(and `reward/unscored` when the reward can return None); under `reward.components` also
`reward/component/<name>`, each kind's own mean over the fresh responses (reward/weighted.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import islice

import numpy as np

from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.replay.mixing import Group
from exgrpo_cli.reward.stage import Reward

Graded = tuple[list[float], dict[str, list[float]]]  # a group's rewards, and its components' (by name)


def grade_share(
    reward: Reward, decode: Callable[[list[int]], str], share: list[Group]
) -> tuple[list[Graded], dict[str, int]]:
    """One rank's share of the grading: every response of `share`'s groups in one call of the
    reward, its rewards group by group (with each component's own under `reward.components`), and
    the share's timeouts, errors and unscored responses."""
    texts = [decode(r.ids) for g in share for r in g.responses]
    rows = [g.question for g in share for _ in g.responses]
    result = reward.score(texts, [q.answer for q in rows], questions=rows)
    sizes = [len(g.responses) for g in share]
    rewards = _by_group(result.rewards, sizes)
    parts = {name: _by_group(v, sizes) for name, v in (getattr(result, "components", None) or {}).items()}
    graded = [(r, {name: p[i] for name, p in parts.items()}) for i, r in enumerate(rewards)]
    counts = {"timeouts": result.timeouts, "errors": result.errors}
    return graded, counts | {"unscored": getattr(result, "unscored", 0)}


def _by_group(values: Sequence[float], sizes: list[int]) -> list[list[float]]:
    flat = iter(values)
    return [[float(x) for x in islice(flat, n)] for n in sizes]


def grade_step(
    reward: Reward, parallel: DataParallel, groups: Sequence[Group], decode: Callable[[list[int]], str]
) -> dict[str, float]:
    """Set every response's reward and correctness, `grade_share` mapped over the ranks (`decode`:
    response ids -> text). Returns the step's reward metrics; raises RewardFailed after
    `reward.max_failed_steps` steps in a row on which every response failed."""
    graded, counts = parallel.map_counted(lambda share: grade_share(reward, decode, share), groups)
    for g, (group_rewards, _) in zip(groups, graded):
        for resp, rew in zip(g.responses, group_rewards):
            resp.reward, resp.correct = rew, reward.is_correct(rew)
    reward.end_step(counts["timeouts"] + counts["errors"], sum(len(g.responses) for g in groups))
    return step_metrics(groups, counts) | component_metrics(groups, [parts for _, parts in graded])


def component_metrics(groups: Sequence[Group], parts: Sequence[dict[str, list[float]]]) -> dict[str, float]:
    """`reward/component/<name>`: each summed kind's own mean reward over the fresh responses
    (reward.components; none otherwise)."""
    sums: dict[str, list[float]] = {}
    for g, by_name in zip(groups, parts):
        for name, values in by_name.items():
            sums.setdefault(name, []).extend(v for v, r in zip(values, g.responses) if not r.replayed)
    return {f"reward/component/{name}": float(np.mean(v)) if v else math.nan for name, v in sums.items()}


def step_metrics(groups: Sequence[Group], counts: dict[str, int]) -> dict[str, float]:
    fresh = [r for g in groups for r in g.responses if not r.replayed]
    replayed = [r for g in groups for r in g.responses if r.replayed]
    out = {
        "reward/mean": float(np.mean([r.reward for r in fresh])) if fresh else 0.0,
        "reward/accuracy": float(np.mean([r.is_correct for r in fresh])) if fresh else 0.0,
        # whether any reward reaches reward.correct_at (run/notices.py's empty-buffer warning)
        "reward/max": float(max(r.reward for r in fresh)) if fresh else math.nan,
        "reward/timeouts": float(counts["timeouts"]),
        "reward/errors": float(counts["errors"]),
        "reward/solved_all": float(np.mean([g.num_correct == len(g.responses) for g in groups])),
        "reward/solved_none": float(np.mean([g.num_correct == 0 for g in groups])),
    }
    if counts.get("unscored"):
        out["reward/unscored"] = float(counts["unscored"])
    # A replayed group always holds a correct response, so solved_none falls with the replay
    # share alone; the fresh groups' share is what compares on-policy and ExGRPO runs.
    fresh_groups = [g for g in groups if not g.from_buffer]
    if fresh_groups:
        out["reward/fresh_solved_none"] = float(np.mean([g.num_correct == 0 for g in fresh_groups]))
    if replayed:
        out["reward/replayed_accuracy"] = float(np.mean([r.reward for r in replayed]))
    return out
