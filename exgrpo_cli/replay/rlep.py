"""`replay.method=rlep`: RLEP, Reinforcement Learning with Experience rePlay (Zhang et al., arXiv
2507.07451; the authors' code: Kwai-Klear/RLEP, verl-based). Verified successes are replayed beside
a full group of fresh rollouts: G fresh + M stored = G' responses, advantages over all G'.

Place in the train step: its hooks (replay/methods.py) replace ExGRPO's where RLEP differs.
- What enters the buffer: verified-correct fresh responses (reward >= reward.correct_at) of the
  groups the buffer collects (ExGRPO's eligibility bounds), with their log-probs (kept for the
  buffer's format and the off-policy figures; RLEP's loss does not read them, see below).
- Which questions, how many: n_replay = min(floor(rho B), buffered), uniformly over the buffered
  questions (ours: RLEP's data loader gives every question of its batch its stored successes; here
  the replayed questions take rho of the batch, as every method's do, drawn as the data loader
  draws, uniformly).
- The group: M = `replay.rlep.replayed` stored successes drawn uniformly without replacement
  (RLEP samples them with `random.sample`, M = 2; all of them when fewer are stored) beside K fresh
  rollouts; `group_advantages` then centres the rewards over the K + M responses of the group.
- The loss: a replayed success is a row like any other: its pi_old is the trainer's log-prob of
  the step (RLEP's replayed texts go through the actor's old-log-prob pass with the fresh ones), and
  algo.loss's fresh-token rule (PPO clip, or none after the delayed start as algo.clip_after_start
  says) applies: no importance weight against the stored log-probs, no f(w) shaping.
- What the buffer counts: a replayed question's k is over its K fresh responses only (`observed`):
  the M replayed successes are correct by construction and would push k above K.
- What leaves: ExGRPO's rules (retired at K/K; replay.max_age, replay.max_experiences).
RLEP's two phases (collect with one run, replay in the next) are a buffer carried into a new run
(`replay.init_from`); with the buffer filled during the run, as here, the phases overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from exgrpo_cli.algo.losses import LossInputs, PolicyLoss
from exgrpo_cli.config.registry import pick
from exgrpo_cli.replay.experience import Experience
from exgrpo_cli.replay.methods import ExgrpoReplay, Members, fresh_view
from exgrpo_cli.replay.selection import QUESTION_SELECTION

if TYPE_CHECKING:
    from exgrpo_cli.replay.mixing import Group


class RlepReplay(ExgrpoReplay):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.selector = pick(QUESTION_SELECTION, "replay.question_selection", "uniform")(cfg)
        self.score = None  # the successes are drawn at random: no forward to rank them
        self.replayed = int(cfg.replay.rlep.replayed)

    def members(
        self,
        candidates: Sequence[Experience],
        scores: Sequence[float],
        rng: np.random.Generator,
        group_size: int,
    ) -> Members:
        m = min(self.replayed, len(candidates))
        picks = rng.choice(len(candidates), size=m, replace=False).tolist() if m else []
        return Members(tuple(int(i) for i in picks), group_size)

    def importance_correction(self, configured: bool) -> bool:
        return False  # pi_old of the step, as the fresh rows' (the stored log-probs are not read)

    def loss(self, base: PolicyLoss, started: bool) -> PolicyLoss:
        def rlep_loss(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
            # every row under the fresh-token rule; x.replay_mask still marks the replayed rows
            # for the loss figures (update.py's loss_stats reads the caller's inputs)
            return base(replace(x, replay_mask=torch.zeros_like(x.replay_mask)))

        return rlep_loss

    def observed(self, groups: Sequence[Group]) -> Sequence[Group]:
        return fresh_view(groups)
