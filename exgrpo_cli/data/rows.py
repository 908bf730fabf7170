"""Reading rows: jsonl and parquet files, and datasets from the HF hub, into (where, row) pairs.

The first thing loading the data does (sources.py, before the first train step), and what
`exgrpo eval` reads custom benchmark files with (`read_rows`). A row that cannot be read (bytes
that are not UTF-8, a line that is not JSON or not a JSON object) comes back as a BadRow, for the
caller to skip and count or refuse; a file that cannot be read at all (absent, not parquet) is a
DataError.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from exgrpo_cli.data.bad_rows import INVALID_JSON, INVALID_UTF8, NOT_OBJECT, BadRow, DataError, json_type


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
    except RecursionError:  # a line of thousands of brackets: one bad row, not the end of the load
        return BadRow(INVALID_JSON, f"{INVALID_JSON} (nested deeper than the parser allows)")
    if not isinstance(value, dict):
        return BadRow(NOT_OBJECT, f"a JSON {json_type(value)}, not an object")
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


def hf_rows(name: str, split: str) -> list[tuple[str, dict[str, Any] | BadRow]]:
    """(`row N`, row) for each row of a split of a datasets-hub dataset (data.source=hf), from 1."""
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            f"data.source=hf needs the `datasets` package (pip install datasets) "
            f"to load {name!r}; or download it and point data.path at a parquet file"
        ) from err
    return [(f"row {n}", dict(row)) for n, row in enumerate(datasets.load_dataset(name, split=split), 1)]
