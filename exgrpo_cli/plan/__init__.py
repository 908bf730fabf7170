"""The memory plan: how much each device needs at each moment of a step, before any weights load.

`arch` finds the model's architecture without its weights (config.json, the Hugging Face cache,
or the numbers a preset carries).
"""

from __future__ import annotations

from exgrpo_cli.plan.arch import Arch, ArchitectureUnavailable, resolve_architecture

__all__ = ["Arch", "ArchitectureUnavailable", "resolve_architecture"]
