"""Grading a generations.jsonl again, without a model (`exgrpo eval eval.regrade=<file>`).

Where it sits: `run_eval` (evaluation/runner.py) hands over here instead of sampling when
eval.regrade is set. Every row is graded again with the reward module under the rule it was first
graded with (its `think_rule` / `boxed_only`); rows written before exgrpo recorded those fields
get today's training rule, with a notice (their first grading may have read the answer elsewhere).
The regraded rows, each with the rule it was graded with now, go to a new generations.jsonl and
the scores to results.json / results.md through the same `finish` as a sampled run
(evaluation/report.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig
from exgrpo_cli.evaluation.benchmarks import REGISTRY, Benchmark
from exgrpo_cli.evaluation.report import GENERATIONS, ModelResult, finish, summarize
from exgrpo_cli.reward.extract import THINK_RULES, AnswerRule, training_rule


def read_generations(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ConfigError(
                        f"invalid eval.regrade={path!r}: line {n} is not JSON ({err.msg})"
                    ) from None
    need = {"model", "benchmark", "question_id", "sample", "response", "gold", "kind"}
    bad = next((i for i, r in enumerate(rows) if not need <= set(r)), None)
    if bad is not None:
        missing = sorted(need - set(rows[bad]))
        raise ConfigError(f"invalid eval.regrade={path!r}: row {bad + 1} lacks {missing}")
    bad = next((i for i, r in enumerate(rows) if r.get("think_rule", "first") not in THINK_RULES), None)
    if bad is not None:
        raise ConfigError(
            f"invalid eval.regrade={path!r}: row {bad + 1} has think_rule={rows[bad]['think_rule']!r}; "
            f"known: {', '.join(THINK_RULES)}"
        )
    return rows


def row_rule(row: dict) -> AnswerRule:
    """The answer rule a generation row was graded with: its `think_rule` / `boxed_only`, or, for
    rows written before those fields, today's training rule of its `requires_think`."""
    if "think_rule" in row:
        return AnswerRule(row["think_rule"], boxed_only=bool(row.get("boxed_only", False)))
    return training_rule(bool(row.get("requires_think", False)))


def regrade_rows(rows: list[dict], timeout_s: float = 5.0) -> list[dict]:
    """Grade every row again (its stored kind and answer rule); returns updated copies."""
    from exgrpo_cli.reward import RewardScorer

    out = [dict(r) for r in rows]
    if not out:
        return out
    with RewardScorer(workers=min(4, os.cpu_count() or 1), timeout_s=timeout_s) as sc:
        res = sc.score(
            [r["response"] for r in out],
            [str(r["gold"]) for r in out],
            kinds=[r["kind"] for r in out],
            rules=[row_rule(r) for r in out],
        )
    for r, reward, ext in zip(out, res.rewards, res.extracted):
        rule = row_rule(r)
        r["extracted"], r["correct"] = ext, reward > 0.5
        r["think_rule"], r["boxed_only"] = rule.think, rule.boxed_only
    return out


def results_from_rows(rows: list[dict], k: int, source: str) -> list[ModelResult]:
    """Per model and benchmark (first-seen order), the scores of graded generation rows."""
    grouped: dict[str, dict[str, dict[str, list[dict]]]] = {}
    for r in rows:
        qs = grouped.setdefault(r["model"], {}).setdefault(r["benchmark"], {})
        qs.setdefault(str(r["question_id"]), []).append(r)
    models = []
    for label, benches in grouped.items():
        m = ModelResult(label, label)
        for name, questions in benches.items():
            first = next(iter(questions.values()))[0]
            known = REGISTRY.get(name)
            any_choice = any(r["kind"] == "choice" for q in questions.values() for r in q)
            bench = Benchmark(
                name,
                first.get("title") or (known.title if known else name),
                first.get("group") or (known.group if known else "other"),
                kind=known.kind if known else ("choice" if any_choice else "math"),
            )
            ordered = [sorted(q, key=lambda r: r["sample"]) for q in questions.values()]
            correct = [[float(bool(r["correct"])) for r in q] for q in ordered]
            extracted = [[r.get("extracted") for r in q] for q in ordered]
            m.benchmarks.append(summarize(bench, source, correct, extracted, k))
        models.append(m)
    return models


def regrade(cfg: ExgrpoConfig, path: str, out: Path) -> dict[str, Any]:
    """Grade a generations.jsonl again and write generations.jsonl + results into `out`."""
    rows = read_generations(path)
    unruled = sum("think_rule" not in r for r in rows)
    if unruled:
        from rich.console import Console

        Console(stderr=True).print(
            f"note: {unruled} of {len(rows)} rows of {path} record no answer rule (written before "
            "exgrpo stored it): they are graded with today's training rule, which reads a think "
            "template's answer after the first </think>; their first grading may have read it elsewhere",
            highlight=False,
        )
    rows = regrade_rows(rows)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (GENERATIONS + ".tmp")  # `out` may be the folder the input came from
    with tmp.open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, out / GENERATIONS)
    results = results_from_rows(rows, cfg.eval.k, f"regrade of {path}")
    return finish(cfg, out, results, "regrade", {"regraded": path, "k": cfg.eval.k})
