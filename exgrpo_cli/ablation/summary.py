"""The summary of a finished sweep: pure maths over the runs' metrics.jsonl, and its writers.

Place: the last stage of `exgrpo ablate` (and all of `exgrpo ablate ablation.summarize=<dir>`).
Per run: the final validation accuracy (`val/accuracy` at the last step that has one), the best
(the max over the run's `val/accuracy` points, step 0 included), the fresh rollouts used (the sum of
`rollout/responses`; replayed responses are not fresh rollouts), the wall time (from the run's
ablate.json marker; unknown otherwise) and the validation curve against cumulative fresh
rollouts. Per variant: the mean and the sample standard deviation (ddof=1; undefined for one seed)
over its seeds, and the difference of the mean final accuracy to the baseline variant's.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported when a table is printed
    from rich.table import Table

NAN = float("nan")


@dataclass
class RunResult:
    final: float
    best: float
    rollouts: float
    wall_s: float = NAN
    # (step, fresh rollouts up to and including that step, val/accuracy), one per validation point
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    seed: int | None = None


@dataclass
class Row:
    variant: str
    runs: int
    final_mean: float
    final_std: float
    best_mean: float
    best_std: float
    rollouts_mean: float
    wall_mean: float
    delta_final: float  # final_mean - the baseline's final_mean
    baseline: bool = False


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl, one per step (a repeated step keeps its last row), by step."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            by_step[int(row["step"])] = row
        except (ValueError, KeyError, TypeError):
            continue  # a line torn by a kill mid-write
    return [by_step[s] for s in sorted(by_step)]


def finite_number(v: object) -> float | None:
    """A metric's value as a float; None for a missing, boolean, non-numeric or non-finite one."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def run_result(rows: list[dict[str, Any]], wall_s: float = NAN, seed: int | None = None) -> RunResult:
    """Summarise one run's metric rows (as read_metrics returns them)."""
    seen = 0.0
    curve: list[tuple[int, float, float]] = []
    for row in rows:
        seen += finite_number(row.get("rollout/responses")) or 0.0
        acc = finite_number(row.get("val/accuracy"))
        if acc is not None:
            curve.append((int(row["step"]), seen, acc))
    if not curve:
        raise ValueError("the run logged no val/accuracy")
    return RunResult(
        final=curve[-1][2],
        best=max(c[2] for c in curve),
        rollouts=seen,
        wall_s=wall_s,
        curve=curve,
        seed=seed,
    )


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (ddof=1) of the finite values; std is NaN below two values."""
    v = [x for x in values if isinstance(x, (int, float)) and math.isfinite(x)]
    if not v:
        return NAN, NAN
    m = sum(v) / len(v)
    if len(v) < 2:
        return m, NAN
    return m, math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def summarize(groups: list[tuple[str, list[RunResult]]], baseline: str) -> list[Row]:
    """One row per variant, in the given order; variants without runs get a row of NaN."""
    rows = []
    for name, runs in groups:
        fm, fs = mean_std([r.final for r in runs])
        bm, bs = mean_std([r.best for r in runs])
        rows.append(
            Row(
                name,
                len(runs),
                fm,
                fs,
                bm,
                bs,
                mean_std([r.rollouts for r in runs])[0],
                mean_std([r.wall_s for r in runs])[0],
                NAN,
                name == baseline,
            )
        )
    ref = next((r.final_mean for r in rows if r.baseline), NAN)
    for r in rows:
        r.delta_final = r.final_mean - ref
    return rows


def mean_curve(runs: list[RunResult]) -> tuple[list[float], list[float], list[float]]:
    """x (mean fresh rollouts), mean and std (0 for one seed) of val/accuracy, at the validation
    steps that every run has (seeds may replay different amounts, hence different x)."""
    if not runs:
        return [], [], []
    common = set.intersection(*({c[0] for c in r.curve} for r in runs))
    xs, ys, sds = [], [], []
    for step in sorted(common):
        pts = [next(c for c in r.curve if c[0] == step) for r in runs]
        xs.append(sum(p[1] for p in pts) / len(pts))
        m, s = mean_std([p[2] for p in pts])
        ys.append(m)
        sds.append(0.0 if math.isnan(s) else s)
    return xs, ys, sds


# ----------------------------------------------------------------------------- writers

CSV_COLUMNS = (  # a Row's fields, in their order
    "variant",
    "runs",
    "final_mean",
    "final_std",
    "best_mean",
    "best_std",
    "rollouts_mean",
    "wall_s_mean",
    "delta_final",
    "baseline",
)


def _csv_value(x: str | int | float) -> str | int | float:
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, float) and math.isnan(x):
        return ""
    return x


def write_table(path: Path, columns: tuple[str, ...], rows: Sequence[tuple[str | int | float, ...]]) -> None:
    """A CSV file of `columns` and one line per row (a NaN an empty cell, a bool 0 or 1)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(columns)
        w.writerows([_csv_value(x) for x in row] for row in rows)


def write_csv(rows: list[Row], path: Path) -> None:
    write_table(path, CSV_COLUMNS, [astuple(r) for r in rows])


def fmt(x: float, spec: str = ".3f", signed: bool = False) -> str:
    if math.isnan(x):
        return "-"
    return format(x, ("+" if signed else "") + spec)


def _pm(mean: float, std: float) -> str:
    return fmt(mean) + ("" if math.isnan(std) else f" ± {fmt(std)}")


def table_cells(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """Header and formatted cells shared by the markdown file and the console table."""
    base = next((r.variant for r in rows if r.baseline), "baseline")
    header = [
        "variant",
        "runs",
        "final val acc",
        "best val acc",
        "fresh rollouts",
        "wall / run",
        f"Δ final vs {base}",
    ]
    body = []
    for r in rows:
        body.append(
            [
                r.variant + (" (baseline)" if r.baseline else ""),
                str(r.runs),
                _pm(r.final_mean, r.final_std),
                _pm(r.best_mean, r.best_std),
                fmt(r.rollouts_mean, ".0f"),
                "-" if math.isnan(r.wall_mean) else f"{r.wall_mean:.0f} s",
                "" if r.baseline else fmt(r.delta_final, signed=True),
            ]
        )
    return header, body


def to_markdown(rows: list[Row], title: str, notes: list[str] | None = None) -> str:
    header, body = table_cells(rows)
    lines = [f"# {title}", ""]
    lines += [f"| {' | '.join(header)} |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += [f"| {' | '.join(c.replace('|', '/') for c in cells)} |" for cells in body]
    lines += [
        "",
        "Mean ± sample std over seeds. final: `val/accuracy` at the last step; best: its max over "
        "the run's validation points; fresh rollouts: sum of `rollout/responses`; wall: per run.",
        "",
    ]
    lines += [f"- {n}" for n in notes or []]
    return "\n".join(lines).rstrip() + "\n"


def rich_table(rows: list[Row], title: str) -> Table:
    from rich import box
    from rich.table import Table

    header, body = table_cells(rows)
    t = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        caption=f"mean ± sample std over seeds; {header[-1]}",
        caption_justify="left",
    )
    for i, h in enumerate(header[:-1] + ["Δ final"]):
        t.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)
    for r, cells in zip(rows, body):
        t.add_row(*cells, style="bold" if r.baseline else None)
    return t
