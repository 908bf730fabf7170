"""`sample_and_grade`, shared by training's validation and `exgrpo eval`: the original call still
works (a scorer that returns only rewards), and the eval's extra outputs line up per sample."""

from dataclasses import dataclass

from exgrpo_cli.data.templates import TEMPLATES
from exgrpo_cli.data.types import Question
from exgrpo_cli.evaluation.validate import sample_and_grade
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


@dataclass
class RewardsOnly:
    rewards: list


class LastSampleRight:
    def score(self, responses: list[str], answers: list[str], kinds: list[str] | None = None) -> RewardsOnly:
        return RewardsOnly([1.0 if r == f"\\boxed{{{a}}}" else 0.0 for r, a in zip(responses, answers)])


def test_sample_and_grade_old_and_new_outputs():
    qs = [Question(f"q{i}", f"question {i}", "2") for i in range(5)]
    engine = EchoEngine()
    ticks = []
    res = sample_and_grade(
        engine,
        CharTokenizer(),
        TEMPLATES["plain"],
        qs,
        LastSampleRight(),
        n=3,
        spec=SamplingSpec(0.6, 1.0, 8, seed=10),
        chunk=6,
        progress=ticks.append,
    )
    assert engine.calls == [(2, 10), (2, 12), (1, 14)]  # two prompts of 3 samples per call of 6
    assert ticks == [2, 4, 5]
    assert res.responses[0] == ["\\boxed{0}", "\\boxed{1}", "\\boxed{2}"]
    assert res.correct == [[0.0, 0.0, 1.0]] * 5
    assert res.accuracy == 1 / 3 and res.pass_at_n == 1.0
    assert res.prompts == [f"question {i}" for i in range(5)]
    assert res.extracted == [[None] * 3] * 5  # this scorer extracts nothing
    assert (res.timeouts, res.errors) == (0, 0)
