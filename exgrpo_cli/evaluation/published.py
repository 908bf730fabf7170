"""The paper's published per-benchmark figures, and their comparison with an eval run's scores.

Where it sits: the end of `exgrpo eval` (report.finish), after every benchmark is scored. A model
whose preset has published figures (or `eval.published=<backbone>/<row>`) gets the paper's row
beside its own in results.json, results.md and the console table, with the difference per benchmark
and for the ID and OOD averages, computed the paper's way: the unweighted mean over the benchmarks,
each benchmark's own metric (avg@32 for AIME24/25 and AMC, pass@1 for the rest). A run of a subset
of a group is compared with the mean of the paper's figures over the same subset, never with the
printed average of all of them.

The figures are data, with their source. They were read from the tables the authors publish beside
their code (ExGRPO/figures/main_result.png, "Main Results" = the paper's Table 1, and
ExGRPO/figures/model_extensions.png, "full results of model extension", of github.com/ElliottYan/
LUFFY at 01f4ae0, both added on 2025-10-03 with the first arXiv version); they were not checked
against a later arXiv version. Where a printed average is not the mean of its row (the paper's own
sic entries), `sic_averages` says so; the comparison never uses a printed average.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exgrpo_cli.errors import UsageError

ID = ("aime24", "aime25", "amc", "math500", "minerva", "olympiad")
OOD = ("arc_c", "gpqa", "mmlu_pro")
ORDER = ID + OOD
_REPO = "github.com/ElliottYan/LUFFY@01f4ae0"
TABLE_1 = (
    f"arXiv 2510.02245, Table 1 (main results), as published in ExGRPO/figures/main_result.png of {_REPO}"
)
EXTENSIONS = (
    "arXiv 2510.02245, the model-extension table (full results per backbone), as published in "
    f"ExGRPO/figures/model_extensions.png of {_REPO}"
)


@dataclass(frozen=True)
class PublishedRow:
    backbone: str  # the model preset's name (conf/model/)
    row: str  # base | on-policy | exgrpo | continual-luffy
    label: str  # the row's name in the paper's table
    scores: tuple[float, ...]  # in ORDER, percent
    printed: tuple[float, float]  # the table's own ID and OOD averages
    source: str

    @property
    def name(self) -> str:
        return f"{self.backbone}/{self.row}"

    def by_benchmark(self) -> dict[str, float]:
        return dict(zip(ORDER, self.scores, strict=True))


def _rows(backbone: str, source: str, *rows: tuple[str, str, tuple[float, ...]]) -> list[PublishedRow]:
    return [
        PublishedRow(backbone, row, label, values[:9], (values[9], values[10]), source)
        for row, label, values in rows
    ]


# AIME24 AIME25 AMC MATH-500 Minerva Olympiad | ARC-c GPQA* MMLU-Pro | ID avg, OOD avg (printed)
FIGURES: dict[str, PublishedRow] = {
    r.name: r
    for r in [
        *_rows(
            "qwen2.5-math-7b",
            TABLE_1,
            ("base", "Qwen-Base", (11.5, 4.9, 31.3, 43.6, 7.4, 15.6, 18.2, 11.1, 16.9, 19.0, 15.4)),
            ("on-policy", "On-Policy", (24.9, 15.5, 59.2, 84.8, 38.2, 49.3, 82.6, 37.4, 49.2, 45.3, 56.4)),
            ("exgrpo", "ExGRPO", (31.6, 18.7, 66.3, 87.4, 36.0, 50.1, 84.7, 37.4, 52.9, 48.3, 58.3)),
        ),
        *_rows(
            "luffy-qwen-math-7b",
            TABLE_1,
            ("base", "LUFFY", (29.4, 23.1, 65.6, 87.6, 37.5, 57.2, 80.5, 39.9, 53.0, 50.1, 57.8)),
            (
                "continual-luffy",
                "Continual LUFFY",
                (30.7, 22.5, 66.2, 86.8, 41.2, 55.3, 81.8, 49.0, 54.7, 50.4, 61.8),
            ),
            ("on-policy", "On-Policy", (24.8, 17.8, 67.5, 88.4, 38.6, 55.3, 81.9, 47.0, 53.3, 48.7, 60.7)),
            ("exgrpo", "ExGRPO", (32.3, 25.7, 65.6, 87.6, 40.1, 57.0, 83.6, 42.4, 54.5, 51.4, 60.2)),
        ),
        *_rows(
            "qwen2.5-math-1.5b",
            EXTENSIONS,
            ("base", "Base", (7.2, 3.6, 26.4, 28.0, 9.6, 21.2, 3.1, 3.0, 2.3, 16.0, 2.8)),
            ("on-policy", "On-Policy", (11.8, 7.7, 40.2, 61.8, 26.8, 32.0, 57.5, 28.3, 30.7, 30.0, 38.9)),
            ("exgrpo", "ExGRPO", (13.3, 8.6, 46.6, 74.0, 30.5, 39.0, 59.3, 30.8, 30.4, 35.3, 40.2)),
        ),
        *_rows(
            "qwen2.5-7b-instruct",
            EXTENSIONS,
            ("base", "Instruct", (11.7, 7.5, 43.8, 71.8, 30.9, 40.4, 84.7, 24.7, 54.7, 34.4, 54.7)),
            ("on-policy", "On-Policy", (14.1, 8.3, 43.5, 74.0, 33.8, 37.6, 91.4, 19.2, 57.6, 35.2, 56.0)),
            ("exgrpo", "ExGRPO", (15.2, 12.4, 47.8, 80.0, 36.0, 44.4, 91.1, 36.9, 58.6, 39.3, 62.2)),
        ),
        *_rows(
            "llama3.1-8b",
            EXTENSIONS,
            ("base", "Base", (0.0, 0.0, 4.7, 11.0, 4.4, 1.9, 0.2, 0.0, 3.6, 3.7, 1.3)),
            ("on-policy", "On-Policy", (0.4, 0.4, 2.9, 9.2, 5.1, 2.8, 0.6, 0.0, 3.0, 3.4, 1.2)),
            ("exgrpo", "ExGRPO", (0.7, 0.1, 6.6, 12.0, 10.7, 6.5, 59.0, 7.1, 26.2, 6.1, 30.8)),
        ),
        *_rows(
            "llama3.1-8b-instruct",
            EXTENSIONS,
            ("base", "Instruct", (4.0, 0.3, 15.7, 39.8, 18.0, 13.3, 42.4, 0.0, 40.5, 15.2, 27.6)),
            ("on-policy", "On-Policy", (3.8, 0.8, 21.4, 49.8, 24.3, 19.6, 86.7, 0.0, 48.1, 19.9, 44.9)),
            ("exgrpo", "ExGRPO", (6.1, 0.6, 27.1, 55.2, 25.7, 23.1, 88.9, 15.2, 52.1, 23.0, 52.0)),
        ),
    ]
}
# The weights each row describes, as the presets (conf/model/) and the authors' model cards name
# them: a model path among these is compared with its own row.
WEIGHTS = {
    "Elliott/Qwen2.5-Math-7B-16k-think": "qwen2.5-math-7b/base",
    "Elliott/LUFFY-Qwen-Math-7B-Zero": "luffy-qwen-math-7b/base",
    "Qwen/Qwen2.5-Math-1.5B": "qwen2.5-math-1.5b/base",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b-instruct/base",
    "meta-llama/Llama-3.1-8B": "llama3.1-8b/base",
    "meta-llama/Llama-3.1-8B-Instruct": "llama3.1-8b-instruct/base",
    "rzzhan/ExGRPO-Qwen2.5-Math-7B-Zero": "qwen2.5-math-7b/exgrpo",
    "rzzhan/ExGRPO-LUFFY-7B-Continual": "luffy-qwen-math-7b/exgrpo",
    "rzzhan/ExGRPO-Qwen2.5-Math-1.5B-Zero": "qwen2.5-math-1.5b/exgrpo",
    "rzzhan/ExGRPO-Qwen2.5-7B-Instruct": "qwen2.5-7b-instruct/exgrpo",
    "rzzhan/ExGRPO-Llama3.1-8B-Zero": "llama3.1-8b/exgrpo",
    "rzzhan/ExGRPO-Llama3.1-8B-Instruct": "llama3.1-8b-instruct/exgrpo",
}


def sic_averages(row: PublishedRow) -> list[str]:
    """The printed averages that are not the mean of their row beyond the table's rounding (each
    figure rounded to 0.05, the average too: 0.1). None of the rows carried here has one (Table 1's
    GPG-Zero row, not carried, does: OOD 41.6 printed, 53.7 the mean of its three figures)."""
    out = []
    values = row.by_benchmark()
    for group, names, printed in (("id", ID, row.printed[0]), ("ood", OOD, row.printed[1])):
        mean = sum(values[n] for n in names) / len(names)
        if abs(mean - printed) > 0.1 + 1e-9:
            out.append(f"{group}: printed {printed}, mean {mean:.2f}")
    return out


def lookup(name: str) -> PublishedRow:
    """`<backbone>/<row>` (eval.published); a UsageError naming the known ones otherwise."""
    if name not in FIGURES:
        raise UsageError(f"invalid eval.published={name!r}: one of none, {', '.join(FIGURES)}")
    return FIGURES[name]


def check(published: str) -> None:
    """eval.published at start-up: "", none or a known row."""
    if published not in ("", "none"):
        lookup(published)


def row_for(published: str, preset: str, path: str, adapter: bool = False) -> PublishedRow | None:
    """The row a model is compared with: eval.published when set ("none": no row); else the row
    of the weights `path` names; else, for a model of a preset with figures (a checkpoint trained
    from it), that backbone's ExGRPO row; else none. With `adapter` (eval.adapter: a LoRA adapter
    on its base, `path`) the weights are the trained ones, not the base's: the row is that of the
    same checkpoint's merged model, the preset's ExGRPO row."""
    if published == "none":
        return None
    if published:
        return lookup(published)
    if path in WEIGHTS and not adapter:
        return FIGURES[WEIGHTS[path]]
    return FIGURES.get(f"{preset}/exgrpo")


@dataclass
class Comparison:
    """A model's scores beside a published row, in percentage points."""

    row: PublishedRow
    published: dict[str, float]  # the benchmarks both have: the paper's figure
    difference: dict[str, float]  # benchmark or avg:<group> -> measured - published
    averages: dict[str, float] = field(default_factory=dict)  # group -> the paper's mean over them

    def cell(self, key: str) -> float | None:
        return self.averages.get(key[4:]) if key.startswith("avg:") else self.published.get(key)

    def to_json(self) -> dict[str, Any]:
        return {
            "row": self.row.name,
            "label": self.row.label,
            "source": self.row.source,
            "unit": "percentage points",
            "benchmarks": self.published,
            "averages": self.averages,
            "printed_averages": {"id": self.row.printed[0], "ood": self.row.printed[1]},
            "difference": self.difference,
        }


def compare(row: PublishedRow, measured: dict[str, float]) -> Comparison | None:
    """`measured`: benchmark -> score in [0, 1]. None when no benchmark of the run has a figure."""
    figures = row.by_benchmark()
    common = [n for n in ORDER if n in measured]
    if not common:
        return None
    published = {n: figures[n] for n in common}
    difference = {n: round(100 * measured[n] - figures[n], 4) for n in common}
    averages = {}
    for group, names in (("id", ID), ("ood", OOD)):
        both = [n for n in names if n in measured]
        if both:
            averages[group] = round(sum(figures[n] for n in both) / len(both), 4)
            ours = 100 * sum(measured[n] for n in both) / len(both)
            difference[f"avg:{group}"] = round(ours - averages[group], 4)
    return Comparison(row, published, difference, averages)
