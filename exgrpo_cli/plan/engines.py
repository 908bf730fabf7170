"""The memory model of each rollout engine, by its `rollout.engine` name: what the plan reads of it.

Where it sits: plan/inputs.py picks the config's entry into `PlanInputs.engine`; plan/memory.py
adds its terms. The engines themselves (rollout.ENGINES: how each is built, what it can do) import
nothing of the plan, and the plan nothing of them: the two tables share their names, and
tests/plan/test_engines.py checks that they list the same engines and agree on what both say
(whether the engine samples from the trainer's own module).
"""

from __future__ import annotations

from exgrpo_cli.plan.memory import hf_rollout_terms, vllm_terms
from exgrpo_cli.plan.settings import EngineMemory

# `rollout.engine`: name -> its memory model
ENGINE_MEMORY: dict[str, EngineMemory] = {
    "hf": EngineMemory("HF-engine", needs_trainer_model=True, memory=hf_rollout_terms),
    "vllm": EngineMemory("vLLM", needs_trainer_model=False, memory=vllm_terms),
}
