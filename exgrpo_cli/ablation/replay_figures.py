"""What each variant of a sweep replayed, and how far off-policy its replayed rows were.

Place: `exgrpo ablate`'s summary (ablation/report.py summarize_dir), beside the accuracy table and
the judged comparisons, on the same finished runs' metrics.jsonl rows. A sweep of replay methods
(conf/ablation/replay-methods.yaml) compares methods that reuse experience in different ways; their
accuracies alone do not say whether a method replayed at all, how old its replayed rows were or how
far the policy had moved from them, so this table puts those figures per variant:

- fresh rollouts a step: the mean of `rollout/responses` (the budget each step spent);
- replayed questions a step: the mean of `replay/replayed_questions` (the questions the method
  chose, prompt replay included);
- replay age: the mean over steps of the step's mean age of its replayed rows
  (`replay/age_mean`, steps since collection), and the largest age any step replayed
  (`replay/age_max`);
- staleness: the mean over steps of `replay/staleness_logprob_diff_mean` (mean |log pi_old -
  log stored| per replayed token) and `replay/staleness_k3` (the k3 KL estimate);
- engine mismatch: the mean over steps of `rollout/mismatch_k3` (fresh rows, trainer vs engine);
- the buffer's questions at the run's last step (`replay/buffer_questions`).

Steps without a figure (no replayed row that step, or a run without replay) are left out of its
mean, so a method that replays nothing shows "-" rather than a zero. Per variant: the mean over
its seeds. Pure maths over metric rows; the writers are at the end.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

from exgrpo_cli.ablation.summary import NAN, finite_number, fmt, mean_std, write_table


@dataclass(frozen=True)
class ReplayFigures:
    fresh_per_step: float
    replayed_per_step: float
    age_mean: float
    age_max: float
    staleness_diff: float
    staleness_k3: float
    mismatch_k3: float
    buffer_questions: float


def _values(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [v for r in rows if (v := finite_number(r.get(key))) is not None]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else NAN


def run_figures(rows: list[dict[str, Any]]) -> ReplayFigures:
    """One run's figures from its metric rows (as summary.read_metrics returns them)."""
    ages = _values(rows, "replay/age_max")
    buffer = _values(rows, "replay/buffer_questions")
    return ReplayFigures(
        fresh_per_step=_mean(_values(rows, "rollout/responses")),
        replayed_per_step=_mean(_values(rows, "replay/replayed_questions")),
        age_mean=_mean(_values(rows, "replay/age_mean")),
        age_max=max(ages) if ages else NAN,
        staleness_diff=_mean(_values(rows, "replay/staleness_logprob_diff_mean")),
        staleness_k3=_mean(_values(rows, "replay/staleness_k3")),
        mismatch_k3=_mean(_values(rows, "rollout/mismatch_k3")),
        buffer_questions=buffer[-1] if buffer else NAN,
    )


def variant_figures(runs: list[ReplayFigures]) -> ReplayFigures:
    """The mean over a variant's runs of each figure (over the runs that have it; NaN if none)."""
    if not runs:
        return ReplayFigures(*[NAN] * len(fields(ReplayFigures)))
    columns = zip(*(astuple(r) for r in runs))
    return ReplayFigures(*(mean_std([float(x) for x in col])[0] for col in columns))


def table(metric_rows: list[tuple[str, list[list[dict[str, Any]]]]]) -> list[tuple[str, int, ReplayFigures]]:
    """(variant, runs, its figures) for every variant, in the sweep's order."""
    return [(name, len(runs), variant_figures([run_figures(r) for r in runs])) for name, runs in metric_rows]


def replays(rows: list[tuple[str, int, ReplayFigures]]) -> bool:
    """Whether any variant logged a replay figure (else the section says nothing worth a table)."""
    return any(math.isfinite(f.replayed_per_step) and f.replayed_per_step > 0 for _, _, f in rows)


# ----------------------------------------------------------------------------- writers

COLUMNS = ("variant", "runs", *ReplayFigures.__dataclass_fields__)


def write_csv(rows: list[tuple[str, int, ReplayFigures]], path: Path) -> None:
    write_table(path, COLUMNS, [(name, n, *astuple(f)) for name, n, f in rows])


def to_markdown(rows: list[tuple[str, int, ReplayFigures]]) -> str:
    """The table as a markdown section ("" when no variant replayed)."""
    if not replays(rows):
        return ""
    lines = [
        "## What each variant replayed, and how far off-policy",
        "",
        "| variant | runs | fresh rollouts / step | replayed questions / step | replay age mean (max) "
        "| staleness |Δlog p| / k3 | engine mismatch k3 | buffer questions at the end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, n, f in rows:
        age = "-" if math.isnan(f.age_mean) else f"{fmt(f.age_mean, '.1f')} ({fmt(f.age_max, '.0f')})"
        stale = (
            "-"
            if math.isnan(f.staleness_diff)
            else f"{fmt(f.staleness_diff, '.4f')} / {fmt(f.staleness_k3, '.2e')}"
        )
        cells = [
            name,
            str(n),
            fmt(f.fresh_per_step, ".1f"),
            fmt(f.replayed_per_step, ".2f"),
            age,
            stale,
            fmt(f.mismatch_k3, ".2e"),
            fmt(f.buffer_questions, ".0f"),
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    lines += [
        "",
        "Means over steps, then over seeds; a step without replayed rows has no age or staleness and is "
        "left out of those means ('-': the variant never had one). Age: steps since the replayed row was "
        "collected. Staleness: pi_old against the stored log-probs on replayed tokens (docs/off-policy.md); "
        "engine mismatch: the trainer against the rollout engine on fresh tokens.",
        "",
    ]
    return "\n".join(lines)
