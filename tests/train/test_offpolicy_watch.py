"""The warning band below `rollout.max_logprob_diff` and the off-policy metrics of a real run.

Unit: `MismatchWatch` prints one line per upward crossing of `rollout.warn_logprob_diff` (not one
per step above it) and one when the gap has risen at each of the last `window` steps; rounding
noise that rises by less than TREND_MIN_RISE raises nothing. End to end with the stand-in vLLM
(tests/rollout/fake_vllm): an engine whose log-probs drift 0.01 nats/token lower at every
generation gets a warning and a trend alarm and trains on; one shifted by a whole nat hits
token_tis's cap and leaves geo_mask's band on every token, as worked out by hand.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from exgrpo_cli.step.offpolicy import TREND_MIN_RISE, MismatchWatch

from conftest import FAKE_VLLM_ENV, metrics, train_ok


def test_one_warning_per_crossing_and_a_trend_alarm() -> None:
    watch = MismatchWatch(warn=0.1, window=3)
    gaps = [0.02, 0.03, 0.05, 0.12, 0.15, 0.08, 0.11, 0.09, 0.09]
    seen = [watch.observe(step, g) for step, g in enumerate(gaps, start=1)]
    assert [m["rollout/logprob_diff_warn"] for m in seen] == [0, 0, 0, 1, 1, 0, 1, 0, 0]
    # rising at each of 3 steps in a row: steps 2..5 (0.02 -> 0.15), held while it keeps rising
    assert [m["rollout/logprob_diff_rising"] for m in seen] == [0, 0, 0, 1, 1, 0, 0, 0, 0]
    lines = watch.take_lines()
    assert watch.take_lines() == []  # each line is printed once
    assert sum("rollout.warn_logprob_diff" in line for line in lines) == 2  # steps 4 and 7
    assert sum("rose at each of the last 3 steps" in line for line in lines) == 1
    assert any(line.startswith("warning: step 4:") for line in lines)


def test_noise_and_nan() -> None:
    watch = MismatchWatch(warn=0.1, window=3)
    tiny = [1e-7 * k for k in range(1, 8)]  # an fp32 run: rising, but by far less than TREND_MIN_RISE
    assert not any(watch.observe(s, g)["rollout/logprob_diff_rising"] for s, g in enumerate(tiny))
    assert tiny[-1] - tiny[0] < TREND_MIN_RISE
    assert watch.observe(9, math.nan)["rollout/logprob_diff_warn"] == 1.0
    off = MismatchWatch(warn=None, window=0)
    assert off.observe(1, 5.0) == {"rollout/logprob_diff_warn": 0.0, "rollout/logprob_diff_rising": 0.0}
    # under top-p the band widens by -log(top_p), as the stop's limit
    assert MismatchWatch(warn=0.1, window=0, top_p=0.5).observe(1, 0.7)["rollout/logprob_diff_warn"] == 0


ARGS = [
    "rollout=vllm",
    "trainer.threads=1",
    "algo.questions_per_step=2",
    "rollout.n=2",
    "model.max_response_tokens=12",
    "trainer.val_questions=2",
    "trainer.val_samples=1",
]


def _run(tmp_path: Path, overrides: list[str], env: dict[str, str]) -> tuple[object, list[dict]]:
    res = train_ok(tmp_path / "run", *ARGS, *overrides, env_extra=FAKE_VLLM_ENV | env)
    return res, [r for r in metrics(tmp_path / "run") if r["step"] > 0]


@pytest.mark.slow
def test_a_slowly_drifting_engine_warns_and_alarms_but_does_not_stop(
    tiny_model: Path, tmp_path: Path
) -> None:
    overrides = ["trainer.steps=6", "rollout.warn_logprob_diff=0.035", "rollout.logprob_diff_trend_window=3"]
    res, rows = _run(tmp_path, overrides, {"EXGRPO_STANDIN_LOGP_DRIFT": "0.01"})
    gaps = [r["rollout/logprob_diff_mean"] for r in rows]
    assert len(rows) == 6 and all(b - a == pytest.approx(0.01, abs=1e-4) for a, b in zip(gaps, gaps[1:]))
    assert gaps[-1] < 0.5  # below the stop: the run trained all 6 steps
    console = res.stdout + res.stderr  # type: ignore[attr-defined]
    log = (tmp_path / "run" / "train.log").read_text()
    for text in (console, log):  # on the terminal and in the run's log, once per crossing
        assert text.count("past rollout.warn_logprob_diff=0.035") == 1, text[-3000:]
        assert text.count("rose at each of the last 3 steps") == 1
    first_warn = next(r["step"] for r in rows if r["rollout/logprob_diff_warn"])
    assert all(r["rollout/logprob_diff_warn"] for r in rows if r["step"] >= first_warn)
    assert rows[-1]["rollout/logprob_diff_rising"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["token_tis", "geo_mask"])
def test_a_shifted_engine_hits_the_cap_and_leaves_the_band(
    tiny_model: Path, tmp_path: Path, mode: str
) -> None:
    """Every engine log-prob 1 nat below the trainer's: r = e on every fresh token, so token_tis
    weighs each by the cap 2 and geo_mask drops every sequence (e > 1.01); k3 = e - 2 per token and
    every ratio is outside [0.5, 2]."""
    overrides = ["trainer.steps=2", "rollout.max_logprob_diff=2", f"algo.rollout_correction.mode={mode}"]
    _, rows = _run(tmp_path, overrides, {"EXGRPO_STANDIN_LOGP_SHIFT": "1.0"})
    for r in rows:
        assert r["rollout/logprob_diff_mean"] == pytest.approx(1.0, abs=1e-4)
        assert r["rollout/mismatch_k3"] == pytest.approx(math.e - 2, abs=1e-3)
        assert r["rollout/mismatch_ratio_outside"] == 1.0 and r["loss/correction_cut"] == 1.0
        assert r["loss/correction_weight_mean"] == (2.0 if mode == "token_tis" else 0.0)
