"""Prompt templates (docs/algorithm.md §8): the paper's own prompts, character for character."""

from __future__ import annotations

from exgrpo_cli.data.templates import get_template
from exgrpo_cli.data.types import Question


def test_llama_base_prompt_is_the_papers() -> None:
    # the paper's appendix, Llama-3.1-8B base: one line, the line break after the instruction
    q = Question("q", "What is 1+1?", "2")
    text = get_template("llama_base").render(q, None)
    assert text == "User: What is 1+1? Answer: Let's think step by step.\n"
