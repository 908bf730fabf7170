"""Fresh-question sampling: an epoch-wise shuffled pass over the training pool.

Where it sits in the step: after replay selection, the step draws its fresh questions here, by the
rule `data.draw` names (`FRESH_DRAWS`):
- `needed` (the default): only the B - n_replay fresh questions the step uses, so no question is
  drawn and dropped, and a run covers its pool in fewer epochs;
- `batch` (the official trainer, used by the paper recipes): the step's full B questions, from one
  epoch (a DataLoader with drop_last), of which it uses the first B - n_replay and drops the rest
  (the official experience_collate_fn); 700 steps of 128 then pass over OpenR1-Math-46k about twice.
Retired questions (all K responses correct, docs/algorithm.md) leave the pool from the next epoch
on. The position, the epoch and the epoch's order are state, checkpointed with the run, so a
resumed run draws exactly the questions the uninterrupted one would have drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

import numpy as np

from exgrpo_cli.data.types import Question
from exgrpo_cli.errors import ExgrpoError, UsageError


def check_pool_size(usable: int, per_step: int) -> None:
    """Refuse a training set smaller than one step's fresh questions (a usage error): a smaller
    pool would put one question into a step twice. The trainer calls it before any weights load;
    the sampler again at each epoch."""
    if usable < per_step:
        raise UsageError(
            f"the training set has {usable} usable questions, fewer than the {per_step} "
            "fresh questions a step draws: lower algo.questions_per_step or use more data"
        )


class QuestionSampler:
    def __init__(self, questions: list[Question], seed: int) -> None:
        if not questions:
            raise ValueError("the training set has no usable questions")
        self.questions = questions
        self.seed = seed
        self.epoch = -1
        self.position = 0
        self.order: list[int] = []

    def _start_epoch(self, retired: Container[str], n: int) -> None:
        self.epoch += 1
        self.position = 0
        rng = np.random.default_rng([self.seed, self.epoch])
        keep = [i for i, q in enumerate(self.questions) if q.uid not in retired]
        check_pool_size(len(self.questions), n)
        if len(keep) < n:
            raise ExgrpoError(
                f"only {len(keep)} of the {len(self.questions)} training questions are not retired "
                f"(solved K/K), fewer than the {n} fresh questions a step needs: use a larger "
                "training set, fewer trainer.steps, or replay.readmit_retired_fraction > 0"
            )
        self.order = [keep[i] for i in rng.permutation(len(keep))]

    def draw(self, n: int, retired: Container[str] = ()) -> list[Question]:
        out: list[Question] = []
        while len(out) < n:
            if self.position >= len(self.order):
                self._start_epoch(retired, n)
            out.append(self.questions[self.order[self.position]])
            self.position += 1
        return out

    def draw_batch(self, n: int, retired: Container[str] = ()) -> list[Question]:
        """`n` questions from one epoch: when fewer are left in this one, they are skipped and the
        next epoch starts (the official DataLoader's drop_last)."""
        if self.position + n > len(self.order):
            self._start_epoch(retired, n)
        out = [self.questions[i] for i in self.order[self.position : self.position + n]]
        self.position += n
        return out

    @property
    def epoch_questions(self) -> int:
        """The questions of the current epoch: the pool less the questions retired at its start."""
        return len(self.order)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "order": list(self.order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.order = [int(i) for i in state["order"]]


def draw_needed(
    sampler: QuestionSampler, fresh: int, per_step: int, retired: Container[str]
) -> list[Question]:
    """`data.draw=needed`: only the step's fresh questions."""
    return sampler.draw(fresh, retired)


def draw_whole_batch(
    sampler: QuestionSampler, fresh: int, per_step: int, retired: Container[str]
) -> list[Question]:
    """`data.draw=batch`: the step's full question count, of which the first `fresh` are used."""
    return sampler.draw_batch(per_step, retired)[:fresh]


# `data.draw`: name -> (sampler, fresh questions the step uses, questions per step, retired) -> them
FreshDraw = Callable[[QuestionSampler, int, int, Container[str]], list[Question]]
FRESH_DRAWS: dict[str, FreshDraw] = {"needed": draw_needed, "batch": draw_whole_batch}
