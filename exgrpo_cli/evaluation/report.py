"""The outputs of `exgrpo eval`: results.json, results.md, the console table and the W&B scores.

Where it sits: the end of an eval run (or of a regrade). The runner (or evaluation/regrade.py)
turns each benchmark's graded samples into a `BenchmarkResult` (`summarize`) and hands over one
`ModelResult` per evaluated model to `finish`; this module only scores and lays them out. Scores
are fractions in [0, 1] in JSON and percentages with one decimal in the tables, one row per model
and one column per benchmark in the paper's order, with the ID / OOD / overall averages
(unweighted means over the benchmarks present) after their groups.

results.json:
    {"suite": ..., "settings": {temperature, top_p, max_new_tokens, n, k, limit, template, ...},
     "models": [{"label", "path",
                 "benchmarks": {name: {title, group, kind, source, questions,
                                       samples_per_question, metric, score, pass_at_k, k,
                                       no_answer, timeouts, errors, seconds}},
                 "averages": {"id", "ood", "all"},
                 "published": null, or the paper's row beside it (evaluation/published.py):
                     {row, label, source, unit, benchmarks, averages, printed_averages,
                      difference: {benchmark or avg:<group>: measured - published}}}]}
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from exgrpo_cli.evaluation.published import Comparison, compare, row_for
from exgrpo_cli.evaluation.scoring import avg_at_n, group_averages, mean_pass_at_k, metric_name

if TYPE_CHECKING:
    from exgrpo_cli.config.schema import ExgrpoConfig
    from exgrpo_cli.evaluation.benchmarks import Benchmark

GENERATIONS = "generations.jsonl"  # every graded sample, one JSON row each
# What "the same as the paper" can mean, said wherever the paper's figures are shown.
SAME_NOTE = (
    "Sampling alone moves a score by one standard error of sqrt(sum_i p_i(1-p_i)/n)/Q: up to 1.6 "
    "points for avg@32 on AIME's 30 questions, 3.5 for pass@1 on GPQA-D's 198 at 40%, so differences "
    "of a few points are noise; a printed average that is not its row's mean is the paper's own "
    "(evaluation/published.py, sic_averages), and the averages here are recomputed means"
)
AVERAGE_TITLES = {"id": "ID avg", "ood": "OOD avg", "all": "All avg"}


@dataclass
class BenchmarkResult:
    name: str
    title: str
    group: str  # id | ood | other
    kind: str  # math | choice
    source: str
    questions: int
    samples_per_question: int
    metric: str  # avg@n or pass@1
    score: float  # the metric, in [0, 1]
    pass_at_k: float | None = None  # unbiased pass@k when eval.k > 1 (None when k > n)
    k: int = 1
    no_answer: float = 0.0  # share of samples with no extractable answer
    timeouts: int = 0
    errors: int = 0
    seconds: float = 0.0


@dataclass
class ModelResult:
    label: str  # the row name in the tables
    path: str  # what was loaded
    benchmarks: list[BenchmarkResult] = field(default_factory=list)
    comparison: Comparison | None = None  # the paper's figures for this model, when it has some

    def averages(self) -> dict[str, float | None]:
        return group_averages(
            {b.name: b.score for b in self.benchmarks}, {b.name: b.group for b in self.benchmarks}
        )


def columns(models: list[ModelResult]) -> list[tuple[str, str, str]]:
    """(key, header, metric) per table column: benchmarks in first-seen order, the ID / OOD average
    after the last benchmark of its group, and the overall average last. An average that would
    only repeat one column (a group of one; "all" over a single group) is left out of the table,
    not out of results.json."""
    seen: dict[str, BenchmarkResult] = {}
    for m in models:
        for b in m.benchmarks:
            seen.setdefault(b.name, b)
    benches = list(seen.values())
    groups = [b.group for b in benches]
    cols: list[tuple[str, str, str]] = []
    for i, b in enumerate(benches):
        cols.append((b.name, b.title, b.metric))
        last_of_group = i + 1 == len(benches) or benches[i + 1].group != b.group
        if b.group in ("id", "ood") and last_of_group and groups.count(b.group) > 1:
            cols.append((f"avg:{b.group}", AVERAGE_TITLES[b.group], "mean"))
    if len(set(groups)) > 1:
        cols.append(("avg:all", AVERAGE_TITLES["all"], "mean"))
    return cols


def _cell(model: ModelResult, key: str) -> str:
    if key.startswith("avg:"):
        value = model.averages()[key[4:]]
    else:
        value = next((b.score for b in model.benchmarks if b.name == key), None)
    return "-" if value is None else f"{100 * value:.1f}"


def rich_table(models: list[ModelResult], title: str = "exgrpo eval") -> Table:
    table = Table(title=title)
    table.add_column("Model", style="bold", overflow="fold")
    for key, header, metric in columns(models):
        style = "bold" if key.startswith("avg:") else None
        table.add_column(f"{header}\n{metric}", justify="right", style=style, no_wrap=True)
    for m in models:
        table.add_row(m.label, *[_cell(m, key) for key, _, _ in columns(models)])
        for name, cells in _paper_rows(m, columns(models)):
            table.add_row(name, *cells, style="dim")
    return table


def _paper_rows(m: ModelResult, cols: list[tuple[str, str, str]]) -> list[tuple[str, list[str]]]:
    """The published row and the difference under a model that has figures; none otherwise."""
    c = m.comparison
    if c is None:
        return []
    paper = [("-" if (v := c.cell(k)) is None else f"{v:.1f}") for k, _, _ in cols]
    delta = [("-" if (d := c.difference.get(k)) is None else f"{d:+.1f}") for k, _, _ in cols]
    return [(f"  paper: {c.row.name}", paper), ("  yours - paper", delta)]


def markdown(models: list[ModelResult], settings: dict[str, Any]) -> str:
    cols = columns(models)
    lines = [
        "# exgrpo eval",
        "",
        "Scores in %; " + ", ".join(f"{k}={v}" for k, v in settings.items()),
        "",
        "| Model | " + " | ".join(f"{h} ({m})" for _, h, m in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for m in models:
        lines.append(f"| {m.label} | " + " | ".join(_cell(m, key) for key, _, _ in cols) + " |")
        for name, cells in _paper_rows(m, cols):
            lines.append(f"| {name.strip()} | " + " | ".join(cells) + " |")
    sources = sorted({m.comparison.row.source for m in models if m.comparison is not None})
    if sources:
        lines += ["", "Paper figures: " + "; ".join(sources) + ". " + SAME_NOTE]
    lines += [
        "",
        "## Details",
        "",
        "| Model | Benchmark | Questions | Samples/question | Metric | Score | pass@k | "
        "No answer | Seconds | Source |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for m in models:
        for b in m.benchmarks:
            pk = "-" if b.pass_at_k is None or b.k == 1 else f"pass@{b.k} {100 * b.pass_at_k:.1f}"
            lines.append(
                f"| {m.label} | {b.title} | {b.questions} | {b.samples_per_question} | {b.metric} | "
                f"{100 * b.score:.1f} | {pk} | {100 * b.no_answer:.1f}% | {b.seconds:.0f} | "
                f"{b.source} |"
            )
    return "\n".join(lines) + "\n"


def results_dict(models: list[ModelResult], suite: str, settings: dict[str, Any]) -> dict[str, Any]:
    out_models = []
    for m in models:
        benches = {}
        for b in m.benchmarks:
            d = asdict(b)
            benches[d.pop("name")] = d
        out_models.append(
            {
                "label": m.label,
                "path": m.path,
                "benchmarks": benches,
                "averages": m.averages(),
                "published": m.comparison.to_json() if m.comparison is not None else None,
            }
        )
    return {"suite": suite, "settings": settings, "models": out_models}


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_reports(
    out_dir: Path, models: list[ModelResult], suite: str, settings: dict[str, Any]
) -> dict[str, Any]:
    """Write results.json and results.md into `out_dir`; returns the results dict."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = results_dict(models, suite, settings)
    _atomic_write(out_dir / "results.json", json.dumps(results, indent=2) + "\n")
    _atomic_write(out_dir / "results.md", markdown(models, settings))
    return results


def print_table(
    models: list[ModelResult], console: Console | None = None, title: str = "exgrpo eval"
) -> None:
    if console is None:
        # rich lays a pipe or a log file out 80 columns wide: too narrow for the paper's 12 columns
        console = Console() if Console().is_terminal else Console(width=200)
    console.print(rich_table(models, title))
    sources = sorted({m.comparison.row.source for m in models if m.comparison is not None})
    if sources:
        console.print("Paper figures: " + "; ".join(sources) + ". " + SAME_NOTE, highlight=False)


# ----------------------------------------------------------------------------- shared by a run and a regrade
def summarize(
    bench: Benchmark,
    source: str,
    correct: list[list[float]],
    extracted: list[list[Any]],
    k: int,
    seconds: float = 0.0,
    timeouts: int = 0,
    errors: int = 0,
    correct_at: float | None = None,
) -> BenchmarkResult:
    """A benchmark's scores from its samples' rewards (`correct`): a sample is correct when its
    reward is >= `correct_at` (reward.correct_at), or above 0.5 without one."""
    samples = max((len(r) for r in correct), default=0)
    flat = [x for row in extracted for x in row]
    return BenchmarkResult(
        name=bench.name,
        title=bench.title,
        group=bench.group,
        kind=bench.kind,
        source=source,
        questions=len(correct),
        samples_per_question=samples,
        metric=metric_name(samples),
        score=avg_at_n(correct, correct_at),
        pass_at_k=mean_pass_at_k(correct, k, correct_at),
        k=k,
        no_answer=sum(x is None for x in flat) / max(len(flat), 1),
        timeouts=timeouts,
        errors=errors,
        seconds=seconds,
    )


def with_published(cfg: ExgrpoConfig, results: list[ModelResult]) -> None:
    """Each model's comparison with the paper's row (eval.published, else its weights' or preset's;
    an adapter's base is not its weights)."""
    for m in results:
        row = row_for(cfg.eval.published, cfg.model.preset, m.path, adapter=bool(cfg.eval.adapter))
        m.comparison = compare(row, {b.name: b.score for b in m.benchmarks}) if row else None


def finish(
    cfg: ExgrpoConfig, out: Path, results: list[ModelResult], suite: str, run_settings: dict[str, Any]
) -> dict[str, Any]:
    with_published(cfg, results)
    written = write_reports(out, results, suite, run_settings)
    print_table(results, title=f"exgrpo eval: {suite}")
    Console(stderr=True).print(
        f"wrote {out / 'results.json'}, {out / 'results.md'} and {out / GENERATIONS}", highlight=False
    )
    _log_wandb(cfg, out, results)
    return written


def _log_wandb(cfg: ExgrpoConfig, out: Path, results: list[ModelResult]) -> None:
    """Scores to W&B as eval/<benchmark>[/<model>], only when W&B is on: an explicit mode, or
    `auto` with a login (an eval nobody asked to track should leave no offline run behind)."""
    from exgrpo_cli.metrics.logger import EVAL_METRICS_FILE, MetricLogger, wandb_mode

    mode = wandb_mode(cfg.logger.wandb.mode)
    if mode == "disabled" or (cfg.logger.wandb.mode == "auto" and mode == "offline"):
        return
    metrics: dict[str, float] = {}
    for m in results:
        suffix = f"/{m.label}" if len(results) > 1 else ""
        for b in m.benchmarks:
            metrics[f"eval/{b.name}{suffix}"] = b.score
        for group, value in m.averages().items():
            if value is not None:
                metrics[f"eval/avg_{group}{suffix}"] = value
    logger = MetricLogger(
        str(out),
        replace(cfg.logger, console=False),
        asdict(cfg),
        total_steps=1,
        job_type="eval",
        rows_file=EVAL_METRICS_FILE,  # eval.output_dir may be a training run's dir: its metrics stay
    )
    try:
        logger.log(0, metrics)
    finally:
        logger.close()
