"""The text view of inspect-buffer: turns report.buffer_report's dict into rich renderables.

Bars are drawn with block characters (not a plot) so the view works in any terminal and in a log.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from exgrpo_cli.inspection.report import STATS

BAR_WIDTH = 30


def bar(value: float, largest: float, width: int = BAR_WIDTH) -> str:
    """A bar of `width * value / largest` full blocks, with eighth-blocks for the remainder."""
    if largest <= 0 or value <= 0:
        return ""
    eighths = round(8 * width * value / largest)
    full, part = divmod(eighths, 8)
    return "█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:.{digits}f}"
    return f"{int(x)}" if isinstance(x, (int, float)) else str(x)


def _header(rep: dict[str, Any]) -> Table:
    ds = rep.get("delayed_start") or {}
    if not ds:
        start = "unknown (no trainer_state.json)"
    elif ds.get("active"):
        start = f"active since step {ds.get('started_at')} (threshold {ds.get('threshold')})"
    else:
        start = f"waiting: on-policy until a step's accuracy reaches {ds.get('threshold')}"
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("checkpoint", str(rep.get("checkpoint", "-")))
    t.add_row("replay method", _method(rep))
    t.add_row("step", _fmt(rep.get("step")))
    t.add_row("delayed start", start)
    t.add_row(
        "questions",
        f"{rep['questions']:,} buffered, {rep['retired']:,} retired"
        + (f" ({rep['pending_retire']} pending)" if rep.get("pending_retire") else ""),
    )
    if rep.get("stores") == "prompts only":
        stored = (
            f"none: prompts only (the method keeps questions, not responses; a replayed question "
            f"gets fresh ones, so every token it trains on is on-policy; group size K={rep['group_size']})"
        )
    else:
        stored = (
            f"{rep['experiences']:,} ({rep['stored_tokens']:,} tokens, "
            f"{rep['megabytes']:.2f} MB of arrays; group size K={rep['group_size']})"
        )
        if rep.get("without_behavior_logp"):
            stored += f"; {rep['without_behavior_logp']:,} without behaviour log-probs (from elsewhere)"
    t.add_row("experiences", stored)
    state = rep.get("method_state") or {}
    if state:
        t.add_row("method state", ", ".join(f"{k} ({v} entries)" for k, v in state.items()))
    return t


def _method(rep: dict[str, Any]) -> str:
    """The run's replay.method and where it was read (the run's config; unknown without it)."""
    name = rep.get("replay_method")
    where = rep.get("replay_method_from") or ""
    return f"{name} (from {where})" if name else (where or "unknown")


def _buckets(rep: dict[str, Any]) -> Table:
    # No box and 14-cell bars: the table must fit an 80-column terminal (or a CI log).
    by_std = rep.get("bucket_by") == "reward_std"
    what = "normalised reward std (replay.bucket_by=reward_std)" if by_std else "accuracy"
    t = Table(
        title=f"buckets (latest {what} of each buffered question)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1),
    )
    t.add_column("bucket", justify="right")
    t.add_column("std" if by_std else "acc", justify="right")
    t.add_column("questions", justify="right", no_wrap=True)
    t.add_column("", no_wrap=True, min_width=14)
    t.add_column("experiences", justify="right", no_wrap=True)
    t.add_column("", no_wrap=True, min_width=14)
    bq = max([b["questions"] for b in rep["buckets"]] + [0])
    be = max([b["experiences"] for b in rep["buckets"]] + [0])
    for b in rep["buckets"]:
        t.add_row(
            str(b["bucket"]),
            f"{b['accuracy']:.3f}",
            f"{b['questions']:,}",
            Text(bar(b["questions"], bq, 14), style="cyan"),
            f"{b['experiences']:,}",
            Text(bar(b["experiences"], be, 14), style="magenta"),
        )
    return t


def distribution_table(title: str, dist: dict[str, Any], digits: int = 3) -> Group:
    """The title, a summary line, then one bar per histogram bin."""
    if not dist["count"]:
        stats = "(empty)"
    else:
        stats = "  ".join(f"{k} {_fmt(dist[k], digits)}" for k in STATS)
    head = Text.assemble((title, "italic"), "\n", (stats, "dim"))
    t = Table(show_header=False, box=None, padding=(0, 1))
    t.add_column(justify="right", no_wrap=True)
    t.add_column(no_wrap=True, min_width=BAR_WIDTH)
    t.add_column(justify="right", no_wrap=True)
    if not dist["count"]:
        return Group(head)
    h = dist["histogram"]
    largest = max(h["counts"])
    integer = all(float(e).is_integer() for e in h["edges"])
    for lo, hi, c in zip(h["edges"], h["edges"][1:], h["counts"]):
        if integer:  # bins hold [lo, hi); the last one is labelled up to the largest value seen
            top = min(int(hi) - 1, int(dist["max"]))
            label = f"{int(lo)}" if top == int(lo) else f"{int(lo)}-{top}"
        else:
            label = f"{lo:.{digits}f} .. {hi:.{digits}f}"
        t.add_row(label, Text(bar(c, largest), style="green"), f"{c:,}")
    return Group(head, t)


def _top(rep: dict[str, Any]) -> Table:
    t = Table(title="questions with the most experiences", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("question id", "left"),
        ("bucket", "right"),
        ("acc", "right"),
        ("experiences", "right"),
        ("mean length", "right"),
    )
    for name, just in columns:
        t.add_column(name, justify=just)
    for q in rep["top_questions"]:
        t.add_row(
            q["uid"],
            str(q["bucket"]),
            f"{q['accuracy']:.3f}",
            str(q["experiences"]),
            f"{q['mean_length']:.1f}",
        )
    return t


def _age_title(rep: dict[str, Any]) -> str:
    """The age table's title: what the age is counted from, and the run's age limit."""
    limit = rep.get("max_age") or 0
    cap = f"replay.max_age={limit}, {rep.get('expired', 0):,} expired" if limit else "no replay.max_age"
    if rep.get("step") is None:
        return f"age (unknown: no trainer_state.json; {cap})"
    return f"age, steps since collection at step {rep['step']} ({cap})"


def _logp_title(rep: dict[str, Any]) -> str:
    missing = rep.get("without_behavior_logp") or 0
    title = "behaviour log-prob, mean per experience"
    return f"{title} ({missing:,} without one left out: solutions from elsewhere)" if missing else title


def render_report(rep: dict[str, Any]) -> Group:
    parts: list[RenderableType] = [_header(rep), Text(""), _buckets(rep)]
    if rep["experiences"]:
        parts += [
            Text(""),
            distribution_table("stored response length (tokens)", rep["response_length"]),
            Text(""),
            distribution_table(_logp_title(rep), rep["behavior_logp_mean"]),
            Text(""),
            distribution_table(_age_title(rep), rep["age"]),
            Text(""),
            _top(rep),
        ]
    return Group(*parts)


def print_report(rep: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(render_report(rep))
