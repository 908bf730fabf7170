"""The sweep summary's replay figures (ablation/replay_figures.py): exact values on hand-made
metric rows, steps without replayed rows left out of the means, and the markdown section."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from exgrpo_cli.ablation import replay_figures as rf

NAN = float("nan")


def _row(
    step: int, responses: float, replayed: float, age: float = NAN, age_max: float = NAN, **kw: float
) -> dict[str, float]:
    row: dict[str, float] = {
        "step": step,
        "rollout/responses": responses,
        "replay/replayed_questions": replayed,
        "replay/age_mean": age,
        "replay/age_max": age_max,
        "rollout/mismatch_k3": 0.0,
    }
    row |= {f"replay/{k}": v for k, v in kw.items()}
    return row


def test_one_runs_figures_leave_out_the_steps_without_replayed_rows() -> None:
    rows = [
        _row(1, 64, 0, buffer_questions=3),  # nothing buffered yet: no age, no staleness (NaN)
        _row(2, 60, 4, 1.0, 1.0, staleness_logprob_diff_mean=0.02, staleness_k3=1e-4, buffer_questions=5),
        _row(3, 62, 2, 2.0, 3.0, staleness_logprob_diff_mean=0.04, staleness_k3=3e-4, buffer_questions=6),
    ]
    f = rf.run_figures(rows)
    assert f.fresh_per_step == 62.0 and f.replayed_per_step == 2.0
    assert f.age_mean == 1.5 and f.age_max == 3.0  # steps 2 and 3 only
    assert math.isclose(f.staleness_diff, 0.03) and math.isclose(f.staleness_k3, 2e-4)
    assert f.mismatch_k3 == 0.0 and f.buffer_questions == 6.0


def test_a_run_without_replay_has_no_age_and_a_variant_averages_its_seeds() -> None:
    on_policy = rf.run_figures([_row(1, 64, 0), _row(2, 64, 0)])  # replay.ratio=0 logs no replay/age_*
    assert on_policy.replayed_per_step == 0.0 and math.isnan(on_policy.age_mean)
    a = rf.run_figures([_row(1, 60, 4, 1.0, 1.0)])
    b = rf.run_figures([_row(1, 62, 2, 3.0, 5.0)])
    v = rf.variant_figures([a, b])
    assert v.fresh_per_step == 61.0 and v.age_mean == 2.0 and v.age_max == 3.0  # mean of the maxima
    assert math.isnan(rf.variant_figures([]).age_mean)


def test_the_section_and_csv(tmp_path: Path) -> None:
    rows = rf.table(
        [
            ("on-policy", [[_row(1, 64, 0)]]),
            ("exgrpo", [[_row(1, 60, 4, 1.0, 2.0, staleness_logprob_diff_mean=0.01, staleness_k3=1e-5)]]),
            ("prompt", [[_row(1, 64, 4)]]),  # replays prompts: questions but no stored row, no age
        ]
    )
    md = rf.to_markdown(rows)
    lines = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert "| 60.0 | 4.00 | 1.0 (2) | 0.0100 / 1.00e-05 |" in lines["exgrpo"]
    assert "| 64.0 | 4.00 | - | - |" in lines["prompt"]
    assert "| 64.0 | 0.00 | - | - |" in lines["on-policy"]
    rf.write_csv(rows, tmp_path / "r.csv")
    got = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [r["variant"] for r in got] == ["on-policy", "exgrpo", "prompt"]
    assert got[1]["age_mean"] == "1.0" and got[0]["age_mean"] == ""  # NaN: an empty cell
    # a sweep where nothing replayed (every variant on-policy) gets no section
    assert rf.to_markdown(rf.table([("a", [[_row(1, 64, 0)]])])) == ""
