"""Bad data rows: what makes one, how they are counted, and the start-up lines that say so.

Loading the data (sources.py, before the first train step) skips and counts a bad row under
`data.on_bad_row=skip` (the default), or refuses it with a DataError naming the file and the line
(jsonl) or row (parquet, from 1) under `error`. The kinds: bytes that are not UTF-8, a line that is
not JSON or not a JSON object (rows.py), a question or answer that is absent, null, empty, of the
wrong type, or longer than sources.MAX_FIELD_CHARS (sources.py), and a prompt longer than
`model.max_prompt_tokens`, skipped once the tokenizer is loaded (run/setup.py filter_long) and
counted in the same LoadReport. `skipped_rows_lines` says what was skipped, one line per file, for
the trainer's start-up output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exgrpo_cli.errors import UsageError

# the kinds of bad rows, as the start-up line names them
INVALID_UTF8 = "invalid UTF-8"
INVALID_JSON = "invalid JSON"
NOT_OBJECT = "not an object"
MISSING = "missing or empty field"
WRONG_TYPE = "wrong type"
TOO_LONG = "over-long field"
PROMPT_TOO_LONG = "prompt too long"  # run/setup.py filter_long, against model.max_prompt_tokens
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


def json_type(value: Any) -> str:
    """The JSON name of a value's type (`array`, `number` ...), for the reasons of bad rows."""
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
