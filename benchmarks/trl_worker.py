"""TRL's GRPOTrainer on exgrpo's model and task: the baseline side of benchmark 1 (not a test).

Runs inside .venv-bench (TRL + exgrpo, the same torch and transformers as the main .venv):

    .venv-bench/bin/python benchmarks/trl_worker.py --steps 6 -- model=tiny algo.questions_per_step=16

The exgrpo config composed from the same Hydra overrides decides everything both trainers share:
the model (exgrpo's own loader, so builtin:tiny and GGUF presets load identically), the prompt
template, the training questions, the reward (exgrpo's scorer on the completion ids, so the
think/boxed parsing is the same), questions per step, K, max new tokens, lr, AdamW settings,
clip range, entropy bonus and temperature. TRL is configured as a user would for the same
algorithm: loss_type="dr_grpo", scale_rewards="none", beta=0 (no reference model), HF generate
(no vLLM), one generation per optimizer step. Prints one JSON line: per-step wall times
(generation included) and completion lengths.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from typing import TYPE_CHECKING, Any

from common import compose_config

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("overrides", nargs="*", help="exgrpo Hydra overrides (after --)")
    a = p.parse_args()

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from exgrpo_cli.data.sources import load_questions
    from exgrpo_cli.data.templates import get_template
    from exgrpo_cli.policy.model import load_model, load_tokenizer
    from exgrpo_cli.reward import RewardScorer
    from exgrpo_cli.rollout.base import decode_response

    tmp = tempfile.mkdtemp(prefix="exgrpo-bench-trl-")
    cfg = compose_config([*a.overrides, f"trainer.output_dir={tmp}"])
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.trainer.seed)
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model, torch.device("cpu"))
    template = get_template(cfg.model.template)
    train_qs, _, _ = load_questions(cfg.data)
    data = Dataset.from_list([{"prompt": template.messages(q), "answer": q.answer} for q in train_qs])
    scorer = RewardScorer(requires_think=template.requires_think, workers=1)

    def reward(
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]],
        answer: list[str],
        **_: Any,
    ) -> list[float]:
        texts = [decode_response(tokenizer, ids) for ids in completion_ids]
        return scorer.score(texts, list(answer)).rewards

    K, Q, algo = cfg.rollout.n, cfg.algo.questions_per_step, cfg.algo
    args = GRPOConfig(
        output_dir=tmp,
        max_steps=a.steps,
        per_device_train_batch_size=Q * K,
        num_generations=K,
        gradient_accumulation_steps=1,
        max_completion_length=cfg.model.max_response_tokens,
        learning_rate=algo.lr,
        weight_decay=algo.weight_decay,
        adam_beta1=algo.betas[0],
        adam_beta2=algo.betas[1],
        max_grad_norm=algo.grad_clip,
        lr_scheduler_type="constant",
        warmup_steps=0,
        loss_type="dr_grpo",
        scale_rewards="none",
        beta=0.0,
        epsilon=algo.clip_eps,
        entropy_coef=algo.entropy_coef,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=0,
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=cfg.trainer.seed,
        dataloader_num_workers=0,
        log_completions=False,
        disable_dropout=True,
        # TRL turns activation checkpointing on by default; exgrpo follows the model preset
        gradient_checkpointing=cfg.model.gradient_checkpointing,
    )

    class StepClock(TrainerCallback):
        """Wall time of each optimizer step: generation, reward, forward/backward and update."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.lengths: list[float] = []
            self._t0 = 0.0

        def on_step_begin(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> None:
            self._t0 = time.perf_counter()

        def on_step_end(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
        ) -> None:
            self.times.append(time.perf_counter() - self._t0)

        def on_log(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            logs: dict[str, float] | None = None,
            **kw: Any,
        ) -> None:
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    clock = StepClock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.train()
    scorer.close()
    print(
        json.dumps(
            {
                "step_s": clock.times,
                "response_length": clock.lengths,
                "rollouts_per_step": Q * K,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "optimizer": type(trainer.optimizer).__name__,
            }
        )
    )


if __name__ == "__main__":
    main()
