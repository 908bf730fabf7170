"""The off-policy figures of real CPU runs (issue 35's "Done when"), through the CLI.

- The default ExGRPO run logs the replay age, the staleness and the w / f(w) by age band of its
  replayed rows and the engine mismatch of its fresh ones (every figure documented in
  docs/metrics.md); without an age limit its replayed rows grow older than 3 steps.
- `replay.max_age=3`: experiences expire (`replay/expired`) and no replayed row is older than 3
  steps (`replay/age_max`), where the same run without the limit replays older ones.
- `algo.rollout_correction.mode=token_tis` trains the default on the HF engine, on 1 rank and on
  2 (torchrun, each rank's tokens summed before the means), weights ~1 as the engine is the
  trainer's own model.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import SMALL_RUN, metrics, torchrun_ok, train_ok

pytestmark = pytest.mark.slow
# 8 questions a step, replay from step 1: the tiny model leaves partly solved questions to replay
RUN = [*SMALL_RUN, "algo.questions_per_step=8", "replay.start_threshold=0", "logger.console=false"]
AGE_KEYS = ("replay/age_mean", "replay/age_p50", "replay/age_p90", "replay/age_max")
MISMATCH_KEYS = ("rollout/logprob_diff_mean", "rollout/mismatch_k3", "rollout/mismatch_ratio_outside")
STALENESS_KEYS = (
    "replay/staleness_logprob_diff_mean",
    "replay/staleness_k3",
    "replay/staleness_ratio_outside",
)


def _train(tmp_path: Path, name: str, *overrides: str) -> list[dict]:
    train_ok(tmp_path / name, *RUN, *overrides)
    return [r for r in metrics(tmp_path / name) if r["step"] > 0]


def _replaying(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["replay/replayed_questions"] > 0]


@pytest.mark.long  # two 6-step runs: make test-long (docs/testing.md)
def test_the_default_logs_age_and_mismatch_and_max_age_caps_the_age(tmp_path: Path) -> None:
    default = _train(tmp_path, "default", "trainer.steps=6")
    replaying = _replaying(default)
    assert len(replaying) >= 5
    for r in default:
        assert all(math.isfinite(r[k]) for k in MISMATCH_KEYS)
        assert r["rollout/logprob_diff_mean"] < 1e-4  # HF engine: the trainer's own weights, fp32
    for r in replaying:
        assert all(math.isfinite(r[k]) for k in (*AGE_KEYS, *STALENESS_KEYS))
        assert 1 <= r["replay/age_p50"] <= r["replay/age_max"]
        assert math.isfinite(r["replay/w_mean/age_1-2"]) or math.isfinite(r["replay/w_mean/age_3-8"])
    assert "replay/expired" not in default[-1]  # no limit: nothing to count
    assert max(r["replay/age_max"] for r in replaying) > 3  # what max_age=3 must prevent

    capped = _train(tmp_path, "capped", "trainer.steps=6", "replay.max_age=3")
    replaying = _replaying(capped)
    assert replaying and max(r["replay/age_max"] for r in replaying) <= 3
    assert capped[-1]["replay/expired"] > 0
    assert [r["replay/expired"] for r in capped] == sorted(
        r["replay/expired"] for r in capped
    )  # a running count


def test_token_tis_trains_the_default_on_the_hf_engine(tmp_path: Path) -> None:
    rows = _train(tmp_path, "tis", "trainer.steps=3", "algo.rollout_correction.mode=token_tis")
    for r in rows:
        # the HF engine samples the trainer's own module: every ratio is 1 up to fp32 rounding
        assert r["loss/correction_weight_mean"] == pytest.approx(1.0, abs=1e-5)
        assert r["loss/correction_cut"] == 0.0 and r["optim/skipped_steps"] == 0.0
    assert _replaying(rows)


@pytest.mark.long  # make test-all only (docs/testing.md): two ranks under torchrun
def test_token_tis_on_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train = ["-m", "exgrpo_cli", "train", *RUN, "trainer.steps=2", "algo.questions_per_step=4"]
    torchrun_ok(*train, "algo.rollout_correction.mode=token_tis", f"hydra.run.dir={out}", cwd=tmp_path)
    rows = [r for r in metrics(out) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["rollout/responses"] == 16.0  # both ranks' groups: 4 questions x 4 responses
    for r in rows:
        assert r["loss/correction_weight_mean"] == pytest.approx(1.0, abs=1e-5)
