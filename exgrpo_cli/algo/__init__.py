"""Pure tensor maths of the objective: advantages, token log-probs and entropies, the ExGRPO loss
and how token losses add up to the objective.

Where it sits in the step: after the mixed batch is built (replay/mixing.py) and before the
optimizer step. Nothing here holds state; only the `POLICY_LOSSES` entries read the config (each
its own settings). Every function is tested with exact values. These are also the public API for
people who want the ExGRPO objective in their own trainer, and the very functions exgrpo's own
update calls.
"""

from exgrpo_cli.algo.advantages import group_advantages
from exgrpo_cli.algo.aggregation import (
    AGGREGATIONS,
    AggregationSettings,
    Normalisers,
    UpdateShape,
    entropy_norms,
    objective,
)
from exgrpo_cli.algo.logprobs import chunked_token_logprobs, masked_mean, token_entropy, token_logprobs
from exgrpo_cli.algo.losses import (
    POLICY_LOSSES,
    ExgrpoLoss,
    LossInputs,
    LossStats,
    behaviour_logprobs,
    exgrpo_token_losses,
    policy_shaping,
)

__all__ = [
    "AGGREGATIONS",
    "AggregationSettings",
    "POLICY_LOSSES",
    "ExgrpoLoss",
    "LossInputs",
    "LossStats",
    "Normalisers",
    "UpdateShape",
    "behaviour_logprobs",
    "chunked_token_logprobs",
    "entropy_norms",
    "exgrpo_token_losses",
    "group_advantages",
    "masked_mean",
    "objective",
    "policy_shaping",
    "token_entropy",
    "token_logprobs",
]
