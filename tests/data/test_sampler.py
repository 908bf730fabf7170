"""Fresh-question sampling across epochs with retirement and re-admission (ALGORITHM.md 2, 6):
what makes the `retired` ablation measure something."""

from __future__ import annotations

import numpy as np
import pytest

from exgrpo_cli.data.sampler import QuestionSampler
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
