"""Rollout engines: sample K responses per prompt with their token ids and log-probs.

Where it sits in the step: after the fresh questions are drawn and the replayed ones chosen,
before the reward. `ENGINES` (the `rollout.engine` names) says how each engine is built and what it
can do (the memory plan's model of each is plan/engines.py, under the same names); `build_engine`
builds the one the config names. The engines' modules (and vLLM) are imported only when an engine
is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exgrpo_cli.rollout.base import Rollout, RolloutEngine, SamplingSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from exgrpo_cli.config.schema import ExgrpoConfig

__all__ = ["ENGINES", "EngineSpec", "Rollout", "RolloutEngine", "SamplingSpec", "build_engine"]


@dataclass(frozen=True)
class EngineSpec:
    # (config, the trainer's model or None, tokenizer) -> engine
    build: Callable[[ExgrpoConfig, PreTrainedModel | None, PreTrainedTokenizerBase], RolloutEngine]
    needs_trainer_model: bool  # samples from an HF module in this process (eval must load one)
    supports_greedy: bool  # accepts temperature 0 (else a tiny temperature stands in for greedy)
    # closing it under several ranks tears down the ranks' process group (vLLM's in-process
    # shutdown under external_launcher), so such a run can build only one engine per process
    one_per_ranked_process: bool = False


def _build_hf(
    cfg: ExgrpoConfig, model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase
) -> RolloutEngine:
    from exgrpo_cli.rollout.hf import HFEngine

    if model is None:
        raise ValueError("rollout.engine=hf samples from the trainer's own model: pass it")
    longest = max(cfg.model.max_response_tokens, cfg.eval.max_new_tokens)
    return HFEngine(model, tokenizer, max_new_tokens=longest)


def _build_vllm(
    cfg: ExgrpoConfig, model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase
) -> RolloutEngine:
    from exgrpo_cli.rollout.vllm_engine import VLLMEngine

    # with the trainer's model, vLLM starts from its weights (resumed, GGUF, sharded) at once
    return VLLMEngine.from_config(cfg, tokenizer, model=model)


# `rollout.engine`: name -> how to build it, what it can do
ENGINES: dict[str, EngineSpec] = {
    "hf": EngineSpec(_build_hf, needs_trainer_model=True, supports_greedy=False),
    "vllm": EngineSpec(
        _build_vllm, needs_trainer_model=False, supports_greedy=True, one_per_ranked_process=True
    ),
}


def build_engine(
    cfg: ExgrpoConfig, model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase
) -> RolloutEngine:
    from exgrpo_cli.config.registry import pick

    return pick(ENGINES, "rollout.engine", cfg.rollout.engine).build(cfg, model, tokenizer)
