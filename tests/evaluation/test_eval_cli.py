"""`exgrpo eval` end to end through the real CLI, on the CPU, with the built-in tiny model: the
synthetic suite (with eval.compare), every official benchmark file present in ../shared/data, and
a regrade of the generations. Few questions, few tokens, one torch thread (two threads on two busy
cores are ~50x slower than one for a model this small).

GPQA rows must not be republished: the checks below read fields and numbers, and never put a
generation row into an assertion message.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "exgrpo_cli" / "assets" / "tiny"
OFFICIAL = REPO.parent / "shared" / "data" / "benchmarks"
FILES = {
    "test.id.parquet": ["aime24", "aime25", "amc", "math500", "minerva", "olympiad"],
    "valid.arc_c.parquet": ["arc_c"],
    "valid.gpqa.parquet": ["gpqa"],
}
ROW_FIELDS = {
    "model",
    "benchmark",
    "question_id",
    "sample",
    "prompt",
    "response",
    "extracted",
    "gold",
    "correct",
    "kind",
}
BENCH_FIELDS = {"questions", "samples_per_question", "metric", "score", "title", "group"}

needs_tiny = pytest.mark.skipif(
    not (TINY / "config.json").is_file(),
    reason="the built-in tiny model (exgrpo_cli/assets/tiny) is not built",
)


def exgrpo_eval(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "exgrpo_cli",
            "eval",
            f"hydra.run.dir={run_dir}",
            "trainer.threads=1",
            "trainer.device=cpu",
            *overrides,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def check_outputs(run_dir: Path, proc: subprocess.CompletedProcess) -> tuple[dict, list[dict]]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("results.json", "results.md", "generations.jsonl"):
        assert (run_dir / name).is_file(), name
    results = json.loads((run_dir / "results.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):
        missing = ROW_FIELDS - set(row)
        assert not missing, f"generations row {i}: missing {sorted(missing)}"
        assert isinstance(row["correct"], bool), f"generations row {i}: correct is not a bool"
    for m in results["models"]:
        assert set(m["averages"]) == {"id", "ood", "all"}
        for name, b in m["benchmarks"].items():
            assert not BENCH_FIELDS - set(b), name
            assert 0.0 <= b["score"] <= 1.0, name
    return results, rows


def test_missing_data_stops_before_any_model_is_loaded(tmp_path: Path):
    proc = exgrpo_eval(tmp_path / "run", "eval=id", f"eval.data_dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "test.id.parquet" in proc.stderr and "data_source=aime" in proc.stderr
    assert not (tmp_path / "run" / "generations.jsonl").exists()


def test_unknown_suite_is_refused_with_the_known_ones(tmp_path: Path):
    proc = exgrpo_eval(tmp_path / "run", "eval.suite=nope")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "invalid eval.suite='nope'" in proc.stderr and "ood" in proc.stderr


@needs_tiny
@pytest.mark.slow
def test_synthetic_suite_compare(tmp_path: Path):
    run = tmp_path / "syn"
    proc = exgrpo_eval(
        run,
        "model.path=builtin:tiny",
        "eval.limit=4",
        "eval.n=2",
        "eval.k=2",
        "eval.compare=[builtin:tiny,builtin:tiny]",
    )
    results, rows = check_outputs(run, proc)
    assert results["suite"] == "synthetic"
    a, b = results["models"]
    assert (a["label"], b["label"]) == ("builtin:tiny", "builtin:tiny#2")
    syn = a["benchmarks"]["synthetic"]
    assert (syn["questions"], syn["samples_per_question"], syn["metric"]) == (4, 2, "avg@2")
    assert syn["pass_at_k"] >= syn["score"]
    # the same seeds for every model of a comparison: the same weights give the same samples
    assert b["benchmarks"]["synthetic"]["score"] == syn["score"]
    assert len(rows) == 2 * 4 * 2
    assert "Synthetic" in proc.stdout and "builtin:tiny#2" in proc.stdout
    # not a paper benchmark: graded by the training reward's rule of the tiny model's think template
    assert {(r["think_rule"], r["boxed_only"]) for r in rows} == {("first", False)}


@needs_tiny
@pytest.mark.slow
def test_official_benchmarks_and_regrade(tmp_path: Path):
    present = [b for f, names in FILES.items() if (OFFICIAL / f).is_file() for b in names]
    if not present:
        pytest.skip(f"no official benchmark file in {OFFICIAL}")
    run = tmp_path / "official"
    proc = exgrpo_eval(
        run,
        "eval=paper",
        f"eval.benchmarks=[{','.join(present)}]",
        f"eval.data_dir={OFFICIAL}",
        "model.path=builtin:tiny",
        "eval.limit=2",
        "eval.n=1",
        "eval.max_new_tokens=16",
    )
    results, rows = check_outputs(run, proc)
    (model,) = results["models"]
    assert list(model["benchmarks"]) == present  # the paper's order
    for name, b in model["benchmarks"].items():
        assert (b["questions"], b["samples_per_question"], b["metric"]) == (2, 1, "pass@1"), name
    assert [r["benchmark"] for r in rows] == [b for b in present for _ in range(2)]
    # the official eval's rule: the tiny chat template does not open a think block, so the whole
    # text is graded, answer from the last \\boxed{} only
    assert {(r["think_rule"], r["boxed_only"]) for r in rows} == {("whole", True)}
    md = (run / "results.md").read_text()
    assert "| Model |" in md and "Details" in md

    regraded = tmp_path / "regrade"
    proc = exgrpo_eval(regraded, f"eval.regrade={run / 'generations.jsonl'}")
    again, rows_again = check_outputs(regraded, proc)
    assert again["suite"] == "regrade"
    scores = {n: b["score"] for n, b in model["benchmarks"].items()}
    assert {n: b["score"] for n, b in again["models"][0]["benchmarks"].items()} == scores
    assert len(rows_again) == len(rows)
    assert [r["correct"] for r in rows_again] == [r["correct"] for r in rows]
