"""Sampled accuracy of the policy on held-out questions: `val/` metrics of `exgrpo train`.

The same rollout engine and reward as training; n samples per question at
`trainer.val_temperature` (the rollout temperature when unset), so `val/accuracy` is the mean
per-sample accuracy (avg@n) and `val/pass@n` the share of questions solved at least once.
`exgrpo eval` uses the same function at `eval.temperature`, with the official evaluation's prompt
(`data_system=False`) and answer rule (`rule_for_prompt`) on the paper benchmarks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exgrpo_cli.data.templates import Template
from exgrpo_cli.data.types import Question
from exgrpo_cli.reward.extract import AnswerRule
from exgrpo_cli.rollout.base import RolloutEngine, SamplingSpec, decode_response

if TYPE_CHECKING:
    from exgrpo_cli.parallel.sharding import DataParallel
    from exgrpo_cli.reward.scorer import Backend


@dataclass
class SampledResult:
    questions: list[Question]
    responses: list[list[str]]  # per question, n decoded responses
    correct: list[list[float]]  # per question, n rewards
    extracted: list[list[str | None]] = field(default_factory=list)  # per question, n graded answers
    prompts: list[str] = field(default_factory=list)  # per question, the rendered prompt text
    timeouts: int = 0  # samples whose verification timed out (graded 0)
    errors: int = 0  # samples whose verification failed (graded 0)
    rules: list[AnswerRule] = field(default_factory=list)  # per question ([]: the scorer's own rule)
    correct_at: float = 1.0  # a sample is correct when its reward is >= this (reward.correct_at)

    @property
    def accuracy(self) -> float:
        flat = [c for row in self.correct for c in row]
        return sum(flat) / max(len(flat), 1)

    @property
    def pass_at_n(self) -> float:
        solved = sum(any(c >= self.correct_at for c in row) for row in self.correct)
        return solved / max(len(self.correct), 1)


def sample_and_grade(
    engine: RolloutEngine,
    tokenizer: Any,  # a Hugging Face tokenizer
    template: Template,
    questions: list[Question],
    scorer: Backend,
    *,
    n: int,
    spec: SamplingSpec,
    kinds: list[str] | None = None,
    chunk: int = 256,
    progress: Callable[[int], None] | None = None,
    data_system: bool = True,
    rule_for_prompt: Callable[[str], AnswerRule] | None = None,
    parallel: DataParallel | None = None,
) -> SampledResult:
    """Generate n responses per question (in chunks of `chunk` sequences) and grade them.

    `progress`, when given, is called with the number of questions generated after each chunk.
    `data_system=False` leaves the data's system message out of the prompts; `rule_for_prompt`,
    when given, picks the answer rule of each question's samples from its rendered prompt (else
    the scorer grades with its own rule). Under torchrun (`parallel`), the ranks share the chunks and
    the grading, and every rank returns the whole result: the one a single process returns."""
    from exgrpo_cli.parallel.sharding import DataParallel  # deferred: torch

    texts_in = [template.render(q, tokenizer, data_system) for q in questions]
    rules = [] if rule_for_prompt is None else [rule_for_prompt(t) for t in texts_in]
    prompts = [template.prompt_ids(q, tokenizer, data_system) for q in questions]
    parallel = parallel if parallel is not None else DataParallel()
    texts = _sample_share(engine, tokenizer, prompts, n, spec, max(1, chunk // n), parallel, progress)
    graded = _grade(sorted(texts), texts, questions, scorer, n, kinds, rules)
    # every rank gets every question's samples and grades
    got = parallel.merge(graded.per_question, timeouts=graded.timeouts, errors=graded.errors)
    per_question = got.in_order(len(questions))
    return SampledResult(
        questions,
        [q[0] for q in per_question],
        [q[1] for q in per_question],
        [q[2] for q in per_question],
        texts_in,
        got.counts["timeouts"],
        got.counts["errors"],
        rules,
        float(getattr(scorer, "correct_at", 1.0)),  # a bare RewardScorer: 0/1 rewards
    )


def _sample_share(
    engine: RolloutEngine,
    tokenizer: Any,
    prompts: list[list[int]],
    n: int,
    spec: SamplingSpec,
    per_call: int,
    parallel: DataParallel,
    progress: Callable[[int], None] | None,
) -> dict[int, list[str]]:
    """This rank's share of the chunks of `per_call` prompts, n decoded samples per prompt:
    prompt index -> its samples' texts, in the engine's order."""
    starts = list(range(0, len(prompts), per_call))
    # each rank samples its share of the chunks, with the chunk's own seed, so that the samples are
    # those one process draws; every rank makes as many calls (the equal-call rule, known here
    # without asking: `rounds`): a rank out of chunks takes part with an empty one
    mine = [starts[i] for i in parallel.mine(len(starts))]
    texts: dict[int, list[str]] = {}
    for k in range(parallel.rounds(len(starts))):
        if k >= len(mine):
            engine.generate([], [], spec)
            if progress is not None:
                progress(len(prompts))
            continue
        start = mine[k]
        idx = list(range(start, min(start + per_call, len(prompts))))
        spec_i = dataclasses.replace(spec, seed=spec.seed + start)
        outs = engine.generate([prompts[i] for i in idx], [n] * len(idx), spec_i)
        by_q: list[list[str]] = [[] for _ in idx]
        for r in outs:
            by_q[r.prompt_index].append(decode_response(tokenizer, r.response_ids))
        texts.update(zip(idx, by_q))
        if progress is not None:  # the ranks go in step: after k+1 calls each, all ranks' chunks
            done = parallel.done_after(k + 1, len(starts))
            progress(starts[done] if done < len(starts) else len(prompts))
    return texts


@dataclass
class _Graded:
    # question index -> (its samples' texts, their rewards, their graded answers)
    per_question: dict[int, tuple[list[str], list[float], list[str | None]]]
    timeouts: int = 0
    errors: int = 0


def _grade(
    idx: list[int],
    texts: dict[int, list[str]],
    questions: list[Question],
    scorer: Backend,
    n: int,
    kinds: list[str] | None,
    rules: list[AnswerRule],
) -> _Graded:
    """Grade the samples of the questions `idx` (this rank's)."""
    flat_resp = [t for i in idx for t in texts[i]]
    flat_gold = [questions[i].answer for i in idx for _ in range(n)]
    flat_kind = None if kinds is None else [kinds[i] for i in idx for _ in range(n)]
    if not flat_resp:  # no chunk on this rank (or no samples): each question's samples, none graded
        return _Graded({i: (texts[i], [], []) for i in idx})
    # no rules (training's validation): the scorer's own rule
    flat_rules = [rules[i] for i in idx for _ in range(n)] if rules else None
    rows = [questions[i] for i in idx for _ in range(n)]
    graded = scorer.score(flat_resp, flat_gold, kinds=flat_kind, rules=flat_rules, questions=rows)
    per_question = {
        i: (texts[i], list(graded.rewards[k * n : (k + 1) * n]), list(graded.extracted[k * n : (k + 1) * n]))
        for k, i in enumerate(idx)
    }
    return _Graded(per_question, graded.timeouts, graded.errors)
