"""Rollout engines: sample K responses per prompt with their token ids and log-probs.

Where it sits in the step: after the fresh questions are drawn and the replayed ones chosen,
before the reward. `build_engine` picks the implementation named by `rollout.engine`.
"""

from exgrpo_cli.rollout.base import Rollout, RolloutEngine, SamplingSpec

__all__ = ["Rollout", "RolloutEngine", "SamplingSpec", "build_engine"]


def build_engine(cfg, model, tokenizer) -> RolloutEngine:  # noqa: ANN001 - ExgrpoConfig, HF objects
    if cfg.rollout.engine == "hf":
        from exgrpo_cli.rollout.hf import HFEngine

        return HFEngine(model, tokenizer)
    if cfg.rollout.engine == "vllm":
        from exgrpo_cli.rollout.vllm_engine import VLLMEngine

        # with the trainer's model, vLLM starts from its weights (resumed, GGUF, sharded) at once
        return VLLMEngine.from_config(cfg, tokenizer, model=model)
    raise ValueError(f"unknown rollout.engine {cfg.rollout.engine!r}")
