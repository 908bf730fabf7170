"""Benchmark registry and loaders: grouping of repeated rows, custom files, clear errors for missing
data, and the real official files of ../shared/data (skipped when that folder is absent).

GPQA asks that its questions not be republished: these tests look at counts and gold letters only,
and never put a GPQA question into an assertion message.
"""

import json
from pathlib import Path

import pytest

from exgrpo_cli.config.schema import DataConfig, ExgrpoConfig
from exgrpo_cli.data.templates import TEMPLATES
from exgrpo_cli.evaluation import benchmarks as B

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
OFFICIAL = SHARED / "benchmarks"
CONF_EVAL = Path(__file__).resolve().parents[2] / "conf" / "eval"


def needs_official(name: str) -> Path:
    path = OFFICIAL / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared data folder is only on development machines)")
    return path


def row(question: str, gold: str, source: str = "x", system: str = "sys") -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "reward_model": {"ground_truth": gold, "style": "rule"},
    }


def test_suites_follow_the_paper():
    assert B.SUITES["id"] == ["aime24", "aime25", "amc", "math500", "minerva", "olympiad"]
    assert B.SUITES["ood"] == ["arc_c", "gpqa", "mmlu_pro"]
    assert B.SUITES["paper"] == B.SUITES["id"] + B.SUITES["ood"]
    assert {b.name: b.n for b in B.PAPER_BENCHMARKS if b.n > 1} == {"aime24": 32, "aime25": 32, "amc": 32}
    assert {b.name for b in B.PAPER_BENCHMARKS if b.kind == "choice"} == {"arc_c", "gpqa", "mmlu_pro"}
    assert B.REGISTRY["mmlu_pro"].hf_id == "TIGER-Lab/MMLU-Pro"


def test_resolve_orders_like_the_paper_and_refuses_unknown_names():
    cfg = ExgrpoConfig()
    cfg.eval.benchmarks = ["gpqa", "aime24", "gpqa"]
    assert [b.name for b in B.resolve(cfg)] == ["aime24", "gpqa"]
    cfg.eval.benchmarks = []
    cfg.eval.suite = "ood"
    assert [b.name for b in B.resolve(cfg)] == ["arc_c", "gpqa", "mmlu_pro"]
    cfg.eval.benchmarks = ["aime2024"]
    with pytest.raises(B.BenchmarkDataError, match="aime2024"):
        B.resolve(cfg)


def test_repeated_rows_become_one_question():
    rows = [row("q1", "1")] * 3 + [row("q2", "2")] * 3 + [row("q1", "1", system="other")] + [{"prompt": "x"}]
    questions, repeats, skipped = B.group_rows(rows, "t", "prompt", "reward_model.ground_truth")
    assert [q.question for q in questions] == ["q1", "q2", "q1"]  # another system prompt: another question
    assert repeats == [3, 3, 1]
    assert skipped == 1
    assert len({q.uid for q in questions}) == 3


def test_samples_per_question_precedence():
    lb = B.LoadedBenchmark(B.CUSTOM, [], [8, 8], "x")
    assert lb.samples_per_question(0) == 8  # the file's repeats for a custom file
    assert lb.samples_per_question(3) == 3  # eval.n wins
    assert B.LoadedBenchmark(B.REGISTRY["aime24"], [], [1], "x").samples_per_question(0) == 32


def test_missing_official_file_says_what_to_put_where(tmp_path: Path):
    with pytest.raises(B.BenchmarkDataError) as err:
        B.load_official(B.REGISTRY["aime24"], str(tmp_path))
    msg = str(err.value)
    assert "test.id.parquet" in msg and "data_source=aime" in msg and "eval.data_dir" in msg
    with pytest.raises(B.BenchmarkDataError, match="eval.data_dir is not set"):
        B.load_official(B.REGISTRY["gpqa"], "")


def test_missing_mmlu_pro_names_the_file_and_the_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # if `datasets` is installed: fail fast, no network
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(B.BenchmarkDataError) as err:
        B.load_official(B.REGISTRY["mmlu_pro"], str(tmp_path))
    assert "TIGER-Lab/MMLU-Pro" in str(err.value) and "valid.mmlu_pro.parquet" in str(err.value)


def test_options_row_letters_the_choices_like_the_arc_file():
    r = B.options_row(
        {"question": "Pick one.", "options": ["x", "y", "z"], "answer": "B", "question_id": 7}, "mmlu_pro"
    )
    assert r["prompt"][1]["content"] == "Pick one.\n\nA) x\nB) y\nC) z\n"
    assert r["prompt"][0]["content"] == B.LUFFY_SYSTEM_PROMPT
    assert r["reward_model"]["ground_truth"] == "B"


def test_custom_jsonl_with_common_keys(tmp_path: Path):
    path = tmp_path / "mine.jsonl"
    lines = [
        {"question": "What is 2+2?", "answer": "4"},
        {"question": "What is 3+3?", "answer": 6},
        {"question": "What is 2+2?", "answer": "4"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (lb,) = B.load_custom(str(path), DataConfig())  # the default keys (prompt, ground_truth) are absent
    assert lb.bench.title == "mine" and lb.bench.kind == "math"
    assert [q.answer for q in lb.questions] == ["4", "6"] and lb.repeats == [2, 1]


def test_custom_file_split_by_data_source_and_letters_graded_as_choice(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [row("a", "1", "aime")] * 4 + [row("b", "C", "quiz"), row("c", "(A)", "quiz")]
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    by_name = {lb.bench.name: lb for lb in B.load_custom(str(path), DataConfig())}
    assert list(by_name) == ["aime24", "quiz"]  # a known source keeps its paper name, first
    assert by_name["aime24"].samples_per_question(0) == 4
    assert by_name["aime24"].bench.group == "id"
    assert by_name["quiz"].bench.kind == "choice" and by_name["quiz"].bench.group == "other"


def test_synthetic_suite_and_limit():
    cfg = ExgrpoConfig()
    cfg.eval.limit = 5
    (lb,) = B.load_suite(cfg)
    assert lb.bench.name == "synthetic" and len(lb.questions) == 5 and lb.samples_per_question(0) == 4


# ----------------------------------------------------------------------------- the official files

ID_COUNTS = {
    "aime24": (30, 32),
    "aime25": (30, 32),
    "amc": (83, 32),
    "math500": (500, 1),
    "minerva": (272, 1),
    "olympiad": (675, 1),
}


def test_official_id_file_groups_avg32_rows():
    needs_official("test.id.parquet")
    cache: dict = {}
    for name, (questions, repeats) in ID_COUNTS.items():
        lb = B.load_official(B.REGISTRY[name], str(OFFICIAL), cache)
        assert len(lb.questions) == questions, name
        assert set(lb.repeats) == {repeats}, name
        assert len({q.uid for q in lb.questions}) == questions, name
    assert len(cache) == 1  # the six benchmarks read the file once


def test_official_rows_keep_their_chat_for_the_think_template():
    needs_official("test.id.parquet")
    lb = B.load_official(B.REGISTRY["math500"], str(OFFICIAL))
    q = lb.questions[0]
    msgs = TEMPLATES["think"].messages(q)
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == B.LUFFY_SYSTEM_PROMPT  # the embedded copy equals the files' prompt
    assert TEMPLATES["think_short"].messages(q)[-1]["content"] == q.question


def test_official_eval_drops_the_data_system_message():
    """generate_vllm.py drops each row's system message: the model's own chat template then supplies
    its default system prompt."""
    needs_official("test.id.parquet")
    q = B.load_official(B.REGISTRY["aime24"], str(OFFICIAL)).questions[0]
    msgs = TEMPLATES["think"].messages(q, data_system=False)
    assert msgs == [{"role": "user", "content": q.question}]
    # a template that does not use the data's messages keeps its own system line
    assert TEMPLATES["think_short"].messages(q, data_system=False)[0]["role"] == "system"


def test_paper_benchmarks_follow_the_official_protocol(tmp_path: Path):
    assert all(b.official for b in B.PAPER_BENCHMARKS)
    assert not B.SYNTHETIC.official and not B.CUSTOM.official
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(row(f"q{i}", "1", src)) + "\n" for i, src in enumerate(["aime", "x"])))
    assert [lb.bench.official for lb in B.load_custom(str(path), DataConfig())] == [False, False]


def test_official_ood_files_are_multiple_choice():
    needs_official("valid.arc_c.parquet")
    arc = B.load_official(B.REGISTRY["arc_c"], str(OFFICIAL))
    assert len(arc.questions) == 1172 and arc.bench.kind == "choice"
    kinds = arc.kinds()
    # ARC-c labels a few questions' options 1-4: those golds are graded as exact answers
    assert all(q.answer in "ABCDE" for q, k in zip(arc.questions, kinds) if k == "choice")
    assert sorted({q.answer for q, k in zip(arc.questions, kinds) if k == "math"}) == ["1", "2", "3", "4"]
    assert kinds.count("math") == 22
    needs_official("valid.gpqa.parquet")
    gpqa = B.load_official(B.REGISTRY["gpqa"], str(OFFICIAL))
    letters = {q.answer for q in gpqa.questions}  # gold letters only: never the question text
    assert len(gpqa.questions) == 198 and letters <= set("ABCD") and set(gpqa.kinds()) == {"choice"}


def test_official_validation_file_as_a_custom_suite():
    path = needs_official("valid.parquet")
    loaded = {lb.bench.name: lb for lb in B.load_custom(str(path), DataConfig())}
    assert list(loaded) == ["aime24", "aime25", "amc", "math500", "minerva", "olympiad"]
    assert loaded["aime24"].samples_per_question(0) == 8 and loaded["amc"].samples_per_question(0) == 4


def test_limit_on_official_files():
    needs_official("test.id.parquet")
    cfg = ExgrpoConfig()
    cfg.eval.benchmarks, cfg.eval.data_dir, cfg.eval.limit = ["amc", "minerva"], str(OFFICIAL), 3
    loaded = B.load_suite(cfg)
    assert [(lb.bench.name, len(lb.questions), lb.repeats) for lb in loaded] == [
        ("amc", 3, [32, 32, 32]),
        ("minerva", 3, [1, 1, 1]),
    ]


def test_a_missing_benchmark_names_the_run_without_it(tmp_path: Path):
    cfg = ExgrpoConfig()
    cfg.eval.benchmarks, cfg.eval.data_dir = ["math500", "gpqa", "arc_c"], str(tmp_path)
    for present in ("valid.gpqa.parquet", "valid.arc_c.parquet"):
        (tmp_path / present).write_bytes(b"")
    with pytest.raises(B.BenchmarkDataError, match=r"eval.benchmarks=\[arc_c,gpqa\]"):
        B.load_suite(cfg)  # refused before any file is read


@pytest.mark.parametrize("suite", ["id", "ood", "paper"])
def test_paper_suite_presets(suite: str):
    """The paper's eval setup: 8192 new tokens (temperature 0.6 and top-p 1 are the schema's
    defaults); a preset holds only what differs from the schema."""
    import dataclasses

    from omegaconf import OmegaConf

    from exgrpo_cli.config.schema import EvalConfig

    preset = OmegaConf.to_container(OmegaConf.load(CONF_EVAL / f"{suite}.yaml"))
    assert preset["max_new_tokens"] == 8192
    assert preset["benchmarks"] == B.SUITES[suite]
    defaults = dataclasses.asdict(EvalConfig())
    assert defaults["temperature"] == 0.6 and defaults["top_p"] == 1.0
    assert {k for k, v in preset.items() if v == defaults[k]} == set()
