"""replay.method=prioritized (replay/prioritized_replay.py): the problems of highest p(1-p) replay
as prompts; a problem that falls to p = 0 leaves; solved problems are retested periodically."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.method_registry import build_replay_method
from exgrpo_cli.replay.mixing import Group, Response
from exgrpo_cli.replay.prioritized_replay import PrioritizedReplay, priority

from conftest import REPLAY_RUN, metrics, train_ok

K = 4


def _group(uid: str, k: int, from_buffer: bool = False) -> Group:
    responses = [Response([7, j], [-1.0, -1.0], reward=float(j < k)) for j in range(K)]
    return Group(Question(uid, uid, "1"), [1], responses, from_buffer=from_buffer)


def _method(retest_every: int = 0, retest_fraction: float = 0.5) -> PrioritizedReplay:
    cfg = ExgrpoConfig()
    cfg.rollout.n, cfg.replay.method = K, "prioritized"
    cfg.replay.prioritized.retest_every, cfg.replay.prioritized.retest_fraction = (
        retest_every,
        retest_fraction,
    )
    method = build_replay_method(cfg)
    assert isinstance(method, PrioritizedReplay)
    return method


def _step(method: PrioritizedReplay, buf: ExperienceBuffer, groups: list[Group], step: int) -> None:
    buf.observe_groups(
        groups, step, (0, K - 1), None, method.enters(groups, (0, K - 1)), method.keeps_prompts
    )
    method.end_step(buf, step, groups)


def test_priority_is_the_mean_squared_group_advantage() -> None:
    for k in range(K + 1):
        rewards = np.array([1.0] * k + [0.0] * (K - k))
        assert math.isclose(priority(k / K), float(np.mean((rewards - rewards.mean()) ** 2)))


def test_the_highest_priority_problems_replay_with_no_stored_token() -> None:
    method, buf = _method(), ExperienceBuffer(K)
    _step(method, buf, [_group("a", 1), _group("c", 3), _group("b", 2), _group("a2", 1)], 1)
    assert buf.num_experiences == 0 and buf.num_questions == 4
    rng = np.random.default_rng(0)
    assert method.questions(buf, 1, rng, 2) == ["b"]  # p = 1/2: priority 1/4
    assert method.questions(buf, 3, rng, 2) == ["b", "a", "a2"]  # then 3/16 each, by bucket and arrival
    assert method.questions(buf, 1, rng, 3) == ["b"]  # no cooldown: the top problem stays on top
    assert method.members([], [], rng, K).picks == () and method.members([], [], rng, K).fresh == K


def test_a_replayed_problem_at_p0_leaves_and_at_p1_retires() -> None:
    method, buf = _method(), ExperienceBuffer(K)
    _step(method, buf, [_group("a", 1), _group("b", 2)], 1)
    _step(method, buf, [_group("a", 0, from_buffer=True), _group("b", 4, from_buffer=True)], 2)
    assert "a" not in buf and not buf.is_retired("a")  # unsolved: back to fresh sampling only
    assert buf.is_retired("b")


def test_solved_problems_are_retested_every_retest_every_steps() -> None:
    method, buf = _method(retest_every=3, retest_fraction=0.5), ExperienceBuffer(K)
    _step(method, buf, [_group(f"s{i}", K) for i in range(4)], 1)
    assert len(buf.retired) == 4
    _step(method, buf, [], 2)
    assert len(buf.retired) == 4  # not a retest step
    _step(method, buf, [], 3)
    assert len(buf.retired) == 2 and buf.metrics()["replay/readmitted"] == 2


@pytest.mark.long  # a 3-step training run (~10 s): make test-long
def test_prioritized_replay_trains_on_policy_and_retests(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # a retest every step of every solved problem: whatever retires comes straight back
    retest = ["replay.prioritized.retest_every=1", "replay.prioritized.retest_fraction=1"]
    train_ok(out, *REPLAY_RUN, "replay.method=prioritized", *retest)
    rows = metrics(out)
    replaying = [r for r in rows if r.get("replay/replayed_questions", 0) > 0]
    assert replaying, "the scenario must replay"
    for r in rows[1:]:
        assert r["replay/buffer_experiences"] == 0 and r["rollout/responses"] == r["rollout/rows"] == 8 * K
        w = r["loss/importance_weight_mean"]  # over replayed tokens in the loss: there are none
        assert w is None or math.isnan(w)
    assert rows[-1]["replay/readmitted"] > 0, "the scenario must solve a problem"
    assert all(r["replay/retired"] == 0 for r in rows[1:])
