"""Where questions come from: the built-in synthetic task, local jsonl/parquet files, HF datasets.

Loading the data is the start of a run, before the first train step: `load_questions` gives the
training pool the sampler draws from and the held-out set. A row (read by rows.py) needs a
question (a string, or a chat list of {role, content} whose last user turn is the question) and a
gold answer (`data.answer_key`, a dotted path such as reward_model.ground_truth; optional when the
reward needs none, reward=python or model); a row without them is a bad row, skipped and counted or
refused as `data.on_bad_row` says (bad_rows.py). Every column of a row is kept on its question
(`Question.columns`): a reward function receives them by name.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from exgrpo_cli.config.registry import pick
from exgrpo_cli.config.schema import DataConfig
from exgrpo_cli.data import synthetic
from exgrpo_cli.data.bad_rows import (
    INVALID_UTF8,
    MISSING,
    OTHER,
    TOO_LONG,
    WRONG_TYPE,
    BadRow,
    DataError,
    LoadReport,
    json_type,
)
from exgrpo_cli.data.rows import hf_rows, located_rows
from exgrpo_cli.data.types import Question

# A question or gold answer longer than this (in characters) is a bad row. Math questions run to a
# few thousand characters and answers to a few dozen; 100k characters is ~25k tokens, above any
# model.max_prompt_tokens the recipes use (<= 1024), so no usable row is lost. Refusing such a
# field here saves tokenizing it (a 5 MB prompt takes seconds) only for the length filter to drop
# it, and keeps megabytes of garbage out of the grader.
MAX_FIELD_CHARS = 100_000


# ----------------------------------------------------------------------------- rows to questions


def dig(row: dict[str, Any], dotted: str) -> Any:
    cur: Any = row
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _text_problem(text: str, what: str) -> BadRow | None:
    if len(text) > MAX_FIELD_CHARS:
        return BadRow(TOO_LONG, f"{what} of {len(text):,} characters > {MAX_FIELD_CHARS:,} (MAX_FIELD_CHARS)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # JSON escapes such as \ud800 give lone surrogates
        return BadRow(INVALID_UTF8, f"{what} holds a lone surrogate ({text[err.start]!r})")
    return None


def _text_field(value: Any, what: str, key: str, expected: str) -> str | BadRow:
    """`value` as the row's `what` (question or answer, read from `key`), or why it cannot be:
    absent or null, not a string (`expected` says what would do), blank, or `_text_problem`."""
    if value is None:
        return BadRow(MISSING, f"no {what} ({key} is absent or null)")
    if not isinstance(value, str):
        return BadRow(WRONG_TYPE, f"{what} ({key}) is a {json_type(value)}, not {expected}")
    if not value.strip():
        return BadRow(MISSING, f"empty {what} ({key})")
    return _text_problem(value, f"{what} ({key})") or value


def parse_row(
    row: dict[str, Any], idx: int, cfg: DataConfig, prefix: str, answer_required: bool = True
) -> Question | BadRow:
    """The question of one row, or why it is not one. `idx` (from 0) is the id of a row with none.
    Without `answer_required`, a row with no answer has the answer "" (a wrong one is still bad)."""
    if "__error__" in row:  # read_rows' mark of an unreadable row
        return BadRow(str(row.get("__kind__", OTHER)), str(row["__error__"]))
    qkey, akey = cfg.question_key, cfg.answer_key
    raw_q, raw_a = dig(row, qkey), dig(row, akey)
    messages: tuple[tuple[str, str], ...] = ()
    if isinstance(raw_q, str) and raw_q.strip().startswith("[{"):
        try:  # chat lists stored as a JSON string (DeepMath's `messages`)
            raw_q = json.loads(raw_q)
        except (json.JSONDecodeError, RecursionError):  # kept as text (and checked as text below)
            pass
    if isinstance(raw_q, list):
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in raw_q):
            return BadRow(WRONG_TYPE, f"{qkey} is a list but not of {{role, content}}")
        messages = tuple((str(m.get("role", "user")), m["content"]) for m in raw_q)
        chat = "".join(c for _, c in messages)
        if bad := _text_problem(chat, f"chat ({qkey})"):
            return bad
        users = [c for r, c in messages if r == "user"]
        if not users:
            return BadRow(MISSING, f"{qkey} has no user turn")
        raw_q = users[-1]
    question = _text_field(raw_q, "question", qkey, "a string or chat list")
    if isinstance(question, BadRow):
        return question
    if isinstance(raw_a, list) and len(raw_a) == 1:
        raw_a = raw_a[0]
    if isinstance(raw_a, float) and not math.isfinite(raw_a):
        return BadRow(WRONG_TYPE, f"answer ({akey}) is {raw_a}, not a value")
    if isinstance(raw_a, int | float) and not isinstance(raw_a, bool):
        raw_a = str(raw_a)
    answer = _text_field(raw_a, "answer", akey, "a string or number")
    if isinstance(answer, BadRow) and not answer_required and answer.kind == MISSING:
        answer = ""
    if isinstance(answer, BadRow):
        return answer
    uid = str(row.get("id") or dig(row, "extra_info.index") or idx)
    meta: dict[str, Any] = {k: row[k] for k in ("data_source", "difficulty", "source") if k in row}
    return Question(
        uid=f"{prefix}-{uid}",
        question=question,
        answer=answer.strip(),
        messages=messages,
        meta=meta,
        columns=dict(row),
    )


def questions_from_rows(
    rows: Iterable[tuple[str, dict[str, Any] | BadRow]],
    cfg: DataConfig,
    prefix: str,
    report: LoadReport,
    answer_required: bool = True,
) -> list[Question]:
    """The questions of located rows (see `located_rows`), counting or refusing the bad ones."""
    out: list[Question] = []
    seen: set[str] = set()
    strict = cfg.on_bad_row == "error"
    idx = -1
    for where, row in rows:
        if isinstance(row, BadRow) and not row.kind:
            continue  # a blank line
        idx += 1  # the row's index among the rows, as ids without an `id` field have always been
        report.count_row()
        q = parse_row(row, idx, cfg, prefix, answer_required) if isinstance(row, dict) else row
        if isinstance(q, BadRow):
            report.skip(f"{where}: {q.reason}", strict, q.kind)
            continue
        if q.uid in seen:  # keep ids unique: they key the replay buffer
            q = dataclasses.replace(q, uid=f"{q.uid}#{idx}")
        seen.add(q.uid)
        out.append(q)
    return out


# (data config, report of skipped rows, whether rows need an answer) -> (training pool, held-out set)
Loader = Callable[[DataConfig, LoadReport, bool], tuple[list[Question], list[Question]]]


@dataclass(frozen=True)
class DataSource:
    load: Loader
    path_kind: Literal["file", "dataset"] | None  # what data.path must name (None: unused)


def _load_synthetic(
    cfg: DataConfig, report: LoadReport, answer_required: bool = True
) -> tuple[list[Question], list[Question]]:
    s = cfg.synthetic
    return synthetic.train_and_val(
        s.num_train, s.num_val, max_digits=s.max_digits, ops=list(s.ops), seed=s.seed
    )


Rows = Iterable[tuple[str, dict[str, Any] | BadRow]]


def _from_rows(read: Callable[[DataConfig], Rows]) -> Loader:
    """A loader for row-based sources: rows -> questions, then the held-out split."""

    def load(
        cfg: DataConfig, report: LoadReport, answer_required: bool = True
    ) -> tuple[list[Question], list[Question]]:
        if cfg.val_path:
            check_val_path(cfg.val_path)  # before the (maybe long) read of the training data
        report.source = cfg.path
        questions = questions_from_rows(read(cfg), cfg, "q", report, answer_required)
        if cfg.val_path:
            report.source = cfg.val_path
            val = questions_from_rows(located_rows(cfg.val_path), cfg, "val", report, answer_required)
            report.source = cfg.path  # later skips (the prompt length filter) are the training data's
        else:
            n_val = min(cfg.val_size, len(questions) // 10)
            questions, val = questions[: len(questions) - n_val], questions[len(questions) - n_val :]
        return questions, val

    return load


def check_val_path(val_path: str) -> None:
    p = Path(val_path).expanduser()
    if p.is_file():
        return
    raise DataError(
        f"data.val_path={val_path}: no such file. The paper recipes (conf/recipe/paper.yaml) hold out "
        "the official valid.parquet from the folder of the official benchmark files, "
        "data.val_path: ${eval.data_dir}/valid.parquet: set eval.data_dir=<that folder>, or "
        "data.val_path=<a held-out jsonl/parquet file>, or data.val_path='' to hold out the last "
        "data.val_size training questions instead"
    )


# `data.source`: name -> loader and what data.path must be
SOURCES: dict[str, DataSource] = {
    "synthetic": DataSource(_load_synthetic, path_kind=None),
    # data=local: parquet when the file's name ends in .parquet, else jsonl
    "local": DataSource(_from_rows(lambda c: located_rows(c.path)), path_kind="file"),
    "jsonl": DataSource(_from_rows(lambda c: located_rows(c.path, "jsonl")), path_kind="file"),
    "parquet": DataSource(_from_rows(lambda c: located_rows(c.path, "parquet")), path_kind="file"),
    "hf": DataSource(_from_rows(lambda c: hf_rows(c.path, c.split)), path_kind="dataset"),
}


def load_questions(
    cfg: DataConfig, answer_required: bool = True
) -> tuple[list[Question], list[Question], LoadReport]:
    """(training pool, held-out set, report of skipped rows). The caller says what was skipped
    (`bad_rows.skipped_rows_lines`: run/training.py prints it once, to the console and train.log).
    `answer_required=False`: the reward needs no gold answer, so a row may have none."""
    report = LoadReport()
    questions, val = pick(SOURCES, "data.source", cfg.source).load(cfg, report, answer_required)
    if not questions:
        raise DataError(
            f"no usable rows in {cfg.path} ({report.skipped} skipped: "
            f"{'; '.join(report.reasons) or 'empty file'})"
        )
    return questions, val, report
