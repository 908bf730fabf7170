"""The rollout engine's log-probs against the trainer's: a loud stop instead of training on garbage.

Where it sits in the train step: inside the policy update, after the first mini-batch's forward
and before the step's first optimizer step (`UpdatePlan.before_first_step`). By then the trainer
has its own log-probs of every fresh row under the policy that sampled them (the engine was synced
to it at the end of the last step, or at start-up): the engine's log-probs of the same tokens must
match them up to kernel and dtype rounding. A broken weight sync (a corrupt reload after a sleep,
a CUDA graph that captured stale weights, a model runner that loads some tensors wrong) shows here
as a gap of tenths of a nat or more per token, while the trainer would go on optimising against
behaviour log-probs of another model. Past `rollout.max_logprob_diff` the run stops before the
update, on every rank alike (the gap is the run-wide mean over all ranks' fresh tokens), so the
checkpoints on disk stay those of the last healthy step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from exgrpo_cli.errors import ExgrpoError
from exgrpo_cli.policy.distributed import DistInfo, all_reduce_dict
from exgrpo_cli.replay.mixing import MixedBatch

FALLBACKS = (
    "rollout.enforce_eager=true (no CUDA graphs), rollout.sleep_mode=false (the engine keeps its "
    "weights through the update), VLLM_USE_V2_MODEL_RUNNER=0 (vLLM's V1 model runner)"
)


class EngineDivergence(ExgrpoError):
    """The rollout engine samples from other weights than the trainer's; nothing was updated."""


def fresh_gap(trainer_logp: Mapping[int, Sequence[float]], batch: MixedBatch) -> tuple[float, int]:
    """(sum of |trainer - engine| log-prob, tokens) over this rank's fresh rows that have both."""
    total, tokens = 0.0, 0
    for i, mine in trainer_logp.items():
        engine = batch.behavior_logp[i]
        if bool(batch.replay_mask[i]) or not engine:
            continue
        total += float(np.abs(np.subtract(mine, engine)).sum())
        tokens += len(engine)
    return total, tokens


def check_engine_logprobs(
    trainer_logp: Mapping[int, Sequence[float]],
    batch: MixedBatch,
    *,
    limit: float,
    step: int,
    dist: DistInfo,
) -> float:
    """The run-wide mean |trainer - engine| log-prob per fresh token; raises EngineDivergence past
    `limit`. A collective under torchrun: every rank calls it and takes the same decision."""
    total, tokens = fresh_gap(trainer_logp, batch)
    t = all_reduce_dict({"gap": total, "tokens": float(tokens)}, dist, op="sum")
    gap = t["gap"] / t["tokens"] if t["tokens"] else 0.0
    if not gap <= limit:  # NaN too
        raise EngineDivergence(
            f"step {step}: the rollout engine's log-probs are {gap:.4g} nats per token from the "
            f"trainer's (mean |difference| over {int(t['tokens'])} fresh tokens, "
            f"rollout.max_logprob_diff={limit:g}): the engine is not sampling from the trainer's "
            "weights (a broken weight sync). The run stopped before this step's update; the "
            f"checkpoints are untouched. Fallbacks: {FALLBACKS}; or rollout.engine=hf. "
            "rollout.max_logprob_diff=null turns the check off."
        )
    return gap


def nucleus_slack(top_p: float) -> float:
    """How far a healthy engine's log-prob of a token can be from the trainer's under top-p
    sampling: vLLM returns log-probs renormalised over the nucleus (mass >= top_p), the trainer
    over the whole vocabulary, so each token's gap is at most -log(top_p) (0 at top_p = 1)."""
    return -math.log(top_p) if 0.0 < top_p < 1.0 else 0.0


def engine_check(
    limit: float | None, step: int, dist: DistInfo, top_p: float = 1.0
) -> Callable[[Mapping[int, Sequence[float]], MixedBatch], object] | None:
    """The update's `before_first_step` hook for `rollout.max_logprob_diff` (None: no check).
    Under top-p sampling the limit grows by `nucleus_slack(top_p)`: a healthy vLLM engine is
    that far from the trainer by construction, and a broken sync is still many nats away."""
    if limit is None:
        return None
    bound = limit + nucleus_slack(top_p)
    return lambda logp, batch: check_engine_logprobs(logp, batch, limit=bound, step=step, dist=dist)
