"""Registry entries own their settings: a loss or a question-selection rule with a knob of its own is
registered in one place and reaches the step through the real builder (`setup.choices`, the
trainer's update plan and replay selection) without any shared signature changing; and ExGRPO's
own loss settings still change exactly at the delayed start (docs/algorithm.md §4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pytest
import torch
from toy_trainer import toy_state, toy_trainer

from exgrpo_cli.algo.losses import POLICY_LOSSES, ExgrpoLoss, LossInputs
from exgrpo_cli.commands.variants import check_variants
from exgrpo_cli.config.schema import AlgoConfig, ExgrpoConfig, ReplayConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.selection import QUESTION_SELECTION, BucketedQuestions
from exgrpo_cli.step.loop import Trainer


@dataclass
class ToyAlgo(AlgoConfig):  # the toy loss's own key, as config/schema.py would declare it
    toy_scale: float = field(default=1.0, metadata={"help": "the toy loss's factor"})


@dataclass
class ToyReplay(ReplayConfig):  # the toy rule's own key
    toy_skip: int = field(default=0, metadata={"help": "buffered questions the toy rule passes over"})


def _scaled(x: LossInputs, *, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    losses = -scale * x.advantages.unsqueeze(-1) * x.response_mask
    return losses, torch.zeros_like(losses, dtype=torch.bool)


def _skip_first(buffer: BucketedQuestions, n: int, *, skip: int, rng: np.random.Generator) -> list[str]:
    everything = [u for b in range(len(buffer.bucket_sizes())) for u in buffer.questions_in_bucket(b)]
    return everything[skip : skip + n]


def _trainer(cfg: ExgrpoConfig, started: bool) -> Trainer:
    buffer = ExperienceBuffer(cfg.rollout.n)
    for i in range(6):  # one stored response each, all in the k=1 bucket
        resp = (np.array([i + 1], np.int32), np.zeros(1, np.float32))
        buffer.observe_group(f"q{i}", 1, [resp], step=1, collect=True)
    buffer.end_step()
    return toy_trainer(cfg, toy_state(buffer, started, [Question(f"q{i}", "p", "1") for i in range(8)]))


def test_a_loss_with_its_own_setting_is_one_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(POLICY_LOSSES, "toy", lambda cfg, started: partial(_scaled, scale=cfg.algo.toy_scale))
    cfg = ExgrpoConfig(algo=ToyAlgo(loss="toy", toy_scale=3.0))
    check_variants(cfg, "train")  # the start-up check knows the name
    loss = _trainer(cfg, started=True).update_plan().loss
    mask = torch.ones(2, 3)
    x = LossInputs(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([1.0, -2.0]), mask, torch.zeros(2))
    losses, clipped = loss(x)
    assert losses.tolist() == [[-3.0] * 3, [6.0] * 3] and not clipped.any()


def test_a_selection_rule_with_its_own_knob_is_one_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(QUESTION_SELECTION, "toy", lambda cfg: partial(_skip_first, skip=cfg.replay.toy_skip))
    cfg = ExgrpoConfig(
        replay=ToyReplay(question_selection="toy", toy_skip=2, trajectory_selection="shortest")
    )
    cfg.rollout.n, cfg.algo.questions_per_step = 2, 4  # replay.ratio 0.5: two replayed questions
    check_variants(cfg, "train")
    chosen, _ = _trainer(cfg, started=True).select_replay(step=3)
    assert [r.question.uid for r in chosen] == ["q2", "q3"]


@pytest.mark.parametrize(
    ("started", "clip_after_start", "shaping", "expected"),
    [
        (False, False, True, ExgrpoLoss(clip_eps=0.2, beta=0.1)),  # before the switch: PPO clipping
        (True, False, True, ExgrpoLoss(clip_eps=None, beta=0.1)),  # after it: the official run drops it
        (True, True, True, ExgrpoLoss(clip_eps=0.2, beta=0.1)),
        (True, False, False, ExgrpoLoss(clip_eps=None, beta=None)),  # the "w/o shaping" ablation
    ],
)
def test_exgrpo_loss_settings_change_at_the_delayed_start(
    started: bool, clip_after_start: bool, shaping: bool, expected: ExgrpoLoss
) -> None:
    cfg = ExgrpoConfig()
    cfg.algo.clip_after_start, cfg.replay.shaping = clip_after_start, shaping
    assert _trainer(cfg, started).update_plan().loss == expected
    cfg.replay.ratio = 0.0  # on-policy Dr.GRPO: the switch never counts, clipping stays
    assert _trainer(cfg, started).update_plan().loss == ExgrpoLoss(
        clip_eps=0.2, beta=None if not shaping else 0.1
    )
