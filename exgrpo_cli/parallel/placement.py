"""Where the training state lives (`trainer.offload`): one table. The name is looked up once, where
a run is built (run/setup.py, the start-up refusal of run/training.py, the plan's inputs), and the
`Offload` found is what every part that depends on the mode receives (FSDP2's placement, the
optimizer, the offline memory plan) instead of the name. Plain data, no torch: the plan reads it
without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Offload:
    name: str  # its trainer.offload value
    label: str  # how the memory plan's settings line says it
    # FSDP2's CPU offload: weights, gradients and the optimizer step in host memory, each layer
    # copied to the compute device for its forward and backward (a sharded model only)
    params_on_host: bool
    moments_on_host: bool  # AdamW's two moments in host memory (by FSDP2, or by HostAdamW)
    host_adamw: bool = False  # parallel/offload.HostAdamW: one parameter's moments on the device at a time


# `trainer.offload`: name -> where the state lives, from the least to the most offloaded (the
# memory plan suggests the modes after a run's own, in this order)
OFFLOAD_MODES: dict[str, Offload] = {
    m.name: m
    for m in (
        Offload("none", "no offload", params_on_host=False, moments_on_host=False),
        Offload("optimizer", "AdamW offloaded to the host", False, moments_on_host=True, host_adamw=True),
        Offload("all", "state offloaded to the host", params_on_host=True, moments_on_host=True),
    )
}
NO_OFFLOAD = OFFLOAD_MODES["none"]
