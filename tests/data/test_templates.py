"""Prompt templates (docs/algorithm.md §8): the paper's own prompts, character for character."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from exgrpo_cli.data.templates import get_template
from exgrpo_cli.data.types import Question
from exgrpo_cli.evaluation.validate import sample_and_grade
from exgrpo_cli.reward.scorer import ScoreResult
from exgrpo_cli.rollout.base import Rollout, SamplingSpec
from exgrpo_cli.step.loop import Trainer

from conftest import TINY


def test_llama_base_prompt_is_the_papers() -> None:
    # the paper's appendix, Llama-3.1-8B base: one line, the line break after the instruction
    q = Question("q", "What is 1+1?", "2")
    text = get_template("llama_base").render(q, None)
    assert text == "User: What is 1+1? Answer: Let's think step by step.\n"


# --------------------------------------------------------------------------- BOS (issue 37)
def _llama_like_tokenizer() -> Any:
    """The shipped tiny tokenizer (no BOS) given a Llama-style BOS: built here, no hub."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY)
    tok.add_special_tokens({"bos_token": "<|begin_of_text|>"})
    assert tok.bos_token_id is not None
    return tok


class _Recorder:
    """A rollout engine that records the prompts it is given and answers nothing useful."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []

    def generate(self, prompt_ids: list[list[int]], n: list[int], spec: SamplingSpec) -> list[Rollout]:
        self.prompts += prompt_ids
        return [Rollout(i, [5], None, True) for i, k in enumerate(n) for _ in range(k)]


class _Zero:
    def score(
        self, responses: Any, answers: Any, kinds: Any = None, *, rules: Any = None, questions: Any = None
    ) -> ScoreResult:
        return ScoreResult([0.0] * len(responses), [None] * len(responses))


@pytest.mark.parametrize("name", ["llama_base", "plain"])
def test_plain_text_prompts_start_with_the_tokenizers_bos_in_training_and_eval(name: str) -> None:
    tok, template = _llama_like_tokenizer(), get_template(name)
    q = Question("q", "What is 1+1?", "2")
    text_ids = tok(template.render(q, None), add_special_tokens=False)["input_ids"]
    # training: the trainer's prompt ids (cached per question)
    train_ids = Trainer.prompt_ids(SimpleNamespace(_prompt_cache={}, template=template, tokenizer=tok), q)  # type: ignore[arg-type]
    assert train_ids == [tok.bos_token_id, *text_ids]
    # validation and exgrpo eval: what the engine is given
    engine = _Recorder()
    sample_and_grade(engine, tok, template, [q], _Zero(), n=1, spec=SamplingSpec(0.6, 1.0, 4, seed=0))  # type: ignore[arg-type]
    assert engine.prompts == [[tok.bos_token_id, *text_ids]]


def test_no_bos_twice_none_for_chat_templates_or_tokenizers_without_one() -> None:
    tok = _llama_like_tokenizer()
    q = Question("q", "<|begin_of_text|>What is 1+1?", "2")  # the text already starts with it
    ids = get_template("plain").prompt_ids(q, tok)
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
    # a chat template writes its own special tokens: nothing is added
    chat = get_template("think_short")
    q = Question("q", "What is 1+1?", "2")
    assert chat.prompt_ids(q, tok) == tok(chat.render(q, tok), add_special_tokens=False)["input_ids"]
    # the tiny tokenizer defines no BOS: plain prompts are the text's tokens alone
    from transformers import AutoTokenizer

    tiny = AutoTokenizer.from_pretrained(TINY)
    assert (
        get_template("plain").prompt_ids(q, tiny)
        == tiny("What is 1+1?", add_special_tokens=False)["input_ids"]
    )
