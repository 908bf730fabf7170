"""curves.png and dynamics.png of a sweep: validation accuracy against fresh rollouts, and the
training dynamics against the step (ablation/dynamics.py), one line per variant.

Place: drawn by `exgrpo ablate` after the summary table, from summary.mean_curve of each variant:
the mean over seeds with a band of +-1 sample std (no band for a single seed). The x axis is
fresh rollouts rather than steps because a replaying variant draws fewer fresh questions per
step: the paper's claim is about learning more from the same rollouts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exgrpo_cli.ablation.summary import RunResult, mean_curve


def plot_curves(
    groups: list[tuple[str, list[RunResult]]], path: Path, title: str, baseline: str = ""
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, runs in groups:
        xs, ys, sds = mean_curve(runs)
        if not xs:
            continue
        width = 2.5 if name == baseline else 1.4
        (line,) = ax.plot(xs, ys, marker="o", markersize=3, label=f"{name} (n={len(runs)})", linewidth=width)
        if len(runs) > 1:
            ax.fill_between(
                xs,
                [y - s for y, s in zip(ys, sds)],
                [y + s for y, s in zip(ys, sds)],
                color=line.get_color(),
                alpha=0.15,
                linewidth=0,
            )
    ax.set_xlabel("fresh rollouts (responses generated)")
    ax.set_ylabel("validation accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_dynamics(
    groups: list[tuple[str, list[list[dict[str, Any]]]]], path: Path, title: str, baseline: str = ""
) -> Path:
    """dynamics.png: one panel per dynamics.PANELS metric against the step, a line per variant
    (mean over its seeds of the smoothed per-step values) with a +-1 std band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from exgrpo_cli.ablation.dynamics import PANELS, panel_band

    cols = 3
    rows = -(-len(PANELS) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(14, 3.75 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel in zip(axes.flat, PANELS):
        keys: set[str] = set()
        for i, (name, runs_rows) in enumerate(groups):
            used, steps, means, sds = panel_band(runs_rows, panel)
            if not steps:
                continue
            keys.update(used)
            color = colors[i % len(colors)]
            width = 2.2 if name == baseline else 1.2
            ax.plot(steps, means, color=color, linewidth=width, label=f"{name} (n={len(used)})")
            if len(used) > 1:
                lo = [m - s for m, s in zip(means, sds)]
                hi = [m + s for m, s in zip(means, sds)]
                ax.fill_between(steps, lo, hi, color=color, alpha=0.12, linewidth=0)
        smooth = f", mean of last {panel.smooth} steps" if panel.smooth > 1 else ""
        ax.set_title(f"{panel.title}{smooth}", fontsize=9)
        if keys:
            ax.set_ylabel(", ".join(sorted(keys)), fontsize=7)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8)
    fig.suptitle(f"{title}: mean over seeds, band +-1 std", fontsize=10)
    fig.tight_layout(rect=(0, 0.04 + 0.025 * (-(-len(labels) // 4)), 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
