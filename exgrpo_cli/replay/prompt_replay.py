"""`replay.method=prompt`: Prompt Replay (Baroian & Berger, arXiv 2603.21177), reuse prompts, not
responses, so that every token trained on stays on-policy.

Place in the train step: its hooks (replay/methods.py) replace ExGRPO's where the paper differs.
- What enters the buffer: a question whose group was partly solved (lbound < k <= rbound, as
  ExGRPO's) enters its accuracy bucket with no response stored (`keeps_prompts`, `enters` = none).
- Which questions: those not cooling down (replayed within the last `replay.prompt.cooldown`
  steps), the ones whose latest pass rate is closest to 0.5 first (the paper prioritises prompts
  near 0.5, where the group advantage is largest); how many: n_replay, as ExGRPO's.
- The group: no stored response, K fresh ones: a replayed prompt trains as a fresh question.
- The loss: algo.loss's, unchanged (there is no replayed row in the batch).
- What leaves: a question replayed `replay.prompt.max_reuse` times leaves the buffer after the
  step (it stays in fresh sampling); K/K groups retire it, as ExGRPO's. replay.max_age, which
  ages stored responses, is refused (a prompt stores none).
What a prompt remembers (its reuse count, the step it was last replayed) is the buffer's
`method_state`, saved and digested with it. The ordering rule, the ties and the defaults of
cooldown and max_reuse are ours (docs/algorithm.md §9): the paper names the knobs, not one rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from exgrpo_cli.algo.logprobs import CandidateScore
from exgrpo_cli.config.schema import ConfigError
from exgrpo_cli.replay.bucketing import Bounds
from exgrpo_cli.replay.experience import Experience
from exgrpo_cli.replay.methods import ExgrpoReplay, Members

if TYPE_CHECKING:
    from exgrpo_cli.replay.buffer import ExperienceBuffer
    from exgrpo_cli.replay.mixing import Group


class PromptReplay(ExgrpoReplay):
    keeps_prompts = True

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.score: CandidateScore | None = None  # no stored response to score
        self.cooldown = int(cfg.replay.prompt.cooldown)
        self.max_reuse = int(cfg.replay.prompt.max_reuse)
        if int(cfg.replay.max_age):
            # max_age ages stored responses (their collection step): a prompt holds none, so it
            # would never leave; the reuse rules bound a prompt's life here
            raise ConfigError(
                f"invalid replay.max_age={cfg.replay.max_age} with replay.method={cfg.replay.method}: it "
                "ages stored responses and this method stores none (use replay.prompt.max_reuse and "
                "replay.prompt.cooldown, or replay.max_age=0)"
            )

    @staticmethod
    def _state(buffer: ExperienceBuffer) -> tuple[dict[str, int], dict[str, int]]:
        """(uid -> times replayed, uid -> the step it was last replayed), in `buffer.method_state`."""
        st = buffer.method_state
        return st.setdefault("reuse", {}), st.setdefault("last_replayed", {})

    def questions(self, buffer: ExperienceBuffer, n: int, rng: np.random.Generator, step: int) -> list[str]:
        reuse, last = self._state(buffer)
        centres = buffer.bucket_centres()
        ready = [
            (abs(centres[b] - 0.5), b, i, uid)
            for b, size in enumerate(buffer.bucket_sizes())
            for i in range(size)
            if (uid := buffer.question_at(b, i)) not in last or step - last[uid] > self.cooldown
        ]
        # nearest to 0.5 first; ties by bucket, then by the bucket's slot order (deterministic, not
        # arrival: a question leaving a bucket hands its slot to the bucket's last one)
        chosen = [uid for *_, uid in sorted(ready)[: max(n, 0)]]
        for uid in chosen:
            reuse[uid] = reuse.get(uid, 0) + 1
            last[uid] = step
        return chosen

    def members(
        self,
        candidates: Sequence[Experience],
        scores: Sequence[float],
        rng: np.random.Generator,
        group_size: int,
    ) -> Members:
        return Members((), group_size)

    def enters(self, groups: Sequence[Group], bounds: Bounds | None) -> list[tuple[int, int]]:
        return []

    def replays(self, buffer: ExperienceBuffer) -> str | None:
        """Any buffer: its questions are replayed as prompts, whatever they store."""
        return None

    def end_step(self, buffer: ExperienceBuffer, step: int, groups: Sequence[Group]) -> list[str]:
        retired = buffer.end_step()
        reuse, last = self._state(buffer)
        for uid in [u for u, times in reuse.items() if times >= self.max_reuse and u in buffer]:
            buffer.discard(uid)
        for uid in [u for u in reuse if u not in buffer]:  # retired or gone: forget it
            del reuse[uid]
            last.pop(uid, None)
        return retired
