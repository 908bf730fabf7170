"""The sweep's training dynamics (ablation/dynamics.py, plot.plot_dynamics) on made-up metric rows."""

from __future__ import annotations

import math
from pathlib import Path

from exgrpo_cli.ablation import dynamics as dy
from exgrpo_cli.ablation.plot import plot_dynamics


def _rows(entropy: list[float], solved_none_key: str = "reward/fresh_solved_none") -> list[dict]:
    rows: list[dict] = [{"step": 0, "val/accuracy": 0.25}]
    for i, e in enumerate(entropy, 1):
        rows.append({"step": i, "loss/entropy": e, solved_none_key: 0.5, "rollout/response_length": 10.0 * i})
    rows[-1]["val/accuracy"] = 0.5
    return rows


def test_series_takes_the_first_key_the_run_logged():
    rows = _rows([0.5, 1.0], solved_none_key="reward/solved_none")  # a run from before fresh_solved_none
    rows[1]["loss/entropy"] = float("nan")  # non-finite values are no points
    assert dy.series(rows, ("loss/entropy",)) == ("loss/entropy", [(2, 1.0)])
    assert dy.series(rows, ("reward/fresh_solved_none", "reward/solved_none")) == (
        "reward/solved_none",
        [(1, 0.5), (2, 0.5)],
    )
    assert dy.series(rows, ("nope",)) == ("", [])


def test_smooth_is_a_trailing_mean():
    pts = [(1, 1.0), (2, 3.0), (3, 5.0), (4, 7.0)]
    assert dy.smooth(pts, 2) == [(1, 1.0), (2, 2.0), (3, 4.0), (4, 6.0)]
    assert dy.smooth(pts, 1) == pts


def test_band_over_seeds_at_common_steps():
    steps, means, sds = dy.band([[(1, 1.0), (2, 2.0), (3, 3.0)], [(2, 4.0), (3, 5.0)], []])
    assert steps == [2, 3] and means == [3.0, 4.0]
    assert sds == [math.sqrt(2.0), math.sqrt(2.0)]  # sample std of (2, 4) and (3, 5)
    assert dy.band([[(1, 1.0)]]) == ([1], [1.0], [0.0])  # one run: no band
    assert dy.band([]) == ([], [], [])


def test_panel_band_smooths_each_run_then_averages():
    panel = dy.Panel("entropy", ("loss/entropy",), 2)
    used, steps, means, sds = dy.panel_band([_rows([1.0, 3.0]), _rows([3.0, 5.0])], panel)
    assert used == ["loss/entropy", "loss/entropy"] and steps == [1, 2]
    assert means == [2.0, 3.0]  # smoothed runs: (1, 2) and (3, 4)
    assert sds == [math.sqrt(2.0), math.sqrt(2.0)]


def test_plot_dynamics_draws_every_panel(tmp_path: Path):
    groups = [
        ("on-policy", [_rows([0.5, 0.6, 0.9]), _rows([0.4, 0.7, 1.0])]),
        ("ExGRPO", [_rows([0.5, 0.4, 0.3], solved_none_key="reward/solved_none")]),
        ("no runs", []),
    ]
    out = plot_dynamics(groups, tmp_path / "d.png", "toy", baseline="on-policy")
    assert out.stat().st_size > 20000
    assert [p.keys[0] for p in dy.PANELS][:1] == ["val/accuracy"]
    assert {"loss/entropy", "rollout/response_length", "reward/fresh_solved_none"} <= {
        k for p in dy.PANELS for k in p.keys
    }
