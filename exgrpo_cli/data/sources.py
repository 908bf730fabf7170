"""Where questions come from: the built-in synthetic task, local jsonl/parquet files, HF datasets.

A row needs a question (a string, or a chat list of {role, content} whose last user turn is the
question) and a gold answer (`data.answer_key`, a dotted path such as reward_model.ground_truth).
A bad row is skipped and counted under `data.on_bad_row=skip` (the default), or refused with a
DataError naming the file and the line (jsonl) or row (parquet, from 1) under `error`: bytes that
are not UTF-8, a line that is not JSON or not a JSON object, a question or answer that is absent,
null, empty, of the wrong type, or longer than MAX_FIELD_CHARS. A prompt longer than
`model.max_prompt_tokens` is skipped later, once the tokenizer is loaded (train/setup.py
filter_long), and counted in the same report. `skipped_rows_lines` says what was skipped, one line
per file, for the trainer's start-up output. A file that cannot be read at all (absent, not
parquet) is a DataError.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from exgrpo_cli.config import DataConfig
from exgrpo_cli.data import synthetic
from exgrpo_cli.data.types import Question
from exgrpo_cli.errors import UsageError
from exgrpo_cli.registry import pick

log = logging.getLogger(__name__)

# A question or gold answer longer than this (in characters) is a bad row. Math questions run to a
# few thousand characters and answers to a few dozen; 100k characters is ~25k tokens, above any
# model.max_prompt_tokens the recipes use (<= 1024), so no usable row is lost. Refusing such a
# field here saves tokenizing it (a 5 MB prompt takes seconds) only for the length filter to drop
# it, and keeps megabytes of garbage out of the grader.
MAX_FIELD_CHARS = 100_000

# the kinds of bad rows, as the start-up line names them
INVALID_UTF8 = "invalid UTF-8"
INVALID_JSON = "invalid JSON"
NOT_OBJECT = "not an object"
MISSING = "missing or empty field"
WRONG_TYPE = "wrong type"
TOO_LONG = "over-long field"
PROMPT_TOO_LONG = "prompt too long"  # train/setup.py filter_long, against model.max_prompt_tokens
OTHER = "other"

FIRST_REASONS = 5  # reasons kept per report


class DataError(UsageError, ValueError):
    """The data cannot be used; the message says which file and why."""


@dataclass(frozen=True)
class BadRow:
    """A row that cannot be a question: its kind (one of the constants above) and why."""

    kind: str
    reason: str


@dataclass
class SourceCounts:
    """What one file gave: rows read, rows skipped by kind, and the first reason."""

    rows: int = 0
    skipped: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    first: str = ""


@dataclass
class LoadReport:
    rows: int = 0
    skipped: int = 0
    reasons: list[str] = field(default_factory=list)  # the first FIRST_REASONS reasons
    kinds: dict[str, int] = field(default_factory=dict)  # skipped rows per kind, all files
    sources: dict[str, SourceCounts] = field(default_factory=dict)  # per file, in reading order
    source: str = ""  # the file being read: rows and skips are counted under it

    def _current(self) -> SourceCounts:
        return self.sources.setdefault(self.source, SourceCounts())

    def count_row(self) -> None:
        self.rows += 1
        self._current().rows += 1

    def skip(self, reason: str, strict: bool, kind: str = OTHER) -> None:
        """Count a skipped row, or raise DataError (naming the file) when `strict`."""
        if strict:
            where = f"{self.source}: " if self.source else ""
            raise DataError(
                f"{where}{reason} (data.on_bad_row=error; data.on_bad_row=skip skips and counts such rows)"
            )
        self.skipped += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if len(self.reasons) < FIRST_REASONS:
            self.reasons.append(reason)
        counts = self._current()
        counts.skipped += 1
        counts.kinds[kind] = counts.kinds.get(kind, 0) + 1
        counts.first = counts.first or reason


def skipped_rows_lines(report: LoadReport) -> list[str]:
    """One line per file with skipped rows, e.g. `skipped 6 of 120 rows of data.jsonl: 3 invalid
    UTF-8, 2 invalid JSON, 1 wrong type (first: line 7: invalid UTF-8 (byte 0xff at column 12))`;
    the kinds by count, most first. Empty when nothing was skipped."""
    lines = []
    for source, c in report.sources.items():
        if not c.skipped:
            continue
        kinds = sorted(c.kinds.items(), key=lambda kv: -kv[1])  # stable: ties keep first-seen order
        what = ", ".join(f"{n} {kind}" for kind, n in kinds)
        name = source or "the data"
        lines.append(f"skipped {c.skipped} of {c.rows} rows of {name}: {what} (first: {c.first})")
    return lines


# ----------------------------------------------------------------------------- reading rows


def located_rows(path: str, fmt: str | None = None) -> Iterator[tuple[str, dict[str, Any] | BadRow]]:
    """(where, row) for each row of a jsonl or parquet file: where is `line N` (jsonl, blank lines
    left out) or `row N` (parquet, from 1); a row that cannot be read is a BadRow. A file that
    cannot be read at all raises DataError."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"data file not found: {p}")
    fmt = fmt or ("parquet" if p.suffix == ".parquet" else "jsonl")
    if fmt == "parquet":
        yield from _parquet_rows(p)
        return
    with p.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            yield f"line {n}", _jsonl_row(raw, first=n == 1)


def _jsonl_row(raw: bytes, first: bool) -> dict[str, Any] | BadRow:
    if first and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        column = len(raw[: err.start].decode("utf-8", errors="replace")) + 1  # as an editor counts
        return BadRow(INVALID_UTF8, f"{INVALID_UTF8} (byte 0x{raw[err.start]:02x} at column {column})")
    if not text.strip():
        return BadRow("", "")  # a blank line: not a row
    try:
        value = json.loads(text.rstrip())  # without the newline: the error's column is on this line
    except json.JSONDecodeError as err:
        return BadRow(INVALID_JSON, f"{INVALID_JSON} ({err.msg} at column {err.colno})")
    if not isinstance(value, dict):
        return BadRow(NOT_OBJECT, f"a JSON {_json_type(value)}, not an object")
    return value


def _parquet_rows(p: Path) -> Iterator[tuple[str, dict[str, Any] | BadRow]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as err:  # ArrowInvalid, OSError ...: a file that is not (or no longer) parquet
        raise DataError(f"{p} is not a readable parquet file ({type(err).__name__}: {err})") from None
    n = 0
    for batch in table.to_batches(max_chunksize=4096):
        rows: list[dict[str, Any] | BadRow]
        try:
            rows = batch.to_pylist()
        except UnicodeDecodeError:  # a string cell that is not UTF-8: find it, row by row
            rows = [_parquet_row(batch.slice(j, 1)) for j in range(batch.num_rows)]
        for row in rows:
            n += 1
            yield f"row {n}", row


def _parquet_row(one: Any) -> dict[str, Any] | BadRow:
    try:
        row: dict[str, Any] = one.to_pylist()[0]
        return row
    except UnicodeDecodeError as err:
        bad = next(
            (name for name, col in zip(one.schema.names, one.columns) if not _decodes(col)), "a column"
        )
        return BadRow(INVALID_UTF8, f"{INVALID_UTF8} in {bad} ({err.reason})")


def _decodes(column: Any) -> bool:
    try:
        column.to_pylist()
    except UnicodeDecodeError:
        return False
    return True


def read_rows(path: str, fmt: str | None = None) -> list[dict[str, Any]]:
    """Every row of a jsonl/parquet file; a row that cannot be read is {"__error__": why}."""
    return [
        row if isinstance(row, dict) else {"__error__": f"{where}: {row.reason}", "__kind__": row.kind}
        for where, row in located_rows(path, fmt)
        if not (isinstance(row, BadRow) and not row.kind)  # blank lines
    ]


# ----------------------------------------------------------------------------- rows to questions


def dig(row: dict[str, Any], dotted: str) -> Any:
    cur: Any = row
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _json_type(value: Any) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


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
        return BadRow(WRONG_TYPE, f"{what} ({key}) is a {_json_type(value)}, not {expected}")
    if not value.strip():
        return BadRow(MISSING, f"empty {what} ({key})")
    return _text_problem(value, f"{what} ({key})") or value


def parse_row(row: dict[str, Any], idx: int, cfg: DataConfig, prefix: str) -> Question | BadRow:
    """The question of one row, or why it is not one. `idx` (from 0) is the id of a row with none."""
    if "__error__" in row:  # read_rows' mark of an unreadable row
        return BadRow(str(row.get("__kind__", OTHER)), str(row["__error__"]))
    qkey, akey = cfg.question_key, cfg.answer_key
    raw_q, raw_a = dig(row, qkey), dig(row, akey)
    messages: tuple[tuple[str, str], ...] = ()
    if isinstance(raw_q, str) and raw_q.strip().startswith("[{"):
        try:  # chat lists stored as a JSON string (DeepMath's `messages`)
            raw_q = json.loads(raw_q)
        except json.JSONDecodeError:
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
    if isinstance(answer, BadRow):
        return answer
    uid = str(row.get("id") or dig(row, "extra_info.index") or idx)
    meta: dict[str, Any] = {k: row[k] for k in ("data_source", "difficulty", "source") if k in row}
    return Question(
        uid=f"{prefix}-{uid}", question=question, answer=answer.strip(), messages=messages, meta=meta
    )


def row_to_question(
    row: dict[str, Any], idx: int, cfg: DataConfig, prefix: str
) -> tuple[Question | None, str]:
    """(question, "") or (None, why): `parse_row` for callers that need no kind."""
    q = parse_row(row, idx, cfg, prefix)
    if isinstance(q, BadRow):
        return None, q.reason if "__error__" in row else f"row {idx}: {q.reason}"
    return q, ""


def questions_from_rows(
    rows: Iterable[tuple[str, dict[str, Any] | BadRow]], cfg: DataConfig, prefix: str, report: LoadReport
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
        q = parse_row(row, idx, cfg, prefix) if isinstance(row, dict) else row
        if isinstance(q, BadRow):
            report.skip(f"{where}: {q.reason}", strict, q.kind)
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


Rows = Iterable[tuple[str, dict[str, Any] | BadRow]]


def _from_rows(read: Callable[[DataConfig], Rows]) -> Loader:
    """A loader for row-based sources: rows -> questions, then the held-out split."""

    def load(cfg: DataConfig, report: LoadReport) -> tuple[list[Question], list[Question]]:
        if cfg.val_path:
            check_val_path(cfg.val_path)  # before the (maybe long) read of the training data
        report.source = cfg.path
        questions = questions_from_rows(read(cfg), cfg, "q", report)
        if cfg.val_path:
            report.source = cfg.val_path
            val = questions_from_rows(located_rows(cfg.val_path), cfg, "val", report)
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
    "jsonl": DataSource(_from_rows(lambda c: located_rows(c.path, "jsonl")), path_kind="file"),
    "parquet": DataSource(_from_rows(lambda c: located_rows(c.path, "parquet")), path_kind="file"),
    "hf": DataSource(_from_rows(lambda c: _hf_rows(c.path, c.split)), path_kind="dataset"),
}


def load_questions(cfg: DataConfig) -> tuple[list[Question], list[Question], LoadReport]:
    """(training pool, held-out set, report of skipped rows)."""
    report = LoadReport()
    questions, val = pick(SOURCES, "data.source", cfg.source).load(cfg, report)
    for line in skipped_rows_lines(report):
        log.warning(line)
    if not questions:
        raise DataError(
            f"no usable rows in {cfg.path} ({report.skipped} skipped: "
            f"{'; '.join(report.reasons) or 'empty file'})"
        )
    return questions, val, report


def _hf_rows(name: str, split: str) -> list[tuple[str, dict[str, Any] | BadRow]]:
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            f"data.source=hf needs the `datasets` package (pip install datasets) "
            f"to load {name!r}; or download it and point data.path at a parquet file"
        ) from err
    return [(f"row {n}", dict(row)) for n, row in enumerate(datasets.load_dataset(name, split=split), 1)]
