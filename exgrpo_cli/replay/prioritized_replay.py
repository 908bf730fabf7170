"""`replay.method=prioritized`: problem-level prioritized replay (Fatemi, arXiv 2601.02648): the
problems with the largest p(1-p) are replayed, as prompts with K fresh responses.

Place in the train step: its hooks (replay/methods.py) replace ExGRPO's where the paper differs.
The paper's priority of a problem is the mean squared group advantage of its last K responses,
p(1-p) for 0/1 rewards with p the success rate: zero for a problem always solved or never solved
(no gradient under GRPO), largest at p = 1/2.
- What enters the buffer: a partly solved problem, in the bucket of its latest p, with no
  response stored (as `prompt`); its priority is p(1-p) of that bucket's centre (k/K with the
  default edges).
- Which problems: the n of highest priority (a heap's top n, as the paper samples), ties by
  bucket, then the bucket's slot order; how many: n_replay, as ExGRPO's. The group: K fresh
  responses, so every token stays on-policy.
- What leaves: a replayed problem whose group is now all wrong (p = 0, priority 0) leaves the
  buffer, and one all right (p = 1) retires, as ExGRPO's; neither is lost for good: the retest
  rule. An unsolved problem stays in fresh sampling, so each epoch retests it; every
  `replay.prioritized.retest_every` steps a `retest_fraction` of the solved (retired) problems
  go back into fresh sampling.
The paper gives the priority and names the heap and the periodic retests; their schedule and the
defaults (every 10 steps, 10% of the solved) are ours (docs/algorithm.md §9).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from exgrpo_cli.replay.prompt_replay import PromptReplay

if TYPE_CHECKING:
    from exgrpo_cli.replay.buffer import ExperienceBuffer
    from exgrpo_cli.replay.mixing import Group

RETEST_PURPOSE = 7  # the retest draw's generator: (seed, step, 7), apart from the step's others


def priority(p: float) -> float:
    """The mean squared advantage of a group with success rate p under 0/1 rewards: p(1-p)."""
    return p * (1.0 - p)


class PrioritizedReplay(PromptReplay):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.seed = int(cfg.trainer.seed)
        self.retest_every = int(cfg.replay.prioritized.retest_every)
        self.retest_fraction = float(cfg.replay.prioritized.retest_fraction)

    def questions(self, buffer: ExperienceBuffer, n: int, rng: np.random.Generator, step: int) -> list[str]:
        centres = buffer.bucket_centres()
        ranked = (
            (-priority(centres[b]), b, i, buffer.question_at(b, i))
            for b, size in enumerate(buffer.bucket_sizes())
            for i in range(size)
        )
        return [uid for *_, uid in heapq.nsmallest(max(n, 0), ranked)]

    def end_step(self, buffer: ExperienceBuffer, step: int, groups: Sequence[Group]) -> list[str]:
        retired = buffer.end_step()
        for g in groups:  # replayed and now never solved: priority 0
            if g.from_buffer and g.num_correct == 0 and g.question.uid in buffer:
                buffer.discard(g.question.uid)
        if self.retest_every and step % self.retest_every == 0 and self.retest_fraction > 0:
            buffer.readmit(self.retest_fraction, np.random.default_rng([self.seed, step, RETEST_PURPOSE]))
        return retired
