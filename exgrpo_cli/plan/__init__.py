"""The memory plan: how much each device needs at each moment of a step, before any weights load.

`arch` finds the model's architecture without its weights (config.json, the Hugging Face cache,
or the numbers a preset carries); `inputs` turns the config and the devices (planned with
`trainer.plan_devices`, or visible) into the plan's inputs; `activations` gives what a token costs
(activations, the log-prob chunk, the KV cache); `memory` holds the arithmetic, one documented
term at a time; `fixes` searches the runtime settings that make a plan fit; `report` prints the
table and refuses a run that would not fit (exit 2). `commands/train.py` calls it.
"""

from __future__ import annotations

from exgrpo_cli.plan.arch import Arch, ArchitectureUnavailable, resolve_architecture
from exgrpo_cli.plan.inputs import Devices, planned_devices, visible_devices
from exgrpo_cli.plan.memory import Plan, PlanInputs, plan_memory
from exgrpo_cli.plan.report import PlanDoesNotFit, check_memory

__all__ = [
    "Arch",
    "ArchitectureUnavailable",
    "Devices",
    "Plan",
    "PlanDoesNotFit",
    "PlanInputs",
    "check_memory",
    "plan_memory",
    "planned_devices",
    "resolve_architecture",
    "visible_devices",
]
