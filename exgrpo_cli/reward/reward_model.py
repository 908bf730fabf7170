"""`reward=model`: a Hugging Face sequence-classification reward model scores each response.

Part of the reward stage of the train step (after rollouts, before the replay buffer update). The
model (`reward.model.path`, a folder or hub id) is loaded once, never with remote code, in eval
mode, on the trainer's device (or `reward.model.device`); each (question, response) pair is laid
out with the reward model's own chat template as a user turn and an assistant turn, and scored in
batches of `reward.model.batch_size`: the reward is the single logit (`normalise=sigmoid`: its
sigmoid). Under torchrun every rank holds its own copy and scores its share of the groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from exgrpo_cli.config.schema import RewardModelConfig
from exgrpo_cli.data.types import Question, answer_only_questions
from exgrpo_cli.errors import ExgrpoError
from exgrpo_cli.reward.scorer import ScoreResult


def _identity(x: float) -> float:
    return x


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0  # exp overflows past ~709


# `reward.model.normalise`: name -> score to reward
NORMALISE: dict[str, Callable[[float], float]] = {"none": _identity, "sigmoid": _sigmoid}


class RewardModelError(ExgrpoError):
    """The reward model cannot be used as one (no chat template, more than one label)."""

    exit_code = 2


class ModelReward:
    """Scores with a sequence-classification model; `score` has `RewardScorer`'s shape."""

    def __init__(self, cfg: RewardModelConfig, device: torch.device) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.cfg = cfg
        self.device = torch.device(cfg.device) if cfg.device else device
        self.normalise = NORMALISE[cfg.normalise]
        tok = AutoTokenizer.from_pretrained(cfg.path, trust_remote_code=False)
        if not getattr(tok, "chat_template", None):
            raise RewardModelError(
                f"reward.model.path={cfg.path}: its tokenizer has no chat template (a reward model "
                "scores a conversation; give the folder a chat_template.jinja)"
            )
        model = AutoModelForSequenceClassification.from_pretrained(cfg.path, trust_remote_code=False)
        if model.config.num_labels != 1:
            raise RewardModelError(
                f"reward.model.path={cfg.path}: {model.config.num_labels} labels; a reward model has one"
            )
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        # the classifier reads the last non-pad token of each row: it must know the pad id
        model.config.pad_token_id = tok.pad_token_id
        tok.padding_side, tok.truncation_side = "right", "left"  # cut the prompt, keep the answer's end
        self.tokenizer, self.model = tok, model.to(self.device).eval()

    def close(self) -> None:
        self.model = None

    def metrics(self) -> dict[str, int]:
        return {"reward/timeouts": 0, "reward/errors": 0}

    def _texts(self, responses: Sequence[str], questions: Sequence[Question]) -> list[str]:
        return [
            str(
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": q.question}, {"role": "assistant", "content": r}],
                    tokenize=False,
                )
            )
            for r, q in zip(responses, questions)
        ]

    @torch.no_grad()
    def score(
        self,
        responses: Sequence[str],
        answers: Sequence[str],
        kinds: Any = None,
        *,
        rules: Any = None,
        questions: Sequence[Question] | None = None,
    ) -> ScoreResult:
        if questions is None:
            questions = answer_only_questions(answers)
        texts = self._texts(responses, questions)
        rewards: list[float] = []
        for start in range(0, len(texts), self.cfg.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.cfg.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.cfg.max_tokens,
                add_special_tokens=False,
            ).to(self.device)
            logits = self.model(**batch).logits.float()[:, 0]
            rewards += [self.normalise(float(x)) for x in logits.cpu()]
        return ScoreResult(rewards=rewards, extracted=[None] * len(rewards))
