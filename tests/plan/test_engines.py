"""plan/engines.py: the memory plan models every rollout engine, and agrees with rollout.ENGINES."""

from __future__ import annotations

from exgrpo_cli.plan.engines import ENGINE_MEMORY
from exgrpo_cli.rollout import ENGINES


def test_every_engine_has_a_memory_model_that_agrees_with_it() -> None:
    assert set(ENGINE_MEMORY) == set(ENGINES)
    for name, engine in ENGINES.items():
        assert ENGINE_MEMORY[name].needs_trainer_model == engine.needs_trainer_model, name
