"""What a run says about its delayed start (replay/schedule.py), so that an ExGRPO run that never
replays does not pass for one that does.

Pure functions of the switch's state, for run/training.py to print:
- `replay_status`: the live line's fragment while replay waits, e.g. "replay waits: acc 0.125 < 0.35";
- `delayed_start_warning`: once, when replay has waited for a sizeable share of the run
  (WAIT_SHARE of the steps, at least MIN_WAIT_STEPS) and part of the run is still to come;
- `replay_summary`: at the end, the step replay started at, or that it never did;
- `empty_buffer_warning`: once, at the same step as the delayed-start warning, when the buffer is
  still empty because nothing has been correct (no reward has reached `reward.correct_at`), or
  because nothing partly solved was stored although replay runs.
With `replay.ratio=0` replay is off by choice: nothing is said. The start-up counterpart, for a
threshold the reward kind provably cannot reach, is reward/stage.py's `unreachable_threshold`.
"""

from __future__ import annotations

import math

WAIT_SHARE = 0.10  # the share of the run's steps replay may wait before the warning
MIN_WAIT_STEPS = 20  # ... and never fewer steps than this

LOWER_HINT = (
    "start a run with a lower replay.start_threshold=<value> (0: replay from step 2, the paper's "
    "setting for a weak starting model, Llama-3.1-8B); a resumed run keeps its checkpoint's threshold"
)


def waiting(ratio: float, active: bool) -> bool:
    """Replay is on (ratio > 0) and the delayed start has not fired yet."""
    return ratio > 0 and not active


def _acc(accuracy: float) -> str:
    """Below the threshold, shown rounded down: 0.3499 is "0.349", never "0.350 < 0.35"."""
    return f"{math.floor(accuracy * 1000) / 1000:.3f}"


def replay_status(ratio: float, active: bool, threshold: float, accuracy: float | None) -> str:
    """The live line's fragment for a step: "" unless replay waits; `accuracy` is the step's fresh
    accuracy (`reward/accuracy`)."""
    if not waiting(ratio, active):
        return ""
    if accuracy is None or not math.isfinite(accuracy):
        return f"replay waits: acc < {threshold:g}"
    return f"replay waits: acc {_acc(accuracy)} < {threshold:g}"


def warning_step(total_steps: int) -> int:
    """The step at which replay has waited long enough to warn: WAIT_SHARE of the run, at least
    MIN_WAIT_STEPS."""
    return max(MIN_WAIT_STEPS, math.ceil(WAIT_SHARE * total_steps))


def delayed_start_warning(
    step: int,
    total_steps: int,
    active: bool,
    threshold: float,
    ratio: float,
    warned: bool,
    accuracy: float | None = None,
) -> str | None:
    """The one-time warning, at the end of `step`, that ExGRPO trains as on-policy GRPO because
    replay has not started; None when it is not due, or was already given (`warned`), or when
    there is nothing left to change in this run (its last step: the summary says it)."""
    if warned or not waiting(ratio, active) or step < warning_step(total_steps) or step >= total_steps:
        return None
    last = f" (last step: {_acc(accuracy)})" if accuracy is not None and math.isfinite(accuracy) else ""
    return (
        f"replay has not started after {step} of {total_steps} steps: the fresh accuracy has stayed "
        f"below replay.start_threshold={threshold:g}{last}, so ExGRPO is training as on-policy GRPO "
        f"so far. To replay, {LOWER_HINT}"
    )


def replay_summary(
    ratio: float, active: bool, started_at: int | None, threshold: float, last_step: int
) -> str | None:
    """The end-of-run line: when replay started, or that it never did; None with replay off."""
    if ratio <= 0:
        return None
    if active and started_at is not None:
        if started_at >= last_step:
            return (
                f"replay: the delayed start fired at step {started_at}, the last one "
                f"(replay.start_threshold={threshold:g}): nothing was replayed"
            )
        # step 0 is before any rollout: a buffer carried in (replay.init_from, run/setup.py)
        why = (
            f"a carried buffer (replay.init_from) and replay.start_threshold={threshold:g}"
            if started_at == 0
            else f"the fresh accuracy reached replay.start_threshold={threshold:g}"
        )
        return (
            f"replay: started at step {started_at} ({why}); experiences replayed from step {started_at + 1}"
        )
    return (
        f"replay never started: the fresh accuracy stayed below replay.start_threshold={threshold:g} "
        f"in all {last_step} steps, so this run was on-policy GRPO. To replay, {LOWER_HINT}"
    )


def empty_buffer_warning(
    step: int,
    total_steps: int,
    ratio: float,
    active: bool,
    buffered: float | None,
    top_reward: float | None,
    correct_at: float,
    warned: bool,
) -> str | None:
    """The one-time warning, at the end of `step` (when the delayed-start warning is due), that the
    replay buffer is empty: `buffered` questions in it (None: no buffer), `top_reward` the highest
    fresh reward of the run so far. When no reward has reached `correct_at`, nothing can be stored,
    whatever the delayed start does: the warning names the threshold. When some have, it speaks
    only once replay runs (`active`); before that the delayed-start warning says why."""
    if warned or ratio <= 0 or buffered is None or buffered > 0:
        return None
    if step < warning_step(total_steps) or step >= total_steps:
        return None
    head = f"the replay buffer is still empty after {step} of {total_steps} steps"
    if top_reward is not None and math.isfinite(top_reward) and top_reward < correct_at:
        return (
            f"{head}: no response has reached reward.correct_at={correct_at:g} (the highest reward so "
            f"far: {top_reward:.4g}), so nothing is stored or retired, reward/accuracy stays 0 and "
            "ExGRPO trains as on-policy GRPO. Set reward.correct_at to the reward a good answer "
            f"reaches (here at most {top_reward:.4g})"
        )
    if not active:
        return None
    return (
        f"{head} although replay runs: no group has been partly solved (some, not all, of its "
        f"responses at or above reward.correct_at={correct_at:g}), so nothing is replayed. Check that "
        "reward.correct_at separates good answers from the others"
    )
