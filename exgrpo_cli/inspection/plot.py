"""buffer.png for `exgrpo inspect-buffer inspect.plot=true`: three panels drawn from the report dict.

Panels: questions and experiences per bucket, the stored response lengths, and the per-experience
mean behaviour log-prob. matplotlib is imported here only (Agg backend: no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn
    from matplotlib.axes import Axes


def _hist(ax: Axes, dist: dict[str, Any], title: str, xlabel: str, empty: str = "empty") -> None:
    from matplotlib.ticker import MaxNLocator

    h = dist["histogram"]
    if h["counts"]:
        edges = h["edges"]
        widths = [b - a for a, b in zip(edges, edges[1:])]
        ax.bar(edges[:-1], h["counts"], width=widths, align="edge", color="tab:green", edgecolor="white")
    else:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("experiences")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def plot_report(rep: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    ax = axes[0]
    labels = [f"{b['accuracy']:.2f}" for b in rep["buckets"]]
    xs = list(range(len(labels)))
    # Two y axes: a bucket's experiences are several times its questions.
    q = ax.bar([x - 0.2 for x in xs], [b["questions"] for b in rep["buckets"]], width=0.4, label="questions")
    ax2 = ax.twinx()
    e = ax2.bar(
        [x + 0.2 for x in xs],
        [b["experiences"] for b in rep["buckets"]],
        width=0.4,
        color="tab:purple",
        label="experiences",
    )
    ax.set_xticks(xs, labels)
    ax.set_xlabel("bucket (latest accuracy)")
    ax.set_ylabel("questions")
    ax2.set_ylabel("experiences")
    for a in (ax, ax2):
        a.yaxis.set_major_locator(MaxNLocator(integer=True))
    if not rep["experiences"]:  # matplotlib would centre an all-zero axis on 0, with negative ticks
        ax2.set_ylim(0, 1)
    ax.set_title("questions and experiences per bucket")
    ax.legend([q, e], ["questions", "experiences"], fontsize=8, loc="upper left")
    fig.suptitle(
        f"replay buffer at step {rep.get('step')}: {rep['questions']} questions, "
        f"{rep['experiences'] if rep.get('stores') != 'prompts only' else 'prompts only, no'} experiences, "
        f"{rep['retired']} retired"
    )
    # a prompts-only buffer (replay.method=prompt) stores no response: say so, not "empty"
    empty = "prompts only: no stored response" if rep.get("stores") == "prompts only" else "empty"
    _hist(axes[1], rep["response_length"], "stored response length", "tokens", empty)
    _hist(axes[2], rep["behavior_logp_mean"], "behaviour log-prob (mean per experience)", "log-prob", empty)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
