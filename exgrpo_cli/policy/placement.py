"""Where the training state lives (`trainer.offload`): the modes' one table, read by every part
that depends on the mode instead of comparing its name.

Where it sits: read when the trainer is built (FSDP2's placement in policy/distributed.py, the
optimizer of train/setup.py, the refusal of train/run.py) and by the offline memory plan (plan/);
plain data, no torch, so that a plan never imports it. The host-memory AdamW is policy/offload.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Offload:
    label: str  # how the memory plan's settings line says it
    # FSDP2's CPU offload: weights, gradients and the optimizer step in host memory, each layer
    # copied to the compute device for its forward and backward (a sharded model only)
    params_on_host: bool
    # AdamW's two moments in host memory: by FSDP2 with params_on_host, else by HostAdamW, which
    # brings one parameter's moments to the device for its update
    moments_on_host: bool

    @property
    def host_adamw(self) -> bool:
        return self.moments_on_host and not self.params_on_host


# `trainer.offload`: name -> where the state lives, from the least to the most offloaded (the
# memory plan suggests the modes after a run's own, in this order)
OFFLOAD_MODES: dict[str, Offload] = {
    "none": Offload("no offload", params_on_host=False, moments_on_host=False),
    "optimizer": Offload("AdamW offloaded to the host", params_on_host=False, moments_on_host=True),
    "all": Offload("state offloaded to the host", params_on_host=True, moments_on_host=True),
}
