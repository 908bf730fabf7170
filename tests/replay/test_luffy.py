"""replay.method=luffy (replay/luffy.py): the data column's solution joins its question's group in
place of one fresh rollout, with behaviour log-prob 0, shaped by f(x) = x / (x + gamma)."""

from __future__ import annotations

import math

import pytest
import torch

from exgrpo_cli.algo.losses import ExgrpoLoss, LossInputs
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.synthetic import make_question, worked_solution
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.luffy import LuffyReplay, shaped_offpolicy_loss

from conftest import REPLAY_RUN, train_in_process


def _method(key: str = "target") -> LuffyReplay:
    cfg = ExgrpoConfig()
    cfg.replay.method, cfg.data.solution_key = "luffy", key
    return LuffyReplay(cfg)


def test_the_solution_comes_from_the_data_column() -> None:
    q = make_question("q", 47, "+", 38)
    assert _method().guidance(q) == (worked_solution(47, "+", 38),)  # the synthetic task's column
    chat = Question("c", "x", "1", columns={"sol": [{"role": "assistant", "content": "it is 1"}]})
    assert _method("sol").guidance(chat) == ("it is 1",)
    assert _method("sol").guidance(q) == ()  # no such column: K fresh rollouts
    assert _method().guidance(Question("e", "x", "1", columns={"target": " "})) == ()
    assert _method().how_many(None) == 0  # type: ignore[arg-type]  # nothing replays from the buffer


def test_the_solution_tokens_are_shaped_against_no_behaviour_policy() -> None:
    p = torch.tensor([[0.05, 0.5, 0.9], [0.05, 0.5, 0.9]])  # pi_theta per token
    x = LossInputs(
        logp=p.log(),
        behaviour_logp=torch.zeros(2, 3),  # the solution row: log 1
        advantages=torch.tensor([0.5, 0.5]),
        response_mask=torch.ones(2, 3),
        replay_mask=torch.tensor([False, True]),
    )
    losses, _ = shaped_offpolicy_loss(ExgrpoLoss(clip_eps=0.2, beta=0.7), 0.1)(x)
    assert torch.allclose(losses[1], -0.5 * p[1] / (p[1] + 0.1))  # gamma 0.1, not replay.beta 0.7
    # fresh: algo.loss's PPO clip, max(-A w, -A clip(w)) = -A min(w, clip(w)) for A > 0
    assert torch.allclose(losses[0], -0.5 * torch.minimum(p[0], p[0].clamp(0.8, 1.2)))


@pytest.mark.slow
def test_luffy_trains_on_the_data_columns_solutions() -> None:
    """The real path on the embedded synthetic task: every fresh question's group holds K - 1 fresh
    rollouts and its `target` solution's tokens (log-probs 0), advantages over the K, and the
    solution rows reach the loss."""
    k = 4  # REPLAY_RUN's rollout.n
    rows, updates = train_in_process([*REPLAY_RUN, "replay.method=luffy", "replay.start_threshold=0.99"])
    # every question guided from step 1: LUFFY has no delayed start
    assert [r["replay/replayed_questions"] for r in rows] == [8, 8, 8]
    for r, u in zip(rows, updates):
        b, tok = u.batch, u.tokenizer
        for gi, g in enumerate(u.groups):
            solution = [resp for resp in g.responses if resp.replayed]
            assert len(g.responses) == k and len(solution) == 1 and not g.from_buffer
            text = tok.decode(solution[0].ids, skip_special_tokens=True)
            assert text == g.question.columns["target"] and solution[0].reward == 1.0
            assert solution[0].behavior_logp == [0.0] * len(solution[0].ids)
            at = b.group_index == gi
            assert torch.allclose(u.advantages[at], b.rewards[at] - b.rewards[at].mean())
        assert u.plan.importance_correction and u.result.stats.replay_tokens > 0
        assert math.isfinite(r["loss/importance_weight_mean"])
