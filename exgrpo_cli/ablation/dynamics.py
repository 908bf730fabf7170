"""What a sweep's runs did along the way: per-step training metrics, mean and band over seeds.

Place: `exgrpo ablate`'s summary (ablation/report.py summarize_dir) reads every finished run's
metrics.jsonl (summary.read_metrics) and plot.plot_dynamics draws these series as dynamics.png:
the quantities a collapse shows in (token entropy, response length, the share of fresh groups with
no correct response, the training accuracy on fresh-drawn and on replayed questions apart, the
gradient norm) next to validation accuracy, all against the step. Pure maths here; no plotting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from exgrpo_cli.ablation.summary import finite_number, mean_std


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]  # metric names, first preferred: a run without the first uses the next
    smooth: int  # moving-average window in steps (1: raw); per-step metrics are noisy


# reward/fresh_solved_none counts only the groups of fresh questions (a replayed group always holds
# a correct response); runs logged before it existed fall back to reward/solved_none.
PANELS = (
    Panel("validation accuracy", ("val/accuracy",), 1),
    # reward/accuracy pools both origins; apart they show whether a rising training accuracy is
    # on new questions or on the few the buffer keeps replaying (runs before the split: no line)
    Panel("train accuracy, questions drawn fresh", ("reward/accuracy_fresh_questions",), 5),
    Panel("train accuracy, replayed questions", ("reward/accuracy_replayed_questions",), 5),
    Panel("token entropy of the update", ("loss/entropy",), 5),
    Panel("response length (fresh, tokens)", ("rollout/response_length",), 5),
    Panel("fresh groups with no correct response", ("reward/fresh_solved_none", "reward/solved_none"), 5),
    Panel("gradient norm", ("optim/grad_norm",), 5),
)


def series(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> tuple[str, list[tuple[int, float]]]:
    """(key used, [(step, value)]) of the first key in `keys` the run logged a finite value of."""
    for key in keys:
        pts = [(int(r["step"]), v) for r in rows if (v := finite_number(r.get(key))) is not None]
        if pts:
            return key, pts
    return "", []


def smooth(points: list[tuple[int, float]], window: int) -> list[tuple[int, float]]:
    """Trailing moving average over the last `window` points (fewer at the start)."""
    out = []
    for i, (step, _) in enumerate(points):
        part = [v for _, v in points[max(0, i - window + 1) : i + 1]]
        out.append((step, sum(part) / len(part)))
    return out


def band(runs: list[list[tuple[int, float]]]) -> tuple[list[int], list[float], list[float]]:
    """Steps every run has, the mean over runs there and the sample std (0 for one run)."""
    runs = [r for r in runs if r]
    if not runs:
        return [], [], []
    common = sorted(set.intersection(*({s for s, _ in r} for r in runs)))
    lookup = [dict(r) for r in runs]
    means, sds = [], []
    for step in common:
        m, s = mean_std([d[step] for d in lookup])
        means.append(m)
        sds.append(0.0 if math.isnan(s) else s)
    return common, means, sds


def panel_band(
    runs_rows: list[list[dict[str, Any]]], panel: Panel
) -> tuple[list[str], list[int], list[float], list[float]]:
    """The keys the runs used (one each) and the seed band of the panel's smoothed series."""
    used, curves = [], []
    for rows in runs_rows:
        key, pts = series(rows, panel.keys)
        if pts:
            used.append(key)
            curves.append(smooth(pts, panel.smooth))
    return (used, *band(curves))
