"""The judgement and dynamics files of a sweep: comparisons.csv, dynamics.png, summary.md's section.

Place: the last stage of `exgrpo ablate` (commands/ablate.py summarize_dir), after the summary table
and curves.png: each variant against its reference (ablation/compare.py) and the per-step training
dynamics of every finished run (ablation/dynamics.py, drawn by plot.plot_dynamics).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exgrpo_cli.ablation import compare as cp
from exgrpo_cli.ablation.summary import RunResult

COMPARISONS_CSV = "comparisons.csv"
DYNAMICS_PNG = "dynamics.png"


def write_judgement(
    sweep: Path,
    groups: list[tuple[str, list[RunResult]]],
    metric_rows: list[tuple[str, list[list[dict[str, Any]]]]],
    baseline: str,
    compare_to: dict[str, str],
    title: str,
) -> str:
    """Write comparisons.csv and dynamics.png into the sweep dir; return the markdown section.

    A compare_to entry naming a variant the sweep does not have is an error (ValueError)."""
    from exgrpo_cli.ablation.plot import plot_dynamics

    cp.check_compare_to(compare_to, [name for name, _ in groups])
    rows = cp.compare(groups, baseline, compare_to)
    cp.write_csv(rows, sweep / COMPARISONS_CSV)
    plot_dynamics(metric_rows, sweep / DYNAMICS_PNG, title, baseline)
    return cp.to_markdown(rows)
