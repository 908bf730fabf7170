"""Reports and regrading without a model: table columns in the paper's order, results.json fields,
results.md, and grading a generations file again with the real reward module."""

import json
from pathlib import Path
from typing import Any

import pytest

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.evaluation import regrade, runner
from exgrpo_cli.evaluation import report as R
from exgrpo_cli.evaluation.benchmarks import REGISTRY


def bench(name: str, score: float, samples: int = 1) -> R.BenchmarkResult:
    b = REGISTRY[name]
    return R.BenchmarkResult(
        name,
        b.title,
        b.group,
        b.kind,
        "test",
        questions=2,
        samples_per_question=samples,
        metric="pass@1" if samples == 1 else f"avg@{samples}",
        score=score,
    )


def models() -> list[R.ModelResult]:
    a = [bench("aime24", 0.25, 32), bench("math500", 0.75), bench("gpqa", 0.5)]
    b = [bench("aime24", 0.5, 32), bench("math500", 0.5), bench("gpqa", 1.0)]
    return [R.ModelResult("base", "p/base", a), R.ModelResult("exgrpo", "p/rl", b)]


def test_columns_put_each_average_after_its_group():
    keys = [(k, h) for k, h, _ in R.columns(models())]
    assert keys == [
        ("aime24", "AIME24"),
        ("math500", "MATH-500"),
        ("avg:id", "ID avg"),
        ("gpqa", "GPQA-D"),
        ("avg:all", "All avg"),
    ]  # no OOD average over a single OOD benchmark
    assert R.columns([R.ModelResult("m", "m", [bench("aime24", 0.1)])]) == [("aime24", "AIME24", "pass@1")]
    paper = R.ModelResult("m", "m", [bench(n, 0.1) for n in ("aime24", "amc", "arc_c", "gpqa", "mmlu_pro")])
    assert [k for k, _, _ in R.columns([paper])] == [
        "aime24",
        "amc",
        "avg:id",
        "arc_c",
        "gpqa",
        "mmlu_pro",
        "avg:ood",
        "avg:all",
    ]


def test_results_json_and_markdown(tmp_path: Path):
    settings = {"temperature": 0.6, "k": 1}
    res = R.write_reports(tmp_path, models(), "paper", settings)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(res))
    assert on_disk["suite"] == "paper" and on_disk["settings"] == settings
    first = on_disk["models"][0]
    assert first["label"] == "base" and list(first["benchmarks"]) == ["aime24", "math500", "gpqa"]
    aime = first["benchmarks"]["aime24"]
    assert {"questions", "samples_per_question", "metric", "score", "group", "title"} <= set(aime)
    assert (aime["questions"], aime["samples_per_question"], aime["metric"]) == (2, 32, "avg@32")
    assert first["averages"] == {"id": pytest.approx(0.5), "ood": 0.5, "all": pytest.approx(0.5)}
    md = (tmp_path / "results.md").read_text()
    assert "| Model | AIME24 (avg@32) | MATH-500 (pass@1) | ID avg (mean) | GPQA-D (pass@1) | All avg" in md
    assert "| exgrpo | 50.0 | 50.0 | 50.0 | 100.0 | 66.7 |" in md


def test_console_table_has_a_row_per_model():
    from rich.console import Console

    console = Console(width=200, record=True)
    R.print_table(models(), console)
    text = console.export_text()
    assert "AIME24" in text and "ID avg" in text and "exgrpo" in text and "66.7" in text


def gen_row(
    model: str,
    name: str,
    qid: str,
    sample: int,
    response: str,
    gold: str,
    kind: str = "math",
    think: bool = True,
) -> dict[str, Any]:
    return {
        "model": model,
        "benchmark": name,
        "title": REGISTRY[name].title,
        "group": REGISTRY[name].group,
        "question_id": qid,
        "sample": sample,
        "prompt": "p",
        "response": response,
        "extracted": None,
        "gold": gold,
        "kind": kind,
        "requires_think": think,
        "correct": False,
    }


def test_regrade_rows_and_results_from_rows():
    rows = [
        gen_row("m", "aime24", "q0", 0, "<think>a</think>\\boxed{12}", "12"),
        gen_row("m", "aime24", "q0", 1, "\\boxed{12}", "12"),  # no </think>: no answer with think tags
        gen_row("m", "aime24", "q1", 0, "<think>a</think>\\boxed{\\frac{1}{2}}", "0.5"),  # math-verify
        gen_row("m", "aime24", "q1", 1, "<think>a</think>\\boxed{3}", "0.5"),
        gen_row("m", "arc_c", "q0", 0, "<think>a</think>\\boxed{C}", "C", kind="choice"),
        gen_row("m", "arc_c", "q1", 0, "\\boxed{B}", "A", kind="choice", think=False),
    ]
    graded = regrade.regrade_rows(rows)
    assert [r["correct"] for r in graded] == [True, False, True, False, True, False]
    assert [r["extracted"] for r in graded] == ["12", None, "\\frac{1}{2}", "3", "C", "B"]
    (m,) = regrade.results_from_rows(graded, k=2, source="s")
    aime, arc = m.benchmarks
    assert (aime.name, aime.questions, aime.samples_per_question, aime.metric) == ("aime24", 2, 2, "avg@2")
    assert aime.score == 0.5 and aime.pass_at_k == 1.0 and aime.no_answer == 0.25
    assert (arc.metric, arc.score, arc.pass_at_k, arc.kind) == ("pass@1", 0.5, None, "choice")


def test_official_answer_rule_follows_the_prompt():
    from exgrpo_cli.reward import AnswerRule

    think_prompt = "<|im_start|>assistant\n<think>\n"
    assert runner.official_answer_rule(think_prompt) == AnswerRule("first_or_whole", boxed_only=True)
    assert runner.official_answer_rule("<|im_start|>assistant\n") == AnswerRule("whole", boxed_only=True)
    assert runner.official_answer_rule("<think>") == AnswerRule("whole", boxed_only=True)


def test_regrade_uses_each_rows_answer_rule():
    def official(
        sample: int, response: str, gold: str, think_rule: str, kind: str = "math"
    ) -> dict[str, Any]:
        row = gen_row("m", "aime24" if kind == "math" else "gpqa", "q0", sample, response, gold, kind=kind)
        return {**row, "think_rule": think_rule, "boxed_only": True}

    rows = [
        # a think prompt: the text after the first </think> (up to the next) ...
        official(0, "<think>a</think>\\boxed{12}</think>\\boxed{13}", "12", "first_or_whole"),
        # ... or, without </think>, the whole text (the training rule would give no answer)
        official(1, "no close tag \\boxed{12}", "12", "first_or_whole"),
        # another prompt: the whole text, last box; never a fallback
        official(2, "<think>a</think>\\boxed{12}</think>\\boxed{13}", "13", "whole"),
        official(3, "the answer is 12", "12", "whole"),
        official(4, "\\boxed{\\text{(B)}}", "B", "whole", kind="choice"),
        # a row without the rule fields: the training rule of its requires_think ("first")
        gen_row("m", "aime24", "q0", 5, "<think>a</think>\\boxed{12}</think>\\boxed{13}", "12"),
    ]
    graded = regrade.regrade_rows(rows)
    assert [r["extracted"] for r in graded] == ["12", "12", "13", None, "\\text{(B)}", "12"]
    assert [r["correct"] for r in graded] == [True, True, True, False, True, True]
    # every regraded row records the rule it was graded with now
    assert [(r["think_rule"], r["boxed_only"]) for r in graded][-2:] == [("whole", True), ("first", False)]


def test_regrade_says_when_rows_record_no_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from exgrpo_cli.config.schema import ExgrpoConfig

    ruled = {**gen_row("m", "aime24", "q0", 0, "\\boxed{1}", "1"), "think_rule": "whole"}
    old = gen_row("m", "aime24", "q0", 1, "<think>a</think>\\boxed{1}", "1")
    src = tmp_path / "g.jsonl"
    src.write_text(json.dumps(ruled) + "\n" + json.dumps(old) + "\n")
    regrade.regrade(ExgrpoConfig(), str(src), tmp_path / "out")
    assert "1 of 2 rows" in capsys.readouterr().err


def test_read_generations_refuses_an_unknown_think_rule(tmp_path: Path):
    from exgrpo_cli.config.schema import ConfigError

    row = gen_row("m", "aime24", "q0", 0, "r", "1")
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "think_rule": "after"}) + "\n")
    with pytest.raises(ConfigError, match="row 2 has think_rule='after'"):
        regrade.read_generations(str(path))


def test_read_generations_refuses_incomplete_rows(tmp_path: Path):
    from exgrpo_cli.config.schema import ConfigError

    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"model": "m", "benchmark": "x"}) + "\n")
    with pytest.raises(ConfigError, match="lacks"):
        regrade.read_generations(str(path))


def test_models_to_run_labels_and_paths(tmp_path: Path):
    cfg = ExgrpoConfig()
    cfg.eval.compare = ["builtin:tiny", "Qwen/Qwen2.5-Math-7B", "builtin:tiny"]
    assert runner.models_to_run(cfg) == [
        ("builtin:tiny", "builtin:tiny"),
        ("Qwen/Qwen2.5-Math-7B", "Qwen/Qwen2.5-Math-7B"),
        ("builtin:tiny#2", "builtin:tiny"),
    ]
    ckpt = tmp_path / "run" / "checkpoints" / "step_000010"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "config.json").write_text("{}")
    (ckpt / "COMPLETE").write_text(json.dumps({"step": 10}))  # written before manifests: not verifiable
    assert runner.resolve_model_path(str(tmp_path / "run")) == str(ckpt / "model")
    assert runner.resolve_model_path(str(ckpt)) == str(ckpt / "model")
    from exgrpo_cli.config.schema import ConfigError

    with pytest.raises(ConfigError, match="no such folder"):
        runner.resolve_model_path(str(tmp_path / "nope"))


def _crc32(data: bytes) -> int:
    """CRC-32 (the reflected IEEE polynomial 0xEDB88320), bit by bit: not zlib's code."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_benchmark_seeds_do_not_depend_on_order():
    """A benchmark's seed is the run seed and its own name only (seed * 1_000_003 + CRC-32 of the
    name): the same in every model of a comparison whatever the order or subset of benchmarks."""
    assert _crc32(b"123456789") == 0xCBF43926  # the standard check value of CRC-32
    assert runner.benchmark_seed(0, "aime24") == _crc32(b"aime24")
    assert runner.benchmark_seed(2, "math500") == 2_000_006 + _crc32(b"math500")
    names = list(REGISTRY)
    for order in (names, names[::-1], names[1::2]):
        for seed in (0, 1, 7):
            assert [runner.benchmark_seed(seed, n) for n in order] == [
                seed * 1_000_003 + _crc32(n.encode()) for n in order
            ]
    every = [runner.benchmark_seed(s, n) for s in range(3) for n in names]
    assert len(set(every)) == len(every) == 3 * len(names)  # no two benchmarks or seeds share one
