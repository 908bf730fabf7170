"""The paper's figures beside an eval's scores (evaluation/published.py, report.py): which row a
model is compared with, the differences per benchmark and for the averages (the paper's way: the
mean over the same benchmarks), and nothing at all for a model without figures."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.evaluation import published as P
from exgrpo_cli.evaluation.report import BenchmarkResult, ModelResult, markdown, with_published, write_reports

from conftest import REPO


def _result(label: str, path: str, scores: dict[str, float]) -> ModelResult:
    group = {n: "id" for n in P.ID} | {n: "ood" for n in P.OOD}
    benches = [
        BenchmarkResult(n, n.upper(), group.get(n, "other"), "math", "file", 30, 1, "pass@1", s)
        for n, s in scores.items()
    ]
    return ModelResult(label, path, benches)


def test_every_row_is_whole_and_its_printed_averages_are_its_means():
    assert len(P.FIGURES) == 19  # 6 backbones x base / on-policy / ExGRPO, + Continual LUFFY
    for row in P.FIGURES.values():
        assert len(row.scores) == 9 and all(0 <= v <= 100 for v in row.scores), row.name
        assert P.sic_averages(row) == [], row.name  # within the table's rounding
        assert row.source.startswith("arXiv 2510.02245")
    # the headline figures of the paper's abstract and docs/algorithm.md
    assert P.FIGURES["qwen2.5-math-7b/exgrpo"].printed == (48.3, 58.3)
    assert P.FIGURES["qwen2.5-math-7b/on-policy"].printed == (45.3, 56.4)
    assert P.FIGURES["qwen2.5-math-7b/exgrpo"].by_benchmark()["aime24"] == 31.6


def test_which_row_a_model_is_compared_with():
    assert (
        P.row_for("", "qwen2.5-math-7b", "Elliott/Qwen2.5-Math-7B-16k-think").name == "qwen2.5-math-7b/base"
    )
    assert P.row_for("", "tiny", "rzzhan/ExGRPO-Llama3.1-8B-Zero").name == "llama3.1-8b/exgrpo"
    assert P.row_for("", "qwen2.5-math-7b", "outputs/train/run").name == "qwen2.5-math-7b/exgrpo"
    assert P.row_for("", "tiny", "builtin:tiny") is None
    assert P.row_for("", "qwen2.5-7b", "Qwen/Qwen2.5-7B") is None  # no figures for the 7B base
    assert P.row_for("llama3.1-8b/on-policy", "tiny", "builtin:tiny").name == "llama3.1-8b/on-policy"
    assert P.row_for("none", "qwen2.5-math-7b", "Elliott/Qwen2.5-Math-7B-16k-think") is None
    with pytest.raises(
        UsageError, match=r"invalid eval.published='qwen/exgrpo': one of none, qwen2.5-math-7b/base"
    ):
        P.check("qwen/exgrpo")


def test_an_adapter_on_its_base_is_compared_as_its_merged_model_is():
    """eval.adapter evaluates trained weights loaded over the base's path: the base's row would
    compare a trained model with the untrained one."""
    base = "Elliott/Qwen2.5-Math-7B-16k-think"  # model=qwen2.5-math-7b's own path
    cfg = ExgrpoConfig()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, preset="qwen2.5-math-7b", path=base))
    step = "run/checkpoints/step_5"
    with_adapter = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, adapter=step))
    scores = {"aime24": 0.3, "math500": 0.8}
    adapter = _result(f"{base} + {step}/adapter", base, scores)
    merged, plain = _result("merged", f"{step}/model", scores), _result(base, base, scores)
    with_published(with_adapter, [adapter])
    with_published(cfg, [merged, plain])
    assert adapter.comparison is not None and merged.comparison is not None and plain.comparison is not None
    assert adapter.comparison.row.name == merged.comparison.row.name == "qwen2.5-math-7b/exgrpo"
    assert plain.comparison.row.name == "qwen2.5-math-7b/base"  # the base alone keeps its own row
    assert P.row_for("qwen2.5-math-7b/on-policy", "qwen2.5-math-7b", base, adapter=True).name.endswith(
        "/on-policy"
    )  # eval.published still chooses


def test_differences_per_benchmark_and_for_the_averages_of_a_subset():
    row = P.FIGURES["qwen2.5-math-7b/exgrpo"]
    c = P.compare(row, {"aime24": 0.30, "math500": 0.90, "gpqa": 0.374, "synthetic": 0.5})
    assert c is not None and set(c.published) == {"aime24", "math500", "gpqa"}
    assert c.difference["aime24"] == pytest.approx(30.0 - 31.6)
    assert c.difference["math500"] == pytest.approx(90.0 - 87.4)
    # the ID average over the two ID benchmarks run, against the paper's mean over the same two
    assert c.averages["id"] == pytest.approx((31.6 + 87.4) / 2)
    assert c.difference["avg:id"] == pytest.approx((30.0 + 90.0) / 2 - (31.6 + 87.4) / 2)
    assert c.difference["avg:ood"] == pytest.approx(0.0, abs=1e-9)
    assert P.compare(row, {"synthetic": 0.5}) is None


def test_results_json_holds_the_figures_only_for_a_model_that_has_them(tmp_path: Path):
    row = P.FIGURES["qwen2.5-math-7b/exgrpo"]
    ours = _result("mine", "outputs/train/run", {"aime24": 0.316, "gpqa": 0.40})
    ours.comparison = P.compare(row, {b.name: b.score for b in ours.benchmarks})
    other = _result("builtin:tiny", "builtin:tiny", {"aime24": 0.0, "gpqa": 0.0})
    results = write_reports(tmp_path, [ours, other], "paper", {})
    mine, tiny = json.loads((tmp_path / "results.json").read_text())["models"]
    assert (
        mine["published"]["row"] == "qwen2.5-math-7b/exgrpo"
        and mine["published"]["benchmarks"]["aime24"] == 31.6
    )
    assert mine["published"]["difference"]["gpqa"] == pytest.approx(40.0 - 37.4)
    assert mine["published"]["printed_averages"] == {"id": 48.3, "ood": 58.3}
    assert tiny["published"] is None and results["models"][1]["published"] is None
    md = markdown([ours, other], {})
    assert "| paper: qwen2.5-math-7b/exgrpo | 31.6 |" in md and "| yours - paper | +0.0 |" in md
    assert md.count("paper:") == 1 and "Paper figures: arXiv 2510.02245" in md
    assert "Paper figures" not in markdown([other], {})  # says nothing where it has nothing


def test_the_docs_name_the_source_and_what_the_same_means():
    page = (REPO / "docs" / "evaluation.md").read_text()
    assert "eval.published" in page and "main_result.png" in page and "standard error" in page
