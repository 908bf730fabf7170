"""The delayed start (docs/algorithm.md §5): on-policy until one step's rollouts are accurate enough.

A one-way switch: once the mean accuracy of a step's fresh rollouts reaches
`replay.start_threshold`, collection starts in that very step and replay from the next one.
`>=` rather than `>` so that threshold 0 means "no delay" (the paper's Llama-3.1-8B setting).
"""

from __future__ import annotations

from typing import Any


class DelayedStart:
    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.active = False
        self.started_at: int | None = None  # the step that flipped the switch

    def update(self, step: int, accuracy: float) -> bool:
        if not self.active and accuracy >= self.threshold:
            self.active = True
            self.started_at = step
        return self.active

    def state_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "active": self.active, "started_at": self.started_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.threshold = float(state["threshold"])
        self.active = bool(state["active"])
        self.started_at = state["started_at"]
