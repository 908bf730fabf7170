"""A sweep's report: summary.md and .csv with the table over seeds (ablation/summary.py), curves.png,
and the judgement: each variant against its reference (ablation/compare.py, comparisons.csv) and
the per-step training dynamics of every finished run (ablation/dynamics.py, dynamics.png), and
what each variant replayed and how far off-policy (ablation/replay_figures.py, replay_figures.csv).

Place: the last stage of `exgrpo ablate` (`summarize_dir`), or all of `ablation.summarize=<dir>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from exgrpo_cli.ablation import compare as cp
from exgrpo_cli.ablation import replay_figures as rf
from exgrpo_cli.ablation import summary as sm
from exgrpo_cli.ablation import sweep as sw
from exgrpo_cli.ablation.summary import RunResult
from exgrpo_cli.errors import UsageError

if TYPE_CHECKING:  # rich is imported when a command runs
    from rich.console import Console

COMPARISONS_CSV = "comparisons.csv"
REPLAY_CSV = "replay_figures.csv"
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


def summarize_dir(
    sweep: Path, baseline: str, console: Console, compare_to: dict[str, str] | None = None
) -> None:
    """Write summary.md, summary.csv, curves.png, comparisons.csv and dynamics.png into the sweep dir
    and print the table. compare_to entries add to (and win over) the plan's."""
    from rich.console import Console

    from exgrpo_cli.ablation.plot import plot_curves

    plan = sw.read_plan(sweep)
    names = [v["name"] for v in plan["variants"]]
    base = sw.pick_baseline(names, baseline or plan.get("baseline") or "")
    groups: list[tuple[str, list[sm.RunResult]]] = []
    metric_rows: list[tuple[str, list[list[dict[str, Any]]]]] = []
    notes: list[str] = []
    for v in plan["variants"]:
        vdir = sweep / v["dir"]
        dirs = [vdir / f"seed{s}" for s in plan["seeds"]] if plan.get("seeds") else sorted(vdir.glob("seed*"))
        runs: list[sm.RunResult] = []
        rows_of_runs: list[list[dict[str, Any]]] = []
        for d in dirs:
            if not ((d / "metrics.jsonl").is_file() and sw.is_finished(d)):
                notes.append(f"{v['name']}: {d.name} not finished, left out")
                continue
            marker = sw.read_json(d / sw.MARKER) or {}
            wall = marker.get("wall_s")
            try:
                metrics = sm.read_metrics(d / "metrics.jsonl")
                runs.append(
                    sm.run_result(metrics, sm.NAN if wall is None else float(wall), marker.get("seed"))
                )
                rows_of_runs.append(metrics)
            except ValueError as err:
                notes.append(f"{v['name']}: {d.name} left out ({err})")
        groups.append((v["name"], runs))
        metric_rows.append((v["name"], rows_of_runs))
    rows = sm.summarize(groups, base)
    title = f"exgrpo ablate {plan.get('name') or sweep.name}"
    notes += [f"{v['name']}: {' '.join(v['overrides']) or '(defaults)'}" for v in plan["variants"]]
    shared = sw.merge_overrides(plan.get("base", []), plan.get("inherited", []))
    if shared:
        notes.append("every run: " + " ".join(shared))
    sm.write_csv(rows, sweep / "summary.csv")
    try:
        pairs = {**plan.get("compare_to", {}), **(compare_to or {})}
        judged = write_judgement(sweep, groups, metric_rows, base, pairs, title)
    except ValueError as err:  # a compare_to entry naming no variant
        raise UsageError(str(err)) from None
    figures = rf.table(metric_rows)  # what each variant replayed, and how far off-policy (replay_figures.py)
    rf.write_csv(figures, sweep / REPLAY_CSV)
    replayed = rf.to_markdown(figures)
    (sweep / "summary.md").write_text(
        sm.to_markdown(rows, title, notes) + "\n" + judged + ("\n" + replayed if replayed else ""),
        encoding="utf-8",
    )
    plot_curves(groups, sweep / "curves.png", title, base)
    # Off a terminal (a log, CI) rich would fold the table into 80 columns.
    wide = console if console.is_terminal else Console(file=console.file, width=max(console.width, 110))
    wide.print(sm.rich_table(rows, title))
    for section in (judged, replayed):  # as summary.md has them (markdown reads as plain text too)
        if section:
            wide.print(section, markup=False, highlight=False, soft_wrap=True)
    console.print(
        f"wrote {sweep / 'summary.md'}, summary.csv, comparisons.csv, {REPLAY_CSV}, curves.png "
        "and dynamics.png",
        highlight=False,
    )
