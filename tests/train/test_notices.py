"""The delayed start is never silent: the live status, the one-time warning and the summary."""

from __future__ import annotations

import math

import pytest

from exgrpo_cli.replay.schedule import DelayedStart
from exgrpo_cli.run.notices import (
    MIN_WAIT_STEPS,
    delayed_start_warning,
    empty_buffer_warning,
    replay_status,
    replay_summary,
    warning_step,
)

# ----------------------------------------------------------------------------- live status


def test_status_while_replay_waits() -> None:
    assert replay_status(0.5, False, 0.35, 0.125) == "replay waits: acc 0.125 < 0.35"
    assert replay_status(0.5, False, 0.35, 0.3499) == "replay waits: acc 0.349 < 0.35"  # rounded down
    assert replay_status(0.5, False, 0.35, 0.0) == "replay waits: acc 0.000 < 0.35"
    assert replay_status(0.5, False, 0.35, math.nan) == "replay waits: acc < 0.35"
    assert replay_status(0.5, False, 0.35, None) == "replay waits: acc < 0.35"


def test_no_status_once_replay_runs_or_when_it_is_off() -> None:
    assert replay_status(0.5, True, 0.35, 0.125) == ""
    assert replay_status(0.0, False, 0.35, 0.125) == ""  # replay.ratio=0: on-policy by choice


# ----------------------------------------------------------------------------- the warning


@pytest.mark.parametrize(("total", "due"), [(10, 20), (60, 20), (200, 20), (201, 21), (500, 50), (700, 70)])
def test_the_warning_is_due_after_a_tenth_of_the_run_and_at_least_20_steps(total: int, due: int) -> None:
    assert warning_step(total) == due
    assert MIN_WAIT_STEPS == 20


def _warnings(
    total: int, start: int = 1, active_from: int | None = None, ratio: float = 0.5, threshold: float = 0.35
) -> list[tuple[int, str]]:
    """(step, message) for each warning of a run from `start` to `total`, keeping `warned` as
    run/training.py does."""
    said: list[tuple[int, str]] = []
    warned = False
    for step in range(start, total + 1):
        active = active_from is not None and step >= active_from
        msg = delayed_start_warning(step, total, active, threshold, ratio, warned, accuracy=0.2)
        if msg is not None:
            said.append((step, msg))
            warned = True
    return said


def test_the_warning_comes_once_with_the_way_out() -> None:
    ((step, msg),) = _warnings(500)
    assert step == 50
    assert msg == (
        "replay has not started after 50 of 500 steps: the fresh accuracy has stayed below "
        "replay.start_threshold=0.35 (last step: 0.200), so ExGRPO is training as on-policy GRPO so "
        "far. To replay, start a run with a lower replay.start_threshold=<value> (0: replay from step 2, "
        "the paper's setting for a weak starting model, Llama-3.1-8B); a resumed run keeps its "
        "checkpoint's threshold"
    )


def test_no_warning_when_replay_started_in_time_or_is_off() -> None:
    assert _warnings(500, active_from=49) == []
    assert _warnings(500, active_from=50) == []  # the step that fires the switch is not waiting
    assert _warnings(500, ratio=0.0) == []  # replay.ratio=0: nothing to start
    assert _warnings(500, active_from=1, threshold=0.0) == []  # threshold 0 fires at step 1


def test_short_runs_get_no_warning_only_the_summary() -> None:
    assert _warnings(10) == []
    assert _warnings(20) == []  # due at step 20, the last: the summary says it
    assert [s for s, _ in _warnings(21)] == [20]


def test_a_resumed_run_warns_once_at_its_first_step_when_overdue() -> None:
    assert [s for s, _ in _warnings(500, start=301)] == [301]
    assert _warnings(500, start=301, active_from=120) == []


def test_a_warning_already_given_is_not_repeated() -> None:
    assert delayed_start_warning(60, 500, False, 0.35, 0.5, warned=True) is None
    msg = delayed_start_warning(60, 500, False, 0.35, 0.5, warned=False)
    assert msg is not None and msg.startswith("replay has not started after 60 of 500 steps:")
    assert "(last step" not in msg  # no accuracy given


# ----------------------------------------------------------------------------- the summary


def test_summary_says_when_replay_started() -> None:
    assert replay_summary(0.5, True, 12, 0.35, 60) == (
        "replay: started at step 12 (the fresh accuracy reached replay.start_threshold=0.35); "
        "experiences replayed from step 13"
    )
    assert replay_summary(0.5, True, 1, 0.0, 60) == (
        "replay: started at step 1 (the fresh accuracy reached replay.start_threshold=0); "
        "experiences replayed from step 2"
    )
    assert replay_summary(0.5, True, 60, 0.35, 60) == (
        "replay: the delayed start fired at step 60, the last one (replay.start_threshold=0.35): "
        "nothing was replayed"
    )


def test_summary_says_replay_never_started() -> None:
    msg = replay_summary(0.5, False, None, 0.35, 60)
    assert msg is not None
    assert msg.startswith(
        "replay never started: the fresh accuracy stayed below replay.start_threshold=0.35 in all 60 "
        "steps, so this run was on-policy GRPO. To replay, start a run with a lower "
        "replay.start_threshold=<value>"
    )


def test_summary_is_silent_with_replay_off() -> None:
    assert replay_summary(0.0, False, None, 0.35, 60) is None
    assert replay_summary(0.0, True, 3, 0.35, 60) is None


# ----------------------------------------------------------------------------- with the real switch


def test_a_run_of_the_real_switch_says_each_thing_once() -> None:
    """The calls run/training.py makes, step by step, around DelayedStart."""
    switch = DelayedStart(0.35)
    total, fires_at = 100, 30
    statuses, warnings = [], []
    warned = False
    for step in range(1, total + 1):
        acc = 0.4 if step >= fires_at else step / 100
        switch.update(step, acc)
        statuses.append(replay_status(0.5, switch.active, switch.threshold, acc))
        msg = delayed_start_warning(step, total, switch.active, switch.threshold, 0.5, warned, acc)
        if msg:
            warnings.append(step)
            warned = True
    assert statuses[0] == "replay waits: acc 0.010 < 0.35"
    assert statuses[fires_at - 2] == "replay waits: acc 0.290 < 0.35"
    assert statuses[fires_at - 1 :] == [""] * (total - fires_at + 1)
    assert warnings == [20]
    assert replay_summary(0.5, switch.active, switch.started_at, switch.threshold, total) == (
        "replay: started at step 30 (the fresh accuracy reached replay.start_threshold=0.35); "
        "experiences replayed from step 31"
    )


# ----------------------------------------------------------------------------- the empty buffer


def _empty_buffer_said(
    total: int, top: float, correct_at: float = 1.0, active: bool = True, buffered: float | None = 0.0
) -> list[tuple[int, str]]:
    said, warned = [], False
    for step in range(1, total + 1):
        msg = empty_buffer_warning(step, total, 0.5, active, buffered, top, correct_at, warned)
        if msg is not None:
            said.append((step, msg))
            warned = True
    return said


def test_an_empty_buffer_under_an_unreached_threshold_is_said_once_with_the_fix() -> None:
    """reward=model with sigmoid scores (< 1) under reward.correct_at=1: nothing is ever correct, so
    the buffer stays empty whether or not the delayed start fired; the run says so once."""
    for active in (False, True):
        ((step, msg),) = _empty_buffer_said(60, top=0.93, active=active)
        assert step == warning_step(60) == 20
        assert "no response has reached reward.correct_at=1 (the highest reward so far: 0.93)" in msg
        assert msg.endswith("Set reward.correct_at to the reward a good answer reaches (here at most 0.93)")


def test_an_empty_buffer_with_correct_responses_is_said_only_once_replay_runs() -> None:
    assert _empty_buffer_said(60, top=1.0, active=False) == []  # the delayed-start warning speaks
    ((_, msg),) = _empty_buffer_said(60, top=1.0, active=True)
    assert "although replay runs" in msg and "reward.correct_at=1" in msg


def test_no_empty_buffer_warning_with_a_buffer_or_with_replay_off() -> None:
    assert _empty_buffer_said(60, top=0.5, buffered=3.0) == []
    assert _empty_buffer_said(60, top=0.5, buffered=None) == []  # no buffer: replay disabled
    assert empty_buffer_warning(30, 60, 0.0, False, 0.0, 0.5, 1.0, False) is None  # ratio 0
    assert _empty_buffer_said(10, top=0.5) == []  # a short run: nothing left to change
