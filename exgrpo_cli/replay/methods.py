"""Replay methods (`replay.method`): how a run reuses experience, as one protocol with named hooks.

Place in the train step: everywhere replay touches it, and nowhere by name. The step calls the
hooks of the one method the config names, in this order:

  expire(buffer, step)                  what leaves the buffer before selection (max age, ...)
  how_many(buffer) -> n                 how many questions are replayed this step
  questions(buffer, n, rng, step)       which buffered questions (uids)
  guidance(question)                    solutions from elsewhere that join a fresh question's group
                                        in place of as many fresh rollouts, trained as replayed
                                        rows with behaviour log-prob 0 (LUFFY's; none by default);
                                        asked from step 1 (no delayed start) when replay.ratio > 0
  score                                 what the current policy computes per stored candidate
                                        first (an algo.logprobs.CandidateScore; None: no forward)
  values(buffer, uid, candidates, scores)  what `members` ranks a question's candidates by: the
                                        policy's `scores` (default), or what the method recorded
                                        of them (RePO: their stored rewards)
  members(candidates, scores, rng, K)   which stored responses join a question's group, and how
                                        many fresh rollouts complete it (a `Members`)
  importance_correction(configured)     whether replayed tokens are weighed against their stored
                                        log-probs (True) or against pi_old of the step, as fresh
                                        ones are (False); `configured`: replay.importance_correction
  advantages(batch, scale_by_std)       the rows' advantages (Dr.GRPO over each question's group;
                                        a method may group its rows otherwise, as RePO's split)
  loss(base, started)                   how replayed tokens enter the loss: the step's PolicyLoss
                                        built from `base` (algo.loss's; replayed rows are the
                                        batch's `replay_mask` rows)
  observed(groups)                      the groups as the buffer counts them (k, level, which
                                        responses `enters` may name): the groups themselves, or a
                                        view without the replayed rows
  enters(groups, bounds)                what enters the buffer: (group, response) of every
                                        response it stores; `keeps_prompts`: a question enters its
                                        bucket even when none of its responses is stored;
                                        `stores_any`: `enters` may name incorrect responses too
  recorded(buffer, groups, rows)        what the method remembers of the responses just stored
                                        (RePO: their rewards), in `buffer.method_state`
  end_step(buffer, step, groups)        what leaves after the step (retirement, ...), seeing the
                                        step's scored groups

and, once at the start of a run that resumes or carries a buffer (replay.init_from):

  carried(state) -> state               what of another run's `method_state` a carried buffer
                                        keeps (none by default: its steps and counts were the
                                        other run's; RePO keeps its stored rewards)
  replays(buffer) -> why not | None     why this method cannot replay the buffer's content (a
                                        buffer of prompts only, of incorrect responses, without
                                        the rewards RePO ranks by), refused in one line

A method keeps no state of its own: what it must remember across steps (reuse counts, the step a
question was last replayed, priorities) goes into `buffer.method_state`, a JSON-able dict that is
saved and digested with the buffer, so a resumed run and every rank see the same.

The entry `exgrpo` (`ExgrpoReplay`) is the paper's rule and the default: Gaussian buckets
(`replay.question_selection`), one stored response per question picked by
`replay.trajectory_selection`, K-1 fresh beside it, the replayed tokens weighed by f(w) through
algo.loss, the fresh correct responses of partly solved groups stored, K/K groups retired. Other
methods subclass it and override the hooks they change (a method with the group shape of RLEP
returns M picks and K fresh from `members`; one that replays prompts only returns no pick, K
fresh, and sets `keeps_prompts`). A method that needs a hook this protocol lacks is the
protocol's bug: extend it here, never `if method == ...` in the step.

`REPLAY_METHODS` (replay/method_registry.py) maps a name to its factory (the run's config -> a
method); `replay.method` may also name a user's class in a file, `path/to/file.py:Name` (loaded by
config/user_code.py, the loader `reward.function` uses), called with the config like the entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from exgrpo_cli.algo.advantages import group_advantages
from exgrpo_cli.algo.logprobs import CandidateScore
from exgrpo_cli.algo.losses import LossInputs, PolicyLoss
from exgrpo_cli.config.registry import pick
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.bucketing import Bounds, storable
from exgrpo_cli.replay.experience import Experience
from exgrpo_cli.replay.selection import QUESTION_SELECTION, n_replay
from exgrpo_cli.replay.trajectory import TRAJECTORY_SELECTION

if TYPE_CHECKING:
    from exgrpo_cli.replay.buffer import ExperienceBuffer
    from exgrpo_cli.replay.mixing import Group, MixedBatch


@dataclass(frozen=True)
class Members:
    """One replayed question's group: `picks`, indices of the stored candidates that join it (in
    the order they are appended after the fresh responses), and `fresh`, how many fresh responses
    are generated beside them."""

    picks: tuple[int, ...]
    fresh: int


@dataclass(frozen=True)
class Replayed:
    """A question the method chose this step, with the stored responses its group replays (none
    for a method that replays prompts only) and the fresh responses it asks for."""

    question: Question
    experiences: tuple[Experience, ...]
    fresh: int


def fresh_view(groups: Sequence[Group]) -> list[Group]:
    """The groups without their replayed rows, for a method whose groups hold more than K rows
    (K fresh + M stored, or solutions from elsewhere): the buffer counts k over the fresh rollouts,
    the current policy's. The replayed rows come after the fresh ones, which keep their places."""
    return [
        replace(g, responses=[r for r in g.responses if not r.replayed])
        if any(r.replayed for r in g.responses)
        else g
        for g in groups
    ]


def on_replayed_rows(base: PolicyLoss, off_policy: Callable[[LossInputs], Tensor]) -> PolicyLoss:
    """A method's `loss`: `base`'s token losses on the fresh rows, `off_policy(x)`'s on the
    replayed ones (the batch's `replay_mask` rows), `base`'s clip count."""

    def loss(x: LossInputs) -> tuple[Tensor, Tensor]:
        on, clipped = base(x)
        return torch.where(x.replay_mask.bool().unsqueeze(-1), off_policy(x), on), clipped

    return loss


@runtime_checkable
class ReplayMethod(Protocol):
    """The hooks the train step calls (the module docstring gives their order)."""

    score: CandidateScore | None
    keeps_prompts: bool
    stores_any: bool

    def expire(self, buffer: ExperienceBuffer, step: int) -> None: ...

    def how_many(self, buffer: ExperienceBuffer) -> int: ...

    def questions(
        self, buffer: ExperienceBuffer, n: int, rng: np.random.Generator, step: int
    ) -> list[str]: ...

    def guidance(self, question: Question) -> tuple[str, ...]: ...

    def values(
        self, buffer: ExperienceBuffer, uid: str, candidates: Sequence[Experience], scores: list[float]
    ) -> list[float]: ...

    def members(
        self,
        candidates: Sequence[Experience],
        scores: Sequence[float],
        rng: np.random.Generator,
        group_size: int,
    ) -> Members: ...

    def importance_correction(self, configured: bool) -> bool: ...

    def advantages(self, batch: MixedBatch, scale_by_std: bool) -> Tensor: ...

    def loss(self, base: PolicyLoss, started: bool) -> PolicyLoss: ...

    def observed(self, groups: Sequence[Group]) -> Sequence[Group]: ...

    def enters(self, groups: Sequence[Group], bounds: Bounds | None) -> list[tuple[int, int]]: ...

    def recorded(
        self, buffer: ExperienceBuffer, groups: Sequence[Group], rows: Sequence[tuple[int, int]]
    ) -> None: ...

    def end_step(self, buffer: ExperienceBuffer, step: int, groups: Sequence[Group]) -> list[str]: ...

    def carried(self, state: dict[str, Any]) -> dict[str, Any]: ...

    def replays(self, buffer: ExperienceBuffer) -> str | None: ...


HOOKS = (
    "expire",
    "how_many",
    "questions",
    "guidance",
    "values",
    "members",
    "importance_correction",
    "advantages",
    "loss",
    "observed",
    "enters",
    "recorded",
    "end_step",
    "carried",
    "replays",
)


class ExgrpoReplay:
    """ExGRPO's replay (docs/algorithm.md §2-4), with the settings of `replay.*` it reads bound."""

    keeps_prompts = False  # a question enters the buffer only with a stored correct response
    stores_any = False  # only correct responses are stored

    def __init__(self, cfg: Any) -> None:
        p = cfg.replay
        self.ratio = float(p.ratio)
        self.batch_questions = int(cfg.algo.questions_per_step)
        self.selector = pick(QUESTION_SELECTION, "replay.question_selection", p.question_selection)(cfg)
        self.rule = pick(TRAJECTORY_SELECTION, "replay.trajectory_selection", p.trajectory_selection)
        self.score: CandidateScore | None = self.rule.score

    def expire(self, buffer: ExperienceBuffer, step: int) -> None:
        """`replay.max_age`: before selection, so that no replayed row is older."""
        buffer.expire(step)

    def how_many(self, buffer: ExperienceBuffer) -> int:
        """n_replay = min(floor(rho * B), buffered questions) (docs/algorithm.md §3)."""
        return n_replay(self.ratio, self.batch_questions, buffer.num_questions)

    def questions(self, buffer: ExperienceBuffer, n: int, rng: np.random.Generator, step: int) -> list[str]:
        return self.selector(buffer, n, rng=rng)

    def guidance(self, question: Question) -> tuple[str, ...]:
        """None: every fresh question gets K fresh rollouts."""
        return ()

    def values(
        self, buffer: ExperienceBuffer, uid: str, candidates: Sequence[Experience], scores: list[float]
    ) -> list[float]:
        """The policy's scores of the candidates (the trajectory rule's: mean entropy, NLL, none)."""
        return scores

    def members(
        self,
        candidates: Sequence[Experience],
        scores: Sequence[float],
        rng: np.random.Generator,
        group_size: int,
    ) -> Members:
        """One stored response (the trajectory rule's) beside K-1 fresh ones."""
        return Members((self.rule.pick(candidates, scores, rng),), group_size - 1)

    def importance_correction(self, configured: bool) -> bool:
        """replay.importance_correction as set: the stored log-probs (the "w/o IS" ablation: pi_old)."""
        return configured

    def advantages(self, batch: MixedBatch, scale_by_std: bool) -> Tensor:
        """A_i = r_i - mean(r of i's group), the replayed response in its question's group."""
        return group_advantages(batch.rewards, batch.group_index, scale_by_std)

    def loss(self, base: PolicyLoss, started: bool) -> PolicyLoss:
        """algo.loss's as it is: it already weighs replayed tokens by f(w)."""
        return base

    def observed(self, groups: Sequence[Group]) -> Sequence[Group]:
        """The groups as they are: a replayed question's k counts its replayed response."""
        return groups

    def enters(self, groups: Sequence[Group], bounds: Bounds | None) -> list[tuple[int, int]]:
        """The fresh correct responses of the groups with lbound < k <= rbound (none before the
        delayed start)."""
        return storable(groups, bounds)

    def recorded(
        self, buffer: ExperienceBuffer, groups: Sequence[Group], rows: Sequence[tuple[int, int]]
    ) -> None:
        """Nothing: ExGRPO remembers no more than the buffer holds."""

    def end_step(self, buffer: ExperienceBuffer, step: int, groups: Sequence[Group]) -> list[str]:
        """Retire the questions whose group was all correct this step."""
        return buffer.end_step()

    def carried(self, state: dict[str, Any]) -> dict[str, Any]:
        """Nothing: ExGRPO keeps no state beside the buffer."""
        return {}

    def replays(self, buffer: ExperienceBuffer) -> str | None:
        """A stored response of every question, and correct ones only: each replayed question
        brings one back, as a correct response (its f(w)-weighted positive advantage)."""
        return prompts_only(buffer) or (
            "it holds incorrect responses too (as replay.method=repo stores them), which this method "
            "would replay as correct ones"
            if buffer.holds_any
            else None
        )


def prompts_only(buffer: ExperienceBuffer) -> str | None:
    """Why a method that replays stored responses cannot take `buffer`: a question of it holds
    none (a buffer of prompts, as replay.method=prompt and prioritized write); None when each
    holds one."""
    for b in range(buffer.num_buckets):
        for i in range(buffer.bucket_sizes()[b]):
            uid = buffer.question_at(b, i)
            if not buffer.experiences(uid):
                return (
                    f"its question {uid[:60]!r} holds no stored response (a buffer of prompts, as "
                    "replay.method=prompt or prioritized writes), and this method replays stored responses"
                )
    return None
