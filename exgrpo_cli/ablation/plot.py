"""curves.png of a sweep: validation accuracy against fresh rollouts, one line per variant.

Place: drawn by `exgrpo ablate` after the summary table, from summary.mean_curve of each variant:
the mean over seeds with a band of +-1 sample std (no band for a single seed). The x axis is
fresh rollouts rather than steps because a replaying variant draws fewer fresh questions per
step: the paper's claim is about learning more from the same rollouts.
"""

from __future__ import annotations

from pathlib import Path

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
