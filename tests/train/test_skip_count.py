"""trainer.max_skipped_steps counts skipped optimizer updates in a row, across steps."""

from __future__ import annotations

from exgrpo_cli.data.sampler import QuestionSampler
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.schedule import DelayedStart
from exgrpo_cli.train.state import RunState


def _state() -> RunState:
    sampler = QuestionSampler([Question(f"p{i}", "p", "1") for i in range(8)], seed=0)
    return RunState(None, None, sampler, ExperienceBuffer(4), DelayedStart(0.0), seed=0)  # type: ignore[arg-type]


def test_an_applied_update_resets_the_count_of_skipped_ones() -> None:
    st = _state()
    st.count_updates([False, False])  # a step of two updates, both skipped
    assert st.skipped_in_a_row == 2
    st.count_updates([False, True])  # one skipped, then one applied: the run of skips is broken
    assert st.skipped_in_a_row == 0
    st.count_updates([True, False])  # the trailing skip starts a new run
    st.count_updates([False])
    assert st.skipped_in_a_row == 2
    assert st.state_dict()["skipped_in_a_row"] == 2  # checkpointed, so a resumed run keeps counting
