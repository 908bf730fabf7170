"""What every stage of a train step (train/loop.py) derives from: its random generators, one per
(seed, step, purpose) so that a resumed run repeats a step exactly, and its timers (the step's
`timing/<stage>` metrics)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


def step_rng(seed: int, step: int, purpose: int) -> np.random.Generator:
    """An independent generator per (seed, step, purpose): no RNG state to carry across steps."""
    return np.random.default_rng([seed, step, purpose])


class Timers(dict[str, float]):
    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self[f"timing/{name}"] = self.get(f"timing/{name}", 0.0) + time.perf_counter() - t0
