"""What keeps torchrun ranks in step with replay on: one grader per group, and a per-step check.

Two ranks are simulated by two threads exchanging objects through a barrier (the stand-in for
`all_gather_object`), so the exchange logic of `Trainer.score` and `check_ranks_agree` runs as it
does under torchrun, without a process group. The real 2-process run is in test_torchrun_e2e.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from thread_ranks import Exchange, run_ranks
from toy_trainer import toy_state, toy_trainer

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.parallel import sharding as S
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.mixing import Group, Response, build_mixed_batch
from exgrpo_cli.reward.stage import Reward
from exgrpo_cli.step.loop import Trainer
from exgrpo_cli.step.state import RunState


class Tok:
    eos_token_id = pad_token_id = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


class FlakyGrader:
    """Grades `\\boxed`-free toy answers: correct when the response contains the gold number.
    `times_out=True` makes every item a timeout (reward 0), as a loaded rank might see."""

    def __init__(self, times_out: bool) -> None:
        self.times_out = times_out
        self.graded = 0

    def score(
        self, texts: list[str], golds: list[str], kinds: object = None, **kw: object
    ) -> SimpleNamespace:
        self.graded += len(texts)
        rewards = [0.0 if self.times_out else float(g in t.split()) for t, g in zip(texts, golds)]
        return SimpleNamespace(rewards=rewards, timeouts=len(texts) if self.times_out else 0, errors=0)


def _groups(graded: bool = False) -> list[Group]:
    """`graded`: with the rewards the grader would give (1 for responses 0 and 2)."""
    out = []
    for i in range(4):
        q = Question(uid=f"q{i}", question=f"q{i}", answer=str(10 + i))
        # responses 0 and 2 hold the gold answer: every group is half right
        responses = [
            Response([5, 10 + i if k % 2 == 0 else 99], [-1.0, -1.0], float(graded and k % 2 == 0))
            for k in range(4)
        ]
        out.append(Group(q, [1, 2], responses))
    return out


def _trainer(rank: int, world: int, scorer: FlakyGrader) -> Trainer:
    return toy_trainer(ExgrpoConfig(), rank=rank, world=world, tokenizer=Tok(), scorer=Reward(scorer, 1.0))


def test_each_group_is_graded_once_and_ranks_get_the_same_rewards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "all_gather_object", Exchange(2))
    # rank 1's grader times out on everything: without one grader per group the ranks would
    # disagree on the rewards of every group, and so on the buffer
    graders = [FlakyGrader(times_out=False), FlakyGrader(times_out=True)]

    def rank(r: int) -> tuple[list[list[float]], dict[str, float]]:
        groups = _groups()
        metrics = _trainer(r, 2, graders[r]).score(groups)
        return [[resp.reward for resp in g.responses] for g in groups], metrics

    (rewards0, m0), (rewards1, m1) = run_ranks(2, rank)
    assert rewards0 == rewards1, "ranks disagree on the rewards"
    assert [graders[0].graded, graders[1].graded] == [8, 8]  # two groups of four each, not all four
    # the owner's verdict: groups 0, 2 graded by rank 0 (correct ones found), 1, 3 by rank 1 (timeouts)
    assert rewards0 == [[1.0, 0.0, 1.0, 0.0], [0.0] * 4, [1.0, 0.0, 1.0, 0.0], [0.0] * 4]
    assert m0 == m1 and m0["reward/timeouts"] == 8.0 and m0["reward/accuracy"] == 0.25


def test_one_rank_grades_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    grader = FlakyGrader(times_out=False)
    groups = _groups()
    _trainer(0, 1, grader).score(groups)
    assert grader.graded == 16 and all(g.num_correct == 2 for g in groups)


def test_digest_follows_the_shared_state() -> None:
    def state(extra_uid: str | None = None, position: int = 3) -> RunState:
        buf = ExperienceBuffer(4)
        resp = (np.array([5, 6], np.int32), np.array([-1.0, -2.0], np.float32))
        buf.observe_group("a", 2, [resp], step=1, collect=True)
        if extra_uid:
            buf.observe_group(extra_uid, 1, [resp], step=1, collect=True)
        st = toy_state(buf, started=True)
        st.sampler.draw(position)
        return st

    assert state().digest() == state().digest()
    assert state().digest() != state("b").digest()
    assert state().digest() != state(position=4).digest()
    skipped = state()
    skipped.skipped_in_a_row = 1  # every key of state_dict is shared unless declared local
    assert skipped.digest() != state().digest()
    local = state()
    local.wandb_id = "rank-local"
    assert local.digest() == state().digest()


def test_diverged_ranks_fail_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "all_gather_object", Exchange(2))

    def rank(r: int) -> None:
        t = _trainer(r, 2, FlakyGrader(False))
        if r == 1:  # one question more in rank 1's buffer
            t.state.buffer.observe_group(
                "x", 1, [(np.array([1], np.int32), np.array([-1.0], np.float32))], step=1, collect=True
            )
        t.check_ranks_agree(step=5)

    with pytest.raises(RuntimeError, match="step 5: the ranks' replay buffers"):
        run_ranks(2, rank)
    monkeypatch.setattr(S, "all_gather_object", Exchange(2))
    run_ranks(2, lambda r: _trainer(r, 2, FlakyGrader(False)).check_ranks_agree(step=5))  # agree: no error


def test_stored_logprobs_are_gathered_from_the_rank_that_trained_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each rank computes the trainer log-probs of its own groups only; every rank must store the
    same values, so they are all-gathered before the buffer update."""
    from exgrpo_cli.step.update import UpdateResult

    monkeypatch.setattr(S, "all_gather_object", Exchange(2))

    def rank(r: int) -> dict:
        groups = _groups(graded=True)
        mine = [r, r + 2]  # groups r, r+W
        # this rank's batch rows: 4 responses per group, in order; log-prob marks (rank, row)
        result = UpdateResult(trainer_logp={row: [float(10 * r + row)] * 2 for row in range(8)})
        trainer = _trainer(r, 2, FlakyGrader(False))
        trainer.state.switch.update(1, 0.5)  # after the delayed start: the buffer stores them
        return trainer.trainer_logprobs(groups, build_mixed_batch([groups[i] for i in mine], mine), result)

    got0, got1 = run_ranks(2, rank)
    assert {k: v.tolist() for k, v in got0.items()} == {k: v.tolist() for k, v in got1.items()}
    assert sorted(got0) == [(g, j) for g in range(4) for j in (0, 2)]  # every correct response, once
    assert got0[(1, 2)].tolist() == [12.0, 12.0]  # group 1 is rank 1's first group: its row 2


def test_no_gather_when_the_buffer_stores_no_trainer_logprobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the delayed start (the buffer collects nothing) and with the engine's log-probs
    stored, no rank gathers anything: every rank decides alike from the same groups and switch."""
    from exgrpo_cli.step.update import UpdateResult

    def no_gather(*args: object) -> None:
        raise AssertionError("gathered log-probs nobody stores")

    monkeypatch.setattr(S, "all_gather_object", no_gather)
    groups = _groups(graded=True)
    result = UpdateResult(trainer_logp={row: [0.0] * 2 for row in range(8)})
    trainer = _trainer(0, 2, FlakyGrader(False))
    batch = build_mixed_batch([groups[0], groups[2]], [0, 2])
    assert trainer.trainer_logprobs(groups, batch, result) == {}  # the delayed start has not fired
    trainer.state.switch.update(1, 0.5)
    trainer.cfg.replay.store_trainer_logprobs = False
    assert trainer.trainer_logprobs(groups, batch, result) == {}


def test_digest_covers_the_stored_logprobs() -> None:
    def state(logp: float) -> RunState:
        buf = ExperienceBuffer(4)
        buf.observe_group(
            "a", 2, [(np.array([5, 6], np.int32), np.full(2, logp, np.float32))], step=1, collect=True
        )
        return toy_state(buf)

    assert state(-1.0).digest() == state(-1.0).digest()
    assert state(-1.0).digest() != state(-1.0 + 1e-6).digest()
