"""Where questions come from: the built-in synthetic task, local jsonl/parquet files, HF datasets.

A row needs a question (a string, or a chat list of {role, content} whose last user turn is the
question) and a gold answer (`data.answer_key`, a dotted path such as reward_model.ground_truth).
Rows that lack either, have the wrong types, or whose prompt is too long are skipped and counted
(`data.on_bad_row=error` refuses them instead).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from exgrpo_cli.config import DataConfig
from exgrpo_cli.data import synthetic
from exgrpo_cli.data.types import Question
from exgrpo_cli.errors import UsageError

log = logging.getLogger(__name__)


class DataError(UsageError, ValueError):
    """The data cannot be used; the message says which file and why."""


@dataclass
class LoadReport:
    rows: int = 0
    skipped: int = 0
    reasons: list[str] = field(default_factory=list)  # the first few reasons

    def skip(self, reason: str, strict: bool) -> None:
        if strict:
            raise DataError(reason + " (data.on_bad_row=error)")
        self.skipped += 1
        if len(self.reasons) < 5:
            self.reasons.append(reason)


def read_rows(path: str, fmt: str | None = None) -> list[dict[str, Any]]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"data file not found: {p}")
    fmt = fmt or ("parquet" if p.suffix == ".parquet" else "jsonl")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table_rows: list[dict[str, Any]] = pq.read_table(p).to_pylist()
        return table_rows
    rows: list[dict[str, Any]] = []
    with p.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                rows.append({"__error__": f"line {n}: invalid JSON ({err.msg})"})
    return rows


def dig(row: dict[str, Any], dotted: str) -> Any:
    cur: Any = row
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def row_to_question(
    row: dict[str, Any], idx: int, cfg: DataConfig, prefix: str
) -> tuple[Question | None, str]:
    if "__error__" in row:
        return None, row["__error__"]
    raw_q, raw_a = dig(row, cfg.question_key), dig(row, cfg.answer_key)
    messages: tuple[tuple[str, str], ...] = ()
    if isinstance(raw_q, str) and raw_q.strip().startswith("[{"):
        try:  # chat lists stored as a JSON string (DeepMath's `messages`)
            raw_q = json.loads(raw_q)
        except json.JSONDecodeError:
            pass
    if isinstance(raw_q, list):
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in raw_q):
            return None, f"row {idx}: {cfg.question_key} is a list but not of {{role, content}}"
        messages = tuple((str(m.get("role", "user")), m["content"]) for m in raw_q)
        users = [c for r, c in messages if r == "user"]
        raw_q = users[-1] if users else None
    if not isinstance(raw_q, str) or not raw_q.strip():
        return None, f"row {idx}: missing or empty question ({cfg.question_key})"
    if isinstance(raw_a, (int, float)) and not isinstance(raw_a, bool):
        raw_a = str(raw_a)
    if isinstance(raw_a, list) and len(raw_a) == 1 and isinstance(raw_a[0], str):
        raw_a = raw_a[0]
    if not isinstance(raw_a, str) or not raw_a.strip():
        return None, f"row {idx}: missing or empty answer ({cfg.answer_key})"
    uid = str(row.get("id") or dig(row, "extra_info.index") or idx)
    meta: dict[str, Any] = {k: row[k] for k in ("data_source", "difficulty", "source") if k in row}
    return Question(
        uid=f"{prefix}-{uid}", question=raw_q, answer=raw_a.strip(), messages=messages, meta=meta
    ), ""


def questions_from_rows(
    rows: Iterable[dict[str, Any]], cfg: DataConfig, prefix: str, report: LoadReport
) -> list[Question]:
    out: list[Question] = []
    seen: set[str] = set()
    for idx, row in enumerate(rows):
        report.rows += 1
        if not isinstance(row, dict):
            report.skip(f"row {idx}: not an object", cfg.on_bad_row == "error")
            continue
        q, why = row_to_question(row, idx, cfg, prefix)
        if q is None:
            report.skip(why, cfg.on_bad_row == "error")
            continue
        if q.uid in seen:  # keep ids unique: they key the replay buffer
            q = Question(
                uid=f"{q.uid}#{idx}", question=q.question, answer=q.answer, messages=q.messages, meta=q.meta
            )
        seen.add(q.uid)
        out.append(q)
    return out


# (data config, report of skipped rows) -> (training pool, held-out set)
Loader = Callable[[DataConfig, LoadReport], tuple[list[Question], list[Question]]]


@dataclass(frozen=True)
class DataSource:
    load: Loader
    path_kind: Literal["file", "dataset"] | None  # what data.path must name (None: unused)


def _load_synthetic(cfg: DataConfig, report: LoadReport) -> tuple[list[Question], list[Question]]:
    s = cfg.synthetic
    return synthetic.train_and_val(
        s.num_train, s.num_val, max_digits=s.max_digits, ops=list(s.ops), seed=s.seed
    )


def _from_rows(read: Callable[[DataConfig], Iterable[dict[str, Any]]]) -> Loader:
    """A loader for row-based sources: rows -> questions, then the held-out split."""

    def load(cfg: DataConfig, report: LoadReport) -> tuple[list[Question], list[Question]]:
        questions = questions_from_rows(read(cfg), cfg, "q", report)
        if cfg.val_path:
            val = questions_from_rows(read_rows(cfg.val_path), cfg, "val", report)
        else:
            n_val = min(cfg.val_size, len(questions) // 10)
            questions, val = questions[: len(questions) - n_val], questions[len(questions) - n_val :]
        return questions, val

    return load


# `data.source`: name -> loader and what data.path must be
SOURCES: dict[str, DataSource] = {
    "synthetic": DataSource(_load_synthetic, path_kind=None),
    "jsonl": DataSource(_from_rows(lambda c: read_rows(c.path, "jsonl")), path_kind="file"),
    "parquet": DataSource(_from_rows(lambda c: read_rows(c.path, "parquet")), path_kind="file"),
    "hf": DataSource(_from_rows(lambda c: _hf_rows(c.path, c.split)), path_kind="dataset"),
}


def load_questions(cfg: DataConfig) -> tuple[list[Question], list[Question], LoadReport]:
    """(training pool, held-out set, report of skipped rows)."""
    report = LoadReport()
    if cfg.source not in SOURCES:
        raise DataError(f"unknown data.source {cfg.source!r}; known: {', '.join(SOURCES)}")
    questions, val = SOURCES[cfg.source].load(cfg, report)
    if report.skipped:
        log.warning(
            "skipped %d of %d data rows; first reasons: %s",
            report.skipped,
            report.rows,
            "; ".join(report.reasons),
        )
    if not questions:
        raise DataError(
            f"no usable rows in {cfg.path} ({report.skipped} skipped: "
            f"{'; '.join(report.reasons) or 'empty file'})"
        )
    return questions, val, report


def _hf_rows(name: str, split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            f"data.source=hf needs the `datasets` package (pip install datasets) "
            f"to load {name!r}; or download it and point data.path at a parquet file"
        ) from err
    return list(datasets.load_dataset(name, split=split))
