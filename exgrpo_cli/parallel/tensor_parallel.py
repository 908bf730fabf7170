"""vLLM's tensor-parallel groups under torchrun: the ranks that share one engine.

Where it sits: built once with the vLLM engine (rollout/vllm_launch.py, from the trainer's process
group), used at every generation and weight check of a group of `tp` > 1 ranks: each rank of a
group submits every rank's requests to their one engine (`gather`), then keeps its own outputs.
Beside parallel/sharding.py, which owns what all the ranks exchange; this owns the subgroups.
"""

from __future__ import annotations

from typing import Any


class TensorParallelGroup:
    """This rank's group of `tp` consecutive ranks out of `world` (ranks 0..tp-1, tp..2tp-1, ...)."""

    def __init__(self, world: int, tp: int) -> None:
        import torch.distributed as tdist

        # collective: every rank makes every group; this rank keeps its own
        groups = [list(range(start, start + tp)) for start in range(0, world, tp)]
        self._group, _ = tdist.new_subgroups_by_enumeration(groups)

    def gather(self, obj: Any) -> tuple[list[Any], int]:
        """Every group member's `obj`, in group order, and this rank's index in the group."""
        import torch.distributed as tdist

        parts: list[Any] = [None] * tdist.get_world_size(self._group)
        tdist.all_gather_object(parts, obj, group=self._group)
        return parts, tdist.get_rank(self._group)
