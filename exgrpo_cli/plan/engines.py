"""The memory model of each rollout engine, by its `rollout.engine` name: what the plan reads of it.

Where it sits: plan/inputs.py picks the config's entry into `PlanInputs.engine`; plan/memory.py
adds its terms. The engines themselves (rollout.ENGINES: how each is built, what it can do) import
nothing of the plan, and the plan nothing of them: the two tables share their names, and
tests/plan/test_engines.py checks that they list the same engines and agree on what both say
(whether the engine samples from the trainer's own module).
"""

from __future__ import annotations

from dataclasses import dataclass

from exgrpo_cli.plan.memory import EngineTerms, hf_rollout_terms, vllm_terms


@dataclass(frozen=True)
class EngineMemory:
    """One engine as the plan sees it (plan.memory.EngineModel)."""

    label: str  # its name in the plan's table and notes
    needs_trainer_model: bool  # the trainer's own module generates: no weights or KV cache of its own
    memory: EngineTerms  # its own terms, problems and notes


# `rollout.engine`: name -> its memory model
ENGINE_MEMORY: dict[str, EngineMemory] = {
    "hf": EngineMemory("HF-engine", needs_trainer_model=True, memory=hf_rollout_terms),
    "vllm": EngineMemory("vLLM", needs_trainer_model=False, memory=vllm_terms),
}
