"""The benchmark registry of `exgrpo eval` and the loaders that turn benchmark files into questions.

Where it sits: the first step of an eval run, before any model is loaded, so that missing data
stops the run at once with a message saying which file to put where (or which HF id it tried).

Each benchmark declares its source. The paper's sets (docs/algorithm.md §8) come from the
official LUFFY/ExGRPO parquet files in `eval.data_dir` (one file, filtered by `data_source`);
MMLU-Pro, too large for that copy, also loads from the Hugging Face hub on a connected machine.
The official test file repeats each AIME/AMC question 32 times (the rows of avg@32): repeated
rows are grouped back into one question, and the runner samples n responses for it instead.

The paper's benchmarks are `official`: asked and graded as the official evaluation
(ExGRPO/eval_scripts/generate_vllm.py) does; see `runner.official_answer_rule`. The synthetic and
custom suites keep the training reward's prompt and rule.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from exgrpo_cli.config.schema import DataConfig, ExgrpoConfig
from exgrpo_cli.data import synthetic
from exgrpo_cli.data.bad_rows import DataError
from exgrpo_cli.data.fetch import offline_env
from exgrpo_cli.data.pinned import PINNED, resolve_data_dir
from exgrpo_cli.data.rows import read_rows
from exgrpo_cli.data.sources import dig, parse_row
from exgrpo_cli.data.types import Question
from exgrpo_cli.errors import UsageError

log = logging.getLogger(__name__)

# The system prompt of every row of the official files; MMLU-Pro rows from the hub get it too, so
# that all nine benchmarks are asked the same way, as in the paper.
LUFFY_SYSTEM_PROMPT = (
    "Your task is to follow a systematic, thorough reasoning process before providing the final "
    "solution. This involves analyzing, summarizing, exploring, reassessing, and refining your thought "
    "process through multiple iterations. Structure your response into two sections: Thought and "
    'Solution. In the Thought section, present your reasoning using the format: "<think>\n {thoughts} '
    '</think>\n". Each thought should include detailed analysis, brainstorming, verification, and '
    'refinement of ideas. After "</think>\n," in the Solution section, provide the final, logical, and '
    "accurate answer, clearly derived from the exploration in the Thought section. If applicable, include "
    "the answer in \\boxed{} for closed-form results like multiple choices or mathematical solutions."
)
LUFFY_DATA = "github.com/ElliottYan/LUFFY (folders ExGRPO/data/ and data/)"
LETTERS = "ABCDEFGHIJ"
_LETTER = re.compile(r"^\s*\(?([A-J])\)?\s*$")


class BenchmarkDataError(UsageError, ValueError):
    """A benchmark's data cannot be found or used; the message says what to put where."""


@dataclass(frozen=True)
class Benchmark:
    name: str  # the key in eval.benchmarks, results.json and generations.jsonl
    title: str  # the column header of the paper's tables
    group: str  # id | ood | other (other counts in the "all" average only)
    kind: str = "math"  # math (math-verify) | choice (boxed letter vs gold letter)
    n: int = 1  # the paper's samples per question; 0: as many as the file repeats each question
    file: str = ""  # official file name inside eval.data_dir
    data_source: str = ""  # rows of `file` with this data_source ("": every row)
    hf_id: str = ""  # Hugging Face dataset id, tried when `file` is absent
    hf_split: str = "test"
    # the official eval's protocol: the data's system message dropped (the model's own chat
    # template supplies its default), the answer only from the last \boxed{} (official_answer_rule)
    official: bool = False


# In the paper's column order (ID, then OOD); the tables and averages follow this order.
PAPER_BENCHMARKS = tuple(
    replace(b, official=True)
    for b in (
        Benchmark("aime24", "AIME24", "id", n=32, file="test.id.parquet", data_source="aime"),
        Benchmark("aime25", "AIME25", "id", n=32, file="test.id.parquet", data_source="aime25"),
        Benchmark("amc", "AMC", "id", n=32, file="test.id.parquet", data_source="amc"),
        Benchmark("math500", "MATH-500", "id", file="test.id.parquet", data_source="math"),
        Benchmark("minerva", "Minerva", "id", file="test.id.parquet", data_source="minerva"),
        Benchmark("olympiad", "Olympiad", "id", file="test.id.parquet", data_source="olympiad_bench"),
        Benchmark("arc_c", "ARC-c", "ood", kind="choice", file="valid.arc_c.parquet"),
        Benchmark("gpqa", "GPQA-D", "ood", kind="choice", file="valid.gpqa.parquet"),
        Benchmark(
            "mmlu_pro",
            "MMLU-Pro",
            "ood",
            kind="choice",
            file="valid.mmlu_pro.parquet",
            hf_id="TIGER-Lab/MMLU-Pro",
        ),
    )
)
SYNTHETIC = Benchmark("synthetic", "Synthetic", "other", n=4)
CUSTOM = Benchmark("custom", "Custom", "other", n=0)
REGISTRY: dict[str, Benchmark] = {b.name: b for b in (*PAPER_BENCHMARKS, SYNTHETIC, CUSTOM)}
BY_DATA_SOURCE = {b.data_source: b for b in PAPER_BENCHMARKS if b.data_source}
SUITES = {
    "id": [b.name for b in PAPER_BENCHMARKS if b.group == "id"],
    "ood": [b.name for b in PAPER_BENCHMARKS if b.group == "ood"],
    "paper": [b.name for b in PAPER_BENCHMARKS],
    "synthetic": ["synthetic"],
    "custom": ["custom"],
}
# Keys tried, after the data config's own, when a custom file does not have that key.
QUESTION_KEYS = ("prompt", "question", "problem")
ANSWER_KEYS = ("reward_model.ground_truth", "ground_truth", "answer")


@dataclass
class LoadedBenchmark:
    bench: Benchmark
    questions: list[Question]  # distinct questions, in file order
    repeats: list[int]  # rows of the file per question (32 for AIME in test.id.parquet)
    source: str  # where the rows came from, for the report
    skipped: int = 0  # rows without a usable question or answer (printed by the runner)

    def kinds(self) -> list[str]:
        """The grading rule per question: a multiple-choice benchmark's gold letters are graded as
        letters; its few numbered options (ARC-c has 22 questions labelled 1-4) as exact answers."""
        if self.bench.kind != "choice":
            return [self.bench.kind] * len(self.questions)
        return ["choice" if _LETTER.match(q.answer) else "math" for q in self.questions]

    def samples_per_question(self, override: int) -> int:
        """eval.n when set, else the paper's default, else the file's repeat count."""
        return override or self.bench.n or max(self.repeats, default=1) or 1


def resolve(cfg: ExgrpoConfig) -> list[Benchmark]:
    """The benchmarks to run, in the paper's order; refuses unknown names before any loading."""
    names = list(cfg.eval.benchmarks) or SUITES[cfg.eval.suite]
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise BenchmarkDataError(
            f"unknown benchmark(s) {unknown} in eval.benchmarks; known: {', '.join(REGISTRY)}"
        )
    order = list(REGISTRY)
    return [REGISTRY[n] for n in sorted(dict.fromkeys(names), key=order.index)]


DATA_DOC = "docs/evaluation.md#benchmark-data"


def missing_data(benches: list[Benchmark], data_dir: str) -> list[str]:
    """What every official benchmark of the run lacks, all at once, without reading any file: its
    file in eval.data_dir, unless it can come from the hub (MMLU-Pro, with `datasets` installed)."""
    root = Path(resolve_data_dir(data_dir)) if data_dir else None
    wanted: dict[str, list[str]] = {}  # file -> the benchmarks that read it
    for b in benches:
        if b.file and not (root is not None and (root / b.file).is_file()):
            if b.hf_id and importlib.util.find_spec("datasets") is not None:
                continue  # the hub copy will be tried (a network error is reported then)
            hub = f" or the hub's {b.hf_id} with `pip install datasets`" if b.hf_id else ""
            rows = f" rows data_source={b.data_source}" if b.data_source else ""
            url = f" from {PINNED[b.file].url}" if b.file in PINNED else ""
            wanted.setdefault(b.file + url, []).append(b.title + rows + hub)
    return [f"{file} ({', '.join(titles)})" for file, titles in wanted.items()]


def check_data(cfg: ExgrpoConfig) -> None:
    """Refuse a run whose benchmark files are missing, naming every one (one line)."""
    benches = resolve(cfg)
    missing = missing_data(benches, cfg.eval.data_dir)
    if missing:
        folder = resolve_data_dir(cfg.eval.data_dir)
        where = f"in eval.data_dir={folder}" if folder else "(eval.data_dir is not set)"
        present = [b.name for b in benches if not missing_data([b], cfg.eval.data_dir)]
        without = f" (or run without them: eval.benchmarks=[{','.join(present)}])" if present else ""
        fetch = " (eval.fetch_only=true fetches the official ones into it)" if folder else ""
        if folder and (env := offline_env()) and not cfg.eval.data_url:  # prepare fetched nothing
            fetch = f" ({env} is set: fetch them with eval.fetch_only=true where there is network)"
        raise BenchmarkDataError(
            f"missing benchmark data {where}{fetch}: {'; '.join(missing)}. Where each file comes from: "
            f"{DATA_DOC}{without}"
        )


def load_suite(cfg: ExgrpoConfig) -> list[LoadedBenchmark]:
    """Every benchmark of the run, loaded and cut to eval.limit questions."""
    cache: dict[Path, list[dict]] = {}  # the ID benchmarks share one file: read it once
    out: list[LoadedBenchmark] = []
    benches = resolve(cfg)
    from exgrpo_cli.evaluation.data_files import prepare

    # fetched or verified (a foreign copy of the user's: warned); offline, missing ones left to check_data
    prepare(cfg, [b.file for b in benches], leave_offline_missing=True)
    check_data(cfg)  # every missing file in one message, before any is read
    for bench in benches:
        try:
            loaded = _load_one(bench, cfg, cache)
        except BenchmarkDataError as err:
            others = [b.name for b in benches if b is not bench]
            hint = f" (or run without it: eval.benchmarks=[{','.join(others)}])" if others else ""
            raise BenchmarkDataError(f"{err}{hint}") from None
        for lb in loaded:
            if cfg.eval.limit:
                lb.questions, lb.repeats = lb.questions[: cfg.eval.limit], lb.repeats[: cfg.eval.limit]
            out.append(lb)
    return out


def _load_one(bench: Benchmark, cfg: ExgrpoConfig, cache: dict[Path, list[dict]]) -> list[LoadedBenchmark]:
    if bench.name == "synthetic":
        s = cfg.data.synthetic
        _, val = synthetic.train_and_val(
            s.num_train, s.num_val, max_digits=s.max_digits, ops=list(s.ops), seed=s.seed
        )
        return [LoadedBenchmark(bench, val, [1] * len(val), "built-in arithmetic held-out set")]
    if bench.name == "custom":
        from exgrpo_cli.reward.stage import needs_answer

        return load_custom(cfg.eval.path, cfg.data, needs_answer(cfg.reward))
    return [load_official(bench, resolve_data_dir(cfg.eval.data_dir), cache)]


# ----------------------------------------------------------------------------- official files


def load_official(
    bench: Benchmark, data_dir: str, cache: dict[Path, list[dict]] | None = None
) -> LoadedBenchmark:
    """A paper benchmark from its official file in `data_dir`, else from the hub if it has an id."""
    cache = {} if cache is None else cache
    path = Path(data_dir).expanduser() / bench.file if data_dir else None
    if path is not None and path.is_file():
        if path not in cache:
            cache[path] = read_rows(str(path), "parquet")
        rows = cache[path]
        if bench.data_source:
            found = sorted({str(r.get("data_source")) for r in rows})
            rows = [r for r in rows if r.get("data_source") == bench.data_source]
            if not rows:
                raise BenchmarkDataError(
                    f"{bench.title}: {path} has no rows with data_source="
                    f"{bench.data_source} (it has: {', '.join(found)})"
                )
        where = f"{path}" + (f" (data_source={bench.data_source})" if bench.data_source else "")
        return _grouped(bench, rows, where, "prompt", "reward_model.ground_truth")
    if bench.hf_id:
        return _load_hf(bench, path)
    filt = f" (the rows with data_source={bench.data_source})" if bench.data_source else ""
    where = f"eval.data_dir={data_dir!r}: {path} does not exist" if path else "eval.data_dir is not set"
    raise BenchmarkDataError(
        f"{bench.title} needs the official file {bench.file}{filt}; {where}. "
        f"Get it from {LUFFY_DATA} and pass eval.data_dir=<its folder>"
    )


def _load_hf(bench: Benchmark, path: Path | None) -> LoadedBenchmark:
    local = f"{path} does not exist" if path else "eval.data_dir is not set"
    hint = f"or, offline, put {bench.file} in eval.data_dir ({local})"
    try:
        datasets = importlib.import_module("datasets")  # optional: only MMLU-Pro from the hub needs it
    except ImportError:
        raise BenchmarkDataError(
            f"{bench.title} loads from the Hugging Face dataset {bench.hf_id!r}, which "
            f"needs the `datasets` package (pip install datasets); {hint}"
        ) from None
    try:
        ds = datasets.load_dataset(bench.hf_id, split=bench.hf_split)
    except Exception as err:  # network, auth, offline mode, a renamed split: all the same to the user
        raise BenchmarkDataError(
            f"{bench.title}: could not load the Hugging Face dataset {bench.hf_id!r} "
            f"(split {bench.hf_split}): {type(err).__name__}: {err}; {hint}"
        ) from None
    rows = [options_row(r, bench.name) for r in ds]
    return _grouped(
        bench, rows, f"hf:{bench.hf_id} (split {bench.hf_split})", "prompt", "reward_model.ground_truth"
    )


def options_row(row: dict[str, Any], data_source: str) -> dict[str, Any]:
    """A hub row with `question`, `options` (a list) and a gold letter `answer` (MMLU-Pro's
    schema), written in the official schema with the options lettered as in the ARC-c file."""
    options = "\n".join(f"{LETTERS[i]}) {opt}" for i, opt in enumerate(row["options"]))
    user = f"{row['question']}\n\n{options}\n"
    return {
        "data_source": data_source,
        "prompt": [{"role": "system", "content": LUFFY_SYSTEM_PROMPT}, {"role": "user", "content": user}],
        "reward_model": {"ground_truth": str(row["answer"]).strip()},
        "extra_info": {"index": row.get("question_id")},
    }


# ----------------------------------------------------------------------------- grouping


def group_rows(
    rows: list[dict], prefix: str, question_key: str, answer_key: str, answer_required: bool = True
) -> tuple[list[Question], list[int], int]:
    """(distinct questions in first-seen order, rows per question, unusable rows skipped).

    Rows with the same prompt (the whole chat when there is one) and the same gold answer are one
    question: the official files repeat AIME/AMC rows to get avg@32 from one sample per row."""
    data_cfg = DataConfig(question_key=question_key, answer_key=answer_key)
    index: dict[tuple, int] = {}
    questions: list[Question] = []
    repeats: list[int] = []
    uids: set[str] = set()
    skipped = 0
    for i, row in enumerate(rows):
        q = parse_row(row, i, data_cfg, prefix, answer_required) if isinstance(row, dict) else None
        if not isinstance(q, Question):
            skipped += 1
            continue
        key = (q.messages or q.question, q.answer)
        if key in index:
            repeats[index[key]] += 1
            continue
        if q.uid in uids:  # ids must be unique: they key generations.jsonl
            q = replace(q, uid=f"{prefix}-row{i}")
        uids.add(q.uid)
        index[key] = len(questions)
        questions.append(q)
        repeats.append(1)
    return questions, repeats, skipped


def _grouped(
    bench: Benchmark,
    rows: list[dict],
    where: str,
    question_key: str,
    answer_key: str,
    answer_required: bool = True,
) -> LoadedBenchmark:
    questions, repeats, skipped = group_rows(rows, bench.name, question_key, answer_key, answer_required)
    if skipped:
        log.warning(
            "%s: skipped %d of %d rows without a usable question or answer in %s",
            bench.title,
            skipped,
            len(rows),
            where,
        )
    if not questions:
        raise BenchmarkDataError(
            f"{bench.title}: no usable rows in {where} (question key {question_key!r}, "
            f"answer key {answer_key!r})"
        )
    return LoadedBenchmark(bench, questions, repeats, where, skipped)


# ----------------------------------------------------------------------------- custom files


def _pick_key(rows: list[dict], preferred: str, fallbacks: tuple[str, ...]) -> str:
    first = next((r for r in rows if isinstance(r, dict) and "__error__" not in r), {})
    for key in (preferred, *fallbacks):
        if dig(first, key) is not None:
            return key
    return preferred


def load_custom(path: str, data_cfg: DataConfig, answer_required: bool = True) -> list[LoadedBenchmark]:
    """A local parquet/jsonl file. Keys: data.question_key / data.answer_key, else the official
    schema's or common names. A file with several `data_source` values gives one benchmark each
    (a known source keeps its paper title and group); a benchmark whose gold answers are all
    single letters A-J is graded as multiple choice. Samples per question default to the file's
    repeat count. Without `answer_required` (a reward=python or model eval) rows need no answer."""
    try:
        rows = read_rows(path)
    except DataError as err:
        raise BenchmarkDataError(f"custom suite: {err} (set eval.path to a parquet or jsonl file)") from None
    qkey = _pick_key(rows, data_cfg.question_key, QUESTION_KEYS)
    akey = _pick_key(rows, data_cfg.answer_key, ANSWER_KEYS)
    sources = list(
        dict.fromkeys(
            str(r.get("data_source"))
            for r in rows
            if isinstance(r, dict) and r.get("data_source") is not None
        )
    )
    stem = Path(path).stem
    if len(sources) <= 1:
        parts = [(replace(CUSTOM, title=stem), rows)]
    else:
        parts = []
        for src in sources:
            known = BY_DATA_SOURCE.get(src)
            bench = (
                replace(known, n=0, file="", data_source=src, official=False)
                if known
                else Benchmark(src, src, "other", n=0, data_source=src)
            )
            parts.append(
                (bench, [r for r in rows if isinstance(r, dict) and str(r.get("data_source")) == src])
            )
    out = []
    for bench, part in parts:
        where = path + (f" (data_source={bench.data_source})" if bench.data_source else "")
        lb = _grouped(bench, part, where, qkey, akey, answer_required)
        if answer_required and all(_LETTER.match(q.answer) for q in lb.questions):
            lb.bench = replace(lb.bench, kind="choice")
        out.append(lb)
    order = list(REGISTRY)  # known sources in the paper's column order, the others after them
    return sorted(out, key=lambda lb: order.index(lb.bench.name) if lb.bench.name in order else len(order))
