"""`replay.method=luffy`: LUFFY, Learning to reason Under oFF-policY guidance (Yan et al., arXiv
2504.14945; the authors' code: ElliottYan/LUFFY, verl-based). Another model's solution to a
question, read from the data (`data.solution_key`, default `target`: the column of the paper's
training set Elliott/Openr1-Math-46k-8192), joins the question's group in place of one fresh
rollout, and its tokens are trained with policy shaping against no behaviour policy.

Place in the train step: its hooks (replay/methods.py) replace ExGRPO's where LUFFY differs.
- What enters the buffer: nothing (`enters` = none); nothing is replayed from it (`how_many` = 0).
  The guidance comes from the data, every step, for every fresh question whose row has a solution.
- The group (`guidance`): the solution's tokens (the text, then end-of-sequence, cut at
  model.max_response_tokens) beside K - 1 fresh rollouts, 1 + 7 as LUFFY's 8; its reward is
  scored like every response's; advantages over the K (Dr.GRPO, as ExGRPO's).
- The loss: the solution's stored log-probs are 0 (pi_behaviour = 1: LUFFY has no log-prob of the
  model that wrote it), so its ratio is pi_theta itself, shaped by f(x) = x / (x + gamma), gamma =
  `replay.luffy.gamma` (LUFFY: 0.1), not clipped (`importance_correction` always True: the 0 is the
  behaviour log-prob by definition); fresh tokens by algo.loss's rule.
- What the buffer counts: a guided question's k is over its fresh rollouts (`observed`), so the
  solution, right by construction, never retires a question; a group whose fresh rollouts are all
  correct retires, as ExGRPO's K/K (K - 1 of K - 1 beside a solution).
Guidance runs from step 1 whenever replay is on (replay.ratio > 0; LUFFY has no delayed start),
while replay.start_threshold still switches algo.loss's fresh-token clip as it does for ExGRPO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import Tensor

from exgrpo_cli.algo.losses import LossInputs, PolicyLoss, exgrpo_token_losses
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.bucketing import Bounds
from exgrpo_cli.replay.methods import ExgrpoReplay, fresh_view, on_replayed_rows

if TYPE_CHECKING:
    from exgrpo_cli.replay.buffer import ExperienceBuffer
    from exgrpo_cli.replay.mixing import Group


def shaped_offpolicy_loss(base: PolicyLoss, gamma: float) -> PolicyLoss:
    """The fresh rows from `base`; the guided rows -A f(w), f(w) = w / (w + gamma), w = pi_theta /
    pi_behaviour (pi_theta itself when the behaviour log-prob is 0), never clipped."""

    def shaped(x: LossInputs) -> Tensor:
        args = (x.logp, x.behaviour_logp, x.advantages, x.response_mask, x.replay_mask)
        return exgrpo_token_losses(*args, clip_eps=None, beta=gamma)[0]

    return on_replayed_rows(base, shaped)


class LuffyReplay(ExgrpoReplay):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.score = None
        self.solution_key = str(cfg.data.solution_key)
        self.gamma = float(cfg.replay.luffy.gamma)

    def how_many(self, buffer: ExperienceBuffer) -> int:
        return 0  # the guidance comes from the data, not from the buffer

    def guidance(self, question: Question) -> tuple[str, ...]:
        """The data row's solution, when it has a non-empty one: a string, or a chat message (a
        dict with `content`) or a list of them, the first taken (ours: the benchmark parquets of
        the paper keep their prompts as such lists)."""
        value = question.columns.get(self.solution_key)
        if isinstance(value, list | tuple):
            value = value[0] if value else None
        if isinstance(value, dict):
            value = value.get("content")
        return (value,) if isinstance(value, str) and value.strip() else ()

    def importance_correction(self, configured: bool) -> bool:
        return True  # the stored 0 is pi_behaviour = 1 by definition, not a correction to ablate

    def loss(self, base: PolicyLoss, started: bool) -> PolicyLoss:
        return shaped_offpolicy_loss(base, self.gamma)

    def observed(self, groups: Sequence[Group]) -> Sequence[Group]:
        return fresh_view(groups)

    def enters(self, groups: Sequence[Group], bounds: Bounds | None) -> list[tuple[int, int]]:
        return []
