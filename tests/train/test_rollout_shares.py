"""`Trainer.rollout` under two ranks: each rank generates for its share of the step's prompts, and
every rank ends with every group, each holding its own prompt's responses.

Two ranks are simulated by threads exchanging objects (tests/thread_ranks.py); the engine is a stub
whose responses name the prompt they answer, their place in the engine's output and the seed of
the call, so a response put in another prompt's group, reordered or lost shows in the groups.
"""

from __future__ import annotations

import numpy as np
import pytest
from thread_ranks import Exchange, run_ranks
from toy_trainer import toy_state, toy_trainer

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.parallel import sharding as S
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.replay.experience import Experience
from exgrpo_cli.replay.methods import Replayed
from exgrpo_cli.replay.mixing import Group
from exgrpo_cli.rollout.base import Rollout, SamplingSpec
from exgrpo_cli.step.loop import Trainer

K = 4  # rollout.n
STEP = 7


class Tok:
    """Prompt text "q<i>" -> ids [1000 + i, 1]: the first id names the question."""

    eos_token_id = pad_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [1000 + int(text[1:]), 1]}


class Template:
    def render(self, q: Question, tokenizer: object, data_system: bool = True) -> str:
        return q.question

    def prompt_ids(self, q: Question, tokenizer: Tok, data_system: bool = True) -> list[int]:
        return tokenizer(self.render(q, tokenizer, data_system))["input_ids"]


class Engine:
    """A response is [prompt's first id, its rank among that prompt's responses, seed]: it names
    its prompt, where the engine put it, and (when `seeded`) the seed of the call. The engine
    interleaves the prompts and emits each prompt's responses last first, so an order the merge
    made up differs from the engine's."""

    def __init__(self, seeded: bool) -> None:
        self.seeded = seeded
        self.calls: list[list[list[int]]] = []  # the prompts of each call
        self.seeds: list[int] = []  # the seed of each call

    def generate(self, prompt_ids: list[list[int]], n: list[int], spec: SamplingSpec) -> list[Rollout]:
        self.calls.append(prompt_ids)
        self.seeds.append(spec.seed)
        seed = spec.seed if self.seeded else 0
        out = []
        for k in reversed(range(max(n, default=0))):
            for j, p in enumerate(prompt_ids):
                if k < n[j]:
                    out.append(Rollout(j, [p[0], k, seed], [-0.5 * k, float(p[0])], finished=k % 2 == 0))
        return out

    def release(self) -> None:
        pass


def _questions(n: int) -> list[Question]:
    return [Question(uid=f"u{i}", question=f"q{i}", answer="1") for i in range(n)]


def _trainer(rank: int, world: int, engine: Engine) -> Trainer:
    cfg = ExgrpoConfig()
    cfg.rollout.n = K
    state = toy_state(questions=_questions(8))
    return toy_trainer(cfg, state, rank, world, tokenizer=Tok(), template=Template(), engine=engine)


def _replayed() -> list[Replayed]:
    """Two replayed questions (K-1 fresh responses each, then the stored one)."""
    return [
        Replayed(
            q,
            (Experience(np.array([7, 8 + i], np.int32), np.array([-1.0, -2.0], np.float32), step=1),),
            K - 1,
        )
        for i, q in enumerate(_questions(7)[5:])
    ]


def _rollout(rank: int, world: int, engine: Engine) -> list[Group]:
    return _trainer(rank, world, engine).rollout(_questions(5), _replayed(), STEP)


def _on_two_ranks(monkeypatch: pytest.MonkeyPatch, seeded: bool) -> tuple[list[list[Group]], list[Engine]]:
    monkeypatch.setattr(S, "all_gather_object", Exchange(2))
    engines = [Engine(seeded), Engine(seeded)]
    return run_ranks(2, lambda r: _rollout(r, 2, engines[r])), engines


def _ids(g: Group) -> list[list[int]]:
    return [r.ids for r in g.responses]


def test_every_group_gets_its_own_prompts_responses_from_the_rank_that_generated_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (groups0, groups1), engines = _on_two_ranks(monkeypatch, seeded=True)
    assert groups0 == groups1, "the ranks ended with different groups"
    assert [g.question.uid for g in groups0] == [f"u{i}" for i in range(7)]
    # each rank generated only its share, in one call
    assert [len(e.calls) for e in engines] == [1, 1]
    assert sorted(p[0] for e in engines for p in e.calls[0]) == [1000 + i for i in range(7)]
    assert engines[0].seeds != engines[1].seeds  # the ranks sample differently
    for i, g in enumerate(groups0):
        owner = next(r for r in range(2) if i in DataParallel(rank=r, world_size=2).mine(7))
        fresh = K if i < 5 else K - 1
        # the prompt's own responses, in the engine's order (last first), from its owner's seed
        seed = engines[owner].seeds[0]
        assert _ids(g)[:fresh] == [[1000 + i, k, seed] for k in reversed(range(fresh))], i
        assert g.prompt_ids == [1000 + i, 1] and g.from_buffer == (i >= 5)
        assert [r.behavior_logp for r in g.responses[:fresh]] == [
            [-0.5 * k, float(1000 + i)] for k in reversed(range(fresh))
        ]
        assert [r.finished for r in g.responses[:fresh]] == [k % 2 == 0 for k in reversed(range(fresh))]
        if i >= 5:  # the stored response last, marked replayed
            assert _ids(g)[-1] == [7, 8 + i - 5] and g.responses[-1].replayed
            assert len(g.responses) == K
        else:
            assert not any(r.replayed for r in g.responses)


def test_two_ranks_give_the_groups_one_process_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    (groups0, groups1), _ = _on_two_ranks(monkeypatch, seeded=False)
    alone = _rollout(0, 1, Engine(seeded=False))
    assert groups0 == groups1 == alone
    assert [len(g.responses) for g in alone] == [K] * 7
    assert all(r.ids[0] == g.prompt_ids[0] for g in alone for r in g.responses if not r.replayed)
