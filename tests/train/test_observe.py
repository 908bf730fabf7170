"""What a step stores (docs/algorithm.md §2): the eligibility bounds and whose log-probs are stored."""

from __future__ import annotations

import numpy as np
from toy_trainer import toy_state, toy_trainer

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.mixing import Group, Response
from exgrpo_cli.step.loop import Trainer


def _trainer(cfg: ExgrpoConfig) -> Trainer:
    return toy_trainer(cfg, toy_state(ExperienceBuffer(cfg.rollout.n), started=True))


def _group(uid: str, k: int, K: int = 4) -> Group:
    """K responses, the first k correct; response j is token [j + 1] with engine log-prob -9."""
    return Group(
        Question(uid, uid, "1"), [1], [Response([j + 1], [-9.0], reward=float(j < k)) for j in range(K)]
    )


def _trainer_logp(groups: list[Group]) -> dict[tuple[int, int], np.ndarray]:
    return {
        (gi, ri): np.array([-0.5 - gi], np.float32)
        for gi, g in enumerate(groups)
        for ri, r in enumerate(g.responses)
        if r.reward > 0.5
    }


def test_only_success_counts_within_the_bounds_enter_the_buffer() -> None:
    cfg = ExgrpoConfig()
    cfg.rollout.n = 4
    cfg.replay.experience_lbound, cfg.replay.experience_rbound = 1, 2  # store k = 2 only
    t = _trainer(cfg)
    groups = [_group("k1", 1), _group("k2", 2), _group("k3", 3), _group("k4", 4)]
    t.observe(groups, step=1, trainer_logp=_trainer_logp(groups))
    buf = t.state.buffer
    assert "k2" in buf and "k1" not in buf and "k3" not in buf
    assert buf.experiences("k2")[0].behavior_logp.tolist() == [-1.5]  # the trainer's, not the engine's
    buf.end_step()
    assert buf.is_retired("k4")  # k == K retires whatever the bounds


def test_official_bounds_store_every_partly_solved_group_and_engine_logprobs_on_request() -> None:
    cfg = ExgrpoConfig()  # lbound 0, rbound null: k = 1..K-1
    cfg.rollout.n = 4
    cfg.replay.store_trainer_logprobs = False
    t = _trainer(cfg)
    groups = [_group("k0", 0), _group("k1", 1), _group("k3", 3)]
    t.observe(groups, step=1, trainer_logp={})
    buf = t.state.buffer
    assert {"k1", "k3"} == {u for u in ("k0", "k1", "k3") if u in buf}
    assert buf.experiences("k3")[0].behavior_logp.tolist() == [-9.0]  # the rollout engine's


def test_the_default_bound_follows_k() -> None:
    """rbound null is K - 1 for any K: with K = 16 a group of 12 correct is partly solved, stored
    (the official constant 7 would drop every group above 7 of 16)."""
    cfg = ExgrpoConfig()
    cfg.rollout.n = 16
    assert cfg.replay.experience_bounds(16) == (0, 15)
    t = _trainer(cfg)
    groups = [_group("k12", 12, K=16), _group("k16", 16, K=16)]
    t.observe(groups, step=1, trainer_logp=_trainer_logp(groups))
    assert "k12" in t.state.buffer and len(t.state.buffer.experiences("k12")) == 12
    t.state.buffer.end_step()
    assert t.state.buffer.is_retired("k16")
