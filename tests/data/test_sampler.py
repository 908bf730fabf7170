"""Fresh-question sampling across epochs with retirement and re-admission (docs/algorithm.md §2, 6):
what makes the `retired` ablation measure something."""

from __future__ import annotations

import numpy as np
import pytest

from exgrpo_cli.data.sampler import FRESH_DRAWS, QuestionSampler
from exgrpo_cli.data.types import Question
from exgrpo_cli.errors import ExgrpoError
from exgrpo_cli.replay.buffer import ExperienceBuffer


def _stream(pool: int, steps: int, per_step: int, readmit_every: int) -> list[str]:
    """The fresh questions a run draws when every third question it meets is solved by a whole
    group (and so retired at the end of that step), with half the retired set put back every
    `readmit_every` steps (0: never), as the train step drives the sampler and the buffer."""
    questions = [Question(f"q{i}", f"q{i}", "1") for i in range(pool)]
    sampler, buf = QuestionSampler(questions, seed=0), ExperienceBuffer(8)
    drawn: list[str] = []
    for step in range(1, steps + 1):
        for q in sampler.draw(per_step, retired=buf.retired):
            drawn.append(q.uid)
            if int(q.uid[1:]) % 3 == 0:
                buf.observe_group(q.uid, 8, [], step=step, collect=True)
        buf.end_step()
        if readmit_every and step % readmit_every == 0:
            buf.readmit(0.5, np.random.default_rng([0, step, 3]))
    return drawn


def test_readmission_changes_the_stream_only_once_the_pool_is_drawn_again() -> None:
    # the old sweep: 50 steps x 8 questions from a pool of 4000 never finish one epoch, so the
    # retired set never leaves sampling and re-admission changes nothing
    assert _stream(4000, 50, 8, 0) == _stream(4000, 50, 8, 10)
    # the sweep now (conf/ablation/retired.yaml): a pool of 96, several epochs in 50 steps
    retire, readmit = _stream(96, 50, 4, 0), _stream(96, 50, 4, 10)
    assert retire != readmit
    # with retirement alone, a question retired in the first epoch is never drawn again ...
    first_epoch = retire[:96]
    gone = {u for u in first_epoch if int(u[1:]) % 3 == 0}
    assert gone and not gone & set(retire[96:])
    # ... while re-admission brings some of them back
    assert gone & set(readmit[96:])


def test_a_pool_retired_below_one_step_stops_the_run_with_a_message() -> None:
    questions = [Question(f"q{i}", f"p{i}", "1") for i in range(6)]
    sampler = QuestionSampler(questions, seed=0)
    first = sampler.draw(4)
    assert len({q.uid for q in first}) == 4
    retired = {"q0", "q1", "q2"}  # 3 left: a step of 4 would hold one question twice
    sampler.draw(2, retired)  # the rest of epoch 0: no new epoch, no check yet
    with pytest.raises(ExgrpoError, match="only 3 of the 6 training questions are not retired"):
        sampler.draw(4, retired)
    assert [q.uid for q in sampler.draw(3, retired)]  # a step that fits still draws


def test_a_pool_smaller_than_a_step_is_a_usage_error() -> None:
    from exgrpo_cli.errors import UsageError

    with pytest.raises(UsageError, match="has 2 usable questions, fewer than the 3"):
        QuestionSampler([Question("a", "a", "1"), Question("b", "b", "1")], seed=0).draw(3)


def _pool(n: int) -> list[Question]:
    return [Question(f"q{i}", f"q{i}", "1") for i in range(n)]


def test_batch_draw_takes_whole_steps_from_one_epoch_and_drops_what_replay_displaces() -> None:
    """data.draw=batch, the official schedule: a step draws B rows, uses the first B - n_replay."""
    whole, needed = QuestionSampler(_pool(10), seed=0), QuestionSampler(_pool(10), seed=0)
    order = [q.uid for q in whole.draw_batch(4)]  # epoch 0's first four
    used = FRESH_DRAWS["batch"](whole, 2, 4, ())  # two replayed questions: two of four used
    assert len(used) == 2 and whole.position == 8  # the other two were drawn and dropped
    assert [q.uid for q in FRESH_DRAWS["needed"](needed, 4, 4, ())] == order
    assert [q.uid for q in FRESH_DRAWS["needed"](needed, 2, 4, ())] == [q.uid for q in used]
    assert needed.position == 6  # the economical draw takes only what the step uses
    # two rows are left in epoch 0, fewer than a step: they are skipped (drop_last), epoch 1 starts
    third = FRESH_DRAWS["batch"](whole, 4, 4, {"q0"})
    assert whole.epoch == 1 and whole.position == 4 and whole.epoch_questions == 9
    assert "q0" not in {q.uid for q in third}


def test_batch_draw_passes_over_the_pool_twice_without_its_retired_questions() -> None:
    """The recipe's ratio of pool to steps (46k questions, 700 steps of 128 rows: about two
    passes): the second pass leaves out what the first retired; re-admitted questions return."""
    pool, steps, per_step = 64, 16, 8  # 128 rows drawn: two passes over 64
    for readmit in (False, True):
        sampler, buf = QuestionSampler(_pool(pool), seed=1), ExperienceBuffer(8)
        by_epoch: dict[int, list[str]] = {}
        sizes: dict[int, int] = {}  # epoch -> its questions
        for step in range(1, steps + 1):
            used = FRESH_DRAWS["batch"](sampler, per_step // 2, per_step, buf.retired)
            by_epoch.setdefault(sampler.epoch, []).extend(q.uid for q in used)
            sizes[sampler.epoch] = sampler.epoch_questions
            for q in used:
                if int(q.uid[1:]) % 4 == 0:  # solved by the whole group: retired at the end of the step
                    buf.observe_group(q.uid, 8, [], step=step, collect=True)
            buf.end_step()
            if readmit and step == 8:  # the end of the first epoch
                buf.readmit(1.0, np.random.default_rng(0))
        assert sorted(by_epoch)[:2] == [0, 1]  # (without re-admission epoch 1 is shorter: a third starts)
        retired_first = {u for u in by_epoch[0] if int(u[1:]) % 4 == 0}
        assert retired_first
        if readmit:
            assert buf.metrics()["replay/readmitted"] == len(retired_first)
            assert sizes[1] == pool  # every retired question came back
        else:
            assert not retired_first & set(by_epoch[1])  # the second pass leaves them out
            assert sizes[1] == pool - len(retired_first)
