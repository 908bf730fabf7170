"""`sample_and_grade`, shared by training's validation and `exgrpo eval`: training's call (no
answer rules: the scorer's own) and the eval's, whose extra outputs line up per sample."""

from typing import Any

import pytest

from exgrpo_cli.data.templates import TEMPLATES
from exgrpo_cli.data.types import Question
from exgrpo_cli.evaluation.validate import sample_and_grade
from exgrpo_cli.parallel import sharding as S
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.reward.scorer import ScoreResult
from exgrpo_cli.rollout.base import Rollout, SamplingSpec


class CharTokenizer:
    eos_token_id, pad_token_id = 0, 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


class EchoEngine:
    """Answers each prompt with `\\boxed{<sample index>}` and records the calls."""

    def __init__(self) -> None:
        self.calls = []

    def generate(self, prompt_ids: list[list[int]], n: list[int], spec: SamplingSpec) -> list[Rollout]:
        self.calls.append((len(prompt_ids), spec.seed))
        return [
            Rollout(i, [ord(c) for c in f"\\boxed{{{j}}}"], None, True)
            for i, k in enumerate(n)
            for j in range(k)
        ]


class RecordingScorer:
    """Grades `\\boxed{<answer>}` right (EchoEngine's last sample) and records the answer rules it
    was given."""

    def __init__(self) -> None:
        self.rules = None

    def score(
        self,
        responses: list[str],
        answers: list[str],
        kinds: list[str] | None = None,
        rules: list[Any] | None = None,
        questions: Any = None,  # the samples' data rows (a reward function's columns)
    ) -> ScoreResult:
        self.rules = rules
        rewards = [1.0 if r == f"\\boxed{{{a}}}" else 0.0 for r, a in zip(responses, answers)]
        return ScoreResult(rewards, [None] * len(responses))


def test_sample_and_grade_old_and_new_outputs():
    qs = [Question(f"q{i}", f"question {i}", "2") for i in range(5)]
    engine, scorer = EchoEngine(), RecordingScorer()
    ticks = []
    res = sample_and_grade(
        engine,
        CharTokenizer(),
        TEMPLATES["plain"],
        qs,
        scorer,
        n=3,
        spec=SamplingSpec(0.6, 1.0, 8, seed=10),
        chunk=6,
        progress=ticks.append,
    )
    assert scorer.rules is None  # training's validation passes no answer rules
    assert engine.calls == [(2, 10), (2, 12), (1, 14)]  # two prompts of 3 samples per call of 6
    assert ticks == [2, 4, 5]
    assert res.responses[0] == ["\\boxed{0}", "\\boxed{1}", "\\boxed{2}"]
    assert res.correct == [[0.0, 0.0, 1.0]] * 5
    assert res.accuracy == 1 / 3 and res.pass_at_n == 1.0
    assert res.prompts == [f"question {i}" for i in range(5)]
    assert res.extracted == [[None] * 3] * 5  # this scorer extracts nothing
    assert (res.timeouts, res.errors) == (0, 0)


def test_rank_zero_progress_counts_every_rank_s_chunks(monkeypatch: Any) -> None:
    """Under 2 ranks, rank 0 generates chunks 0 and 2 of 3; its progress bar stands for the whole
    eval, so it reports the questions the two ranks have done together."""

    class Gathered(Exception):
        pass

    def gather(obj: Any, dist: Any) -> None:
        raise Gathered  # generation is over: only the ticks matter here

    monkeypatch.setattr(S, "all_gather_object", gather)
    ticks: list[int] = []
    with pytest.raises(Gathered):
        sample_and_grade(
            EchoEngine(),
            CharTokenizer(),
            TEMPLATES["plain"],
            [Question(f"q{i}", f"question {i}", "2") for i in range(5)],
            RecordingScorer(),
            n=3,
            spec=SamplingSpec(0.6, 1.0, 8, seed=10),
            chunk=6,
            progress=ticks.append,
            parallel=DataParallel(rank=0, world_size=2),
        )
    assert ticks == [4, 5]  # after one call each: chunks 0 and 1 (4 questions); then all 5


class ChatTokenizer(CharTokenizer):
    """Renders a chat as "role: content" lines, then the generation prompt "<think>\\n" (a chat
    template that opens the think block) or "assistant:"."""

    chat_template = "stub"

    def __init__(self, opens_think: bool) -> None:
        self.opens_think = opens_think

    def apply_chat_template(
        self, messages: list[dict[str, str]], tokenize: bool = False, add_generation_prompt: bool = True
    ) -> str:
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join(lines) + ("\n<think>\n" if self.opens_think else "\nassistant:")


def test_sample_and_grade_official_prompt_and_rule():
    from exgrpo_cli.evaluation.runner import official_answer_rule
    from exgrpo_cli.reward import AnswerRule

    q = Question("q0", "what?", "2", messages=(("system", "the data's system prompt"), ("user", "what?")))
    for opens_think, think in ((True, "first_or_whole"), (False, "whole")):
        scorer = RecordingScorer()
        res = sample_and_grade(
            EchoEngine(),
            ChatTokenizer(opens_think),
            TEMPLATES["think"],
            [q],
            scorer,
            n=2,
            spec=SamplingSpec(0.6, 1.0, 8, seed=0),
            data_system=False,
            rule_for_prompt=official_answer_rule,
        )
        assert "system" not in res.prompts[0] and res.prompts[0].startswith("user: what?")
        assert res.rules == [AnswerRule(think, boxed_only=True)]
        assert scorer.rules == [AnswerRule(think, boxed_only=True)] * 2  # one per sample
    # the training call: the data's own messages, and the scorer's own rule
    scorer = RecordingScorer()
    res = sample_and_grade(
        EchoEngine(), ChatTokenizer(True), TEMPLATES["think"], [q], scorer, n=1, spec=SamplingSpec()
    )
    assert res.prompts[0].startswith("system: the data's system prompt\nuser: what?")
    assert scorer.rules is None and res.rules == []
