"""Where the training state lives (`trainer.offload`): one table, read by every part that depends
on the mode (FSDP2's placement, the optimizer, the start-up refusal, the offline memory plan)
instead of comparing its name. Plain data, no torch: the plan reads it without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Offload:
    label: str  # how the memory plan's settings line says it
    # FSDP2's CPU offload: weights, gradients and the optimizer step in host memory, each layer
    # copied to the compute device for its forward and backward (a sharded model only)
    params_on_host: bool
    moments_on_host: bool  # AdamW's two moments in host memory (by FSDP2, or by HostAdamW)
    host_adamw: bool = False  # policy/offload.HostAdamW: one parameter's moments on the device at a time


# `trainer.offload`: name -> where the state lives, from the least to the most offloaded (the
# memory plan suggests the modes after a run's own, in this order)
OFFLOAD_MODES: dict[str, Offload] = {
    "none": Offload("no offload", params_on_host=False, moments_on_host=False),
    "optimizer": Offload("AdamW offloaded to the host", False, moments_on_host=True, host_adamw=True),
    "all": Offload("state offloaded to the host", params_on_host=True, moments_on_host=True),
}
