"""What a run computes is pinned: steps 0-3 of the default run and of a replaying run, through the real CLI.

The expected rows (tests/train/pinned_metrics.json, which says when and why they were recorded) are what
the code computes; a refactor must reproduce them. Timings and metrics added later (memory/*) are not
compared; a pinned key that disappears is a failure. Sampling makes one changed token change everything
after it, so a match to 1e-6 means the same computation, not a similar one. One metric is float noise by
definition: rollout/logprob_diff_mean (~1e-7, the gap between two computations of the same log-probs)
is held to 1e-6 absolute, not to its own digits.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import metrics, train_ok

PINNED = json.loads((Path(__file__).parent / "pinned_metrics.json").read_text())
REL_TOL = 1e-6
NOISE_ABS = {"rollout/logprob_diff_mean": 1e-6}


def _mismatches(expected: list[dict], got: list[dict]) -> list[str]:
    found = {row["step"]: row for row in got}
    bad = []
    for want in expected:
        row = found.get(want["step"])
        if row is None:
            bad.append(f"step {want['step']}: missing")
            continue
        for key, value in want.items():
            if key not in row:
                bad.append(f"step {want['step']} {key}: missing")
            elif value is None or row[key] is None:
                if value != row[key]:
                    bad.append(f"step {want['step']} {key}: {row[key]} != {value}")
            elif not math.isclose(row[key], value, rel_tol=REL_TOL, abs_tol=NOISE_ABS.get(key, 1e-9)):
                bad.append(f"step {want['step']} {key}: {row[key]!r} != pinned {value!r}")
    return bad


def test_mismatch_report_catches_a_changed_value():
    rows = PINNED["runs"]["default"]["rows"]
    changed = [dict(row) for row in rows]
    changed[1]["loss/total"] *= 1 + 1e-4
    del changed[2]["optim/grad_norm"]
    assert _mismatches(rows, rows) == []
    assert len(_mismatches(rows, changed)) == 2
    noisy = [dict(row) for row in rows]
    noisy[1]["rollout/logprob_diff_mean"] += 5e-7  # float noise: held to 1e-6 absolute
    assert _mismatches(rows, noisy) == []
    noisy[1]["rollout/logprob_diff_mean"] += 2e-6
    assert len(_mismatches(rows, noisy)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(PINNED["runs"]))
def test_run_reproduces_pinned_metrics(run: str, tiny_model: Path, tmp_path: Path):
    pinned = PINNED["runs"][run]
    train_ok(tmp_path, *pinned["overrides"])
    assert _mismatches(pinned["rows"], metrics(tmp_path)) == []


@pytest.mark.slow
def test_reward_math_at_another_threshold_is_todays_run(tiny_model: Path, tmp_path: Path):
    """reward=math named explicitly, with a threshold of "correct" other than the default 1: for
    0/1 rewards any threshold in (0, 1] is today's rule, so the default run's pinned rows hold."""
    pinned = PINNED["runs"]["default"]
    overrides = [*pinned["overrides"], "reward=math", "reward.correct_at=0.5"]
    train_ok(tmp_path, *overrides)
    got = metrics(tmp_path)
    assert _mismatches(pinned["rows"], got) == []
    assert all(row["reward/mean"] == row["reward/accuracy"] for row in got if "reward/mean" in row)
