"""What tests/evaluation/test_split.py runs in one process and under two ranks alike."""

from __future__ import annotations

from typing import Any

import torch

from exgrpo_cli.algo.logprobs import ENTROPY
from exgrpo_cli.data.synthetic import train_and_val
from exgrpo_cli.data.templates import TEMPLATES
from exgrpo_cli.evaluation.validate import sample_and_grade
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy.scoring import score_candidates
from exgrpo_cli.reward import RewardScorer
from exgrpo_cli.rollout.base import SamplingSpec
from exgrpo_cli.rollout.hf import HFEngine


def run_both(model: torch.nn.Module, tok: Any, parallel: DataParallel | None) -> dict[str, Any]:
    _, val = train_and_val(10, 13, max_digits=2, ops=["+", "-", "*"], seed=5)
    template = TEMPLATES["think_short"]
    engine = HFEngine(model, tok)
    with RewardScorer(requires_think=True, workers=1) as scorer:
        res = sample_and_grade(
            engine,
            tok,
            template,
            val,
            scorer,
            n=2,
            spec=SamplingSpec(1.0, 1.0, 24, seed=11),
            chunk=6,
            parallel=parallel,
        )
    prompts = [tok(template.render(q, tok), add_special_tokens=False)["input_ids"] for q in val]
    responses = [tok(f"<think>{q.question}</think>\\boxed{{{q.answer}}}")["input_ids"] for q in val]
    scores = score_candidates(
        model, prompts, responses, kind=ENTROPY, temperature=1.0, pad_id=tok.pad_token_id,
        token_budget=120, max_rows=3, parallel=parallel,
    )  # fmt: skip
    return {"responses": res.responses, "correct": res.correct, "scores": scores, "accuracy": res.accuracy}
