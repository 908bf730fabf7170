"""`replay.method=repo`: RePO, Replay-Enhanced Policy Optimization (Li et al., arXiv 2506.09340;
the authors' code: SihengLi99/RePO, TRL-based). Past responses of a question, right or wrong, are
kept with their rewards and log-probs; a replayed question's group gets some of them back as
off-policy samples beside its fresh ones, and J = J_on-policy + J_off-policy.

Place in the train step: its hooks (replay/methods.py) replace ExGRPO's where RePO differs.
- What enters the buffer: every fresh response (`stores_any`: incorrect ones too) of the groups
  the buffer collects, with the trainer's log-probs; `recorded` keeps each stored response's reward
  in `buffer.method_state["reward"]` (question -> content hash -> reward).
- Which questions, how many: the buffered questions holding at least `replay.repo.min_stored`
  responses (RePO's min_cache_to_replay, 16), n_replay = min(floor(rho B), those) of them,
  uniformly.
- Which responses (`replay.repo.strategy`, RePO's retrieval strategies): `reward`, the highest
  stored reward first (its reward-oriented highest_k, ties oldest first as its stable sort keeps
  them); `recency`, the newest first (its recent_k); `random` (its random_k); the first
  `replay.repo.replayed` (RePO: 8), or all when fewer are stored, beside K fresh rollouts.
- Advantages: split, as RePO's default `adv_norm_mode=split`: the fresh responses are centred over
  the K fresh ones, the off-policy ones over the off-policy ones of their question
  (`algo.scale_by_std` applies to both).
- The loss: fresh tokens by algo.loss's rule (the on-policy term); replayed tokens by the clipped
  importance ratio against their stored log-probs, max(-A w, -A clip(w, 1 - eps, 1 + eps)) with
  eps = `replay.repo.clip_eps` (RePO: 0.2), no f(w) shaping (the off-policy term, weight 1 as
  RePO's off_policy_loss_coef). Both terms go through the step's one aggregation.
- What the buffer counts: a replayed question's k is over its K fresh responses (`observed`).
- What leaves: ExGRPO's rules (K/K retirement, replay.max_age, replay.max_experiences).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from exgrpo_cli.algo.advantages import group_advantages
from exgrpo_cli.algo.losses import LossInputs, PolicyLoss, exgrpo_token_losses
from exgrpo_cli.replay.bucketing import Bounds
from exgrpo_cli.replay.experience import Experience, content_hash
from exgrpo_cli.replay.methods import ExgrpoReplay, Members, fresh_view, on_replayed_rows, prompts_only
from exgrpo_cli.replay.selection import n_replay

if TYPE_CHECKING:
    from exgrpo_cli.replay.buffer import ExperienceBuffer
    from exgrpo_cli.replay.mixing import Group, MixedBatch


def split_advantages(batch: MixedBatch, scale_by_std: bool) -> Tensor:
    """RePO's split estimation: a question's fresh rows form one group and its replayed rows
    another (group g's replayed rows are group g + G, G the batch's groups)."""
    num_groups = int(batch.group_index.max()) + 1 if len(batch) else 0
    index = batch.group_index + num_groups * batch.replay_mask.long()
    return group_advantages(batch.rewards, index, scale_by_std)


def clipped_offpolicy_loss(base: PolicyLoss, clip_eps: float) -> PolicyLoss:
    """The on-policy term from `base` on fresh rows; on replayed rows the PPO-clipped ratio
    w = pi_theta / pi_stored, max(-A w, -A clip(w, 1 - eps, 1 + eps))."""

    def clipped(x: LossInputs) -> Tensor:
        unshaped = torch.zeros_like(x.replay_mask)  # every row under the clip rule, here
        args = (x.logp, x.behaviour_logp, x.advantages, x.response_mask, unshaped)
        return exgrpo_token_losses(*args, clip_eps=clip_eps, beta=None)[0]

    return on_replayed_rows(base, clipped)


class RepoReplay(ExgrpoReplay):
    stores_any = True

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        r = cfg.replay.repo
        self.strategy, self.replayed = str(r.strategy), int(r.replayed)
        self.min_stored, self.clip_eps = int(r.min_stored), float(r.clip_eps)
        self.score = None  # retrieval reads the stored rewards or ages, not the policy

    def _ready(self, buffer: ExperienceBuffer) -> list[str]:
        return [
            uid
            for b, size in enumerate(buffer.bucket_sizes())
            for i in range(size)
            if len(buffer.experiences(uid := buffer.question_at(b, i))) >= self.min_stored
        ]

    def how_many(self, buffer: ExperienceBuffer) -> int:
        return n_replay(self.ratio, self.batch_questions, len(self._ready(buffer)))

    def questions(self, buffer: ExperienceBuffer, n: int, rng: np.random.Generator, step: int) -> list[str]:
        ready = self._ready(buffer)
        n = min(n, len(ready))
        return [ready[i] for i in rng.choice(len(ready), size=n, replace=False).tolist()] if n > 0 else []

    def values(
        self, buffer: ExperienceBuffer, uid: str, candidates: Sequence[Experience], scores: list[float]
    ) -> list[float]:
        """Each candidate's stored reward (`reward`); the others rank by age or at random."""
        if self.strategy != "reward":
            return []
        rewards = buffer.method_state.get("reward", {}).get(uid, {})
        return [float(rewards[_key(e.response_ids)]) for e in candidates]

    def members(
        self,
        candidates: Sequence[Experience],
        scores: Sequence[float],
        rng: np.random.Generator,
        group_size: int,
    ) -> Members:
        n, m = len(candidates), min(self.replayed, len(candidates))
        if self.strategy == "reward":  # highest first; a stable sort keeps equal ones oldest first
            picks = sorted(range(n), key=lambda i: -scores[i])[:m]
        elif self.strategy == "recency":  # candidates come oldest first
            picks = list(range(n - 1, n - 1 - m, -1))
        else:
            picks = rng.choice(n, size=m, replace=False).tolist()
        return Members(tuple(int(i) for i in picks), group_size)

    def advantages(self, batch: MixedBatch, scale_by_std: bool) -> Tensor:
        return split_advantages(batch, scale_by_std)

    def loss(self, base: PolicyLoss, started: bool) -> PolicyLoss:
        return clipped_offpolicy_loss(base, self.clip_eps)

    def observed(self, groups: Sequence[Group]) -> Sequence[Group]:
        return fresh_view(groups)  # k over the K fresh: the retrieved ones would push it above K

    def enters(self, groups: Sequence[Group], bounds: Bounds | None) -> list[tuple[int, int]]:
        """Every fresh response of the groups the buffer collects, right or wrong."""
        if bounds is None:
            return []
        return [
            (gi, ri)
            for gi, g in enumerate(groups)
            if bounds[0] < g.num_correct <= bounds[1]
            for ri, r in enumerate(g.responses)
            if not r.replayed
        ]

    def recorded(
        self, buffer: ExperienceBuffer, groups: Sequence[Group], rows: Sequence[tuple[int, int]]
    ) -> None:
        """The reward of every response stored this step, by question and content; a touched
        question's record is cut to what it still stores (the buffer drops duplicates and old ones)."""
        record: dict[str, dict[str, float]] = buffer.method_state.setdefault("reward", {})
        for gi, ri in rows:
            uid = groups[gi].question.uid
            r = groups[gi].responses[ri]
            record.setdefault(uid, {})[_key(np.asarray(r.ids, dtype=np.int32))] = float(r.reward)
        for uid in {groups[gi].question.uid for gi, _ in rows}:
            if uid in buffer:
                held = {_key(e.response_ids) for e in buffer.experiences(uid)}
                record[uid] = {h: v for h, v in record[uid].items() if h in held}

    def carried(self, state: dict[str, Any]) -> dict[str, Any]:
        """The stored responses' rewards, which `reward` retrieval ranks by."""
        return {"reward": state["reward"]} if "reward" in state else {}

    def replays(self, buffer: ExperienceBuffer) -> str | None:
        """Stored responses with their rewards (written by a repo run): a buffer of prompts has no
        response, one of another method no reward record."""
        reason = prompts_only(buffer)
        if reason or self.strategy != "reward":
            return reason
        record = buffer.method_state.get("reward", {})
        for b in range(buffer.num_buckets):
            for i in range(buffer.bucket_sizes()[b]):
                uid = buffer.question_at(b, i)
                if any(_key(e.response_ids) not in record.get(uid, {}) for e in buffer.experiences(uid)):
                    return (
                        f"a stored response of its question {uid[:60]!r} has no recorded reward (the "
                        "buffer of a run without replay.method=repo), which replay.repo.strategy=reward "
                        "ranks by"
                    )
        return None

    def end_step(self, buffer: ExperienceBuffer, step: int, groups: Sequence[Group]) -> list[str]:
        retired = buffer.end_step()
        record = buffer.method_state.get("reward", {})
        for uid in [u for u in record if u not in buffer]:  # retired, expired or evicted
            del record[uid]
        return retired


def _key(ids: np.ndarray) -> str:
    """A stored response's key in the reward record: its content hash (the buffer's own), as text."""
    return str(content_hash(np.ascontiguousarray(ids, dtype=np.int32)))
