"""The unit every stage passes around: one question with its verifiable answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Question:
    uid: str  # stable id (the buffer's and the retired set's key)
    question: str  # the user-facing question text
    answer: str  # gold answer, checked by math-verify ("" when the data has none: reward=python|model)
    messages: tuple[tuple[str, str], ...] = ()  # (role, content) given by the data, if any
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # e.g. difficulty, source
    # every column of the data row, by name: what a reward=python function receives
    columns: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


def answer_only_questions(answers: Sequence[str]) -> list[Question]:
    """Stand-in questions for a scorer called with gold answers only (eval's and old callers'
    form): they carry the answer and nothing else."""
    return [Question(uid=str(i), question="", answer=str(a)) for i, a in enumerate(answers)]
