"""Bad data rows, every one counted (data.on_bad_row=skip) or refused with its file and line
(data.on_bad_row=error), in jsonl and parquet files written byte by byte here."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exgrpo_cli.config.schema import DataConfig
from exgrpo_cli.data.bad_rows import (
    INVALID_JSON,
    INVALID_UTF8,
    MISSING,
    NOT_OBJECT,
    TOO_LONG,
    WRONG_TYPE,
    BadRow,
    DataError,
    skipped_rows_lines,
)
from exgrpo_cli.data.rows import read_rows
from exgrpo_cli.data.sources import MAX_FIELD_CHARS, load_questions, parse_row


def _line(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


GOOD = [_line({"prompt": f"What is {i}+1?", "ground_truth": str(i + 1)}) for i in range(12)]

# (bytes of the line, kind it is skipped as): every kind a jsonl line can go wrong in
BAD_LINES = [
    (b'{"prompt": "caf\xe9?", "ground_truth": "1"}\n', INVALID_UTF8),  # latin-1, not UTF-8
    (b'{"prompt": "x", "ground_truth": \n', INVALID_JSON),
    (b"[1, 2]\n", NOT_OBJECT),
    (_line({"prompt": 5, "ground_truth": "1"}), WRONG_TYPE),
    (_line({"prompt": "   ", "ground_truth": "1"}), MISSING),
    (_line({"prompt": "What is 2+2?", "ground_truth": None}), MISSING),
    (_line({"question": "wrong key", "ground_truth": "1"}), MISSING),
    (_line({"prompt": "y" * (MAX_FIELD_CHARS + 1), "ground_truth": "1"}), TOO_LONG),
    (b'{"prompt": "lone \\ud800 surrogate", "ground_truth": "1"}\n', INVALID_UTF8),
    (_line({"prompt": "What is 3+3?", "ground_truth": True}), WRONG_TYPE),
    (b'{"prompt": "What is 0/0?", "ground_truth": NaN}\n', WRONG_TYPE),
    (b"\xff\xfe\n", INVALID_UTF8),
]


def _cfg(path: Path, **kw: object) -> DataConfig:
    return DataConfig(source="jsonl", path=str(path), val_size=0, **kw)  # type: ignore[arg-type]


def _write_mixed(path: Path) -> None:
    """A BOM, then good and bad lines in turn, a blank line, and the last bad line."""
    with open(path, "wb") as fh:
        fh.write(b"\xef\xbb\xbf" + GOOD[0])
        for (bad, _), good in zip(BAD_LINES[:-1], GOOD[1:]):
            fh.write(bad)
            fh.write(good)
        fh.write(b"\n")
        fh.write(BAD_LINES[-1][0])


def test_every_bad_jsonl_line_is_skipped_and_counted_by_kind(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    _write_mixed(path)
    train, val, report = load_questions(_cfg(path))
    assert val == []
    assert sorted(q.answer for q in train) == sorted(str(i + 1) for i in range(12))
    assert (report.rows, report.skipped) == (12 + len(BAD_LINES), len(BAD_LINES))
    assert report.kinds == {
        INVALID_UTF8: 3,
        INVALID_JSON: 1,
        NOT_OBJECT: 1,
        WRONG_TYPE: 3,
        MISSING: 3,
        TOO_LONG: 1,
    }
    assert report.reasons == [
        "line 2: invalid UTF-8 (byte 0xe9 at column 16)",
        "line 4: invalid JSON (Expecting value at column 32)",
        "line 6: a JSON array, not an object",
        "line 8: question (prompt) is a number, not a string or chat list",
        "line 10: empty question (prompt)",
    ]
    (line,) = skipped_rows_lines(report)
    assert line == (
        f"skipped 12 of 24 rows of {path}: 3 invalid UTF-8, 3 wrong type, 3 missing or empty field, "
        "1 invalid JSON, 1 not an object, 1 over-long field "
        "(first: line 2: invalid UTF-8 (byte 0xe9 at column 16))"
    )


def test_ids_count_the_bad_rows_as_before(tmp_path: Path) -> None:
    """A row without an `id` is named by its index among the non-blank rows, bad ones included: the
    ids (the replay buffer's keys) of a file do not depend on which of its rows are readable."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD[0] + b"\xff\n" + b"\n" + GOOD[1] + b"{oops\n" + GOOD[2])
    train, _, report = load_questions(_cfg(path))
    assert [q.uid for q in train] == ["q-0", "q-2", "q-4"]
    assert report.reasons == [
        "line 2: invalid UTF-8 (byte 0xff at column 1)",
        "line 5: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
    ]


@pytest.mark.parametrize(("bad", "kind"), BAD_LINES)
def test_on_bad_row_error_refuses_with_file_and_line(tmp_path: Path, bad: bytes, kind: str) -> None:
    path = tmp_path / "strict.jsonl"
    path.write_bytes(GOOD[0] + b"\n" + bad + GOOD[1])
    with pytest.raises(DataError) as err:
        load_questions(_cfg(path, on_bad_row="error"))
    msg = str(err.value)
    assert msg.startswith(f"{path}: line 3: ") and msg.endswith(
        "(data.on_bad_row=error; data.on_bad_row=skip skips and counts such rows)"
    )
    assert err.value.exit_code == 2
    _, _, report = load_questions(_cfg(path))  # the same file under skip
    assert report.kinds == {kind: 1} and report.rows == 3


def test_a_file_of_bad_rows_only_is_refused_with_the_reasons(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\xff\n[1]\n")
    with pytest.raises(DataError, match=r"no usable rows in .*bad\.jsonl \(2 skipped: line 1: invalid UTF-8"):
        load_questions(_cfg(path))


def test_read_rows_marks_undecodable_lines_instead_of_raising(tmp_path: Path) -> None:
    """read_rows is what `exgrpo eval` reads custom files with: a bad line is a marked row."""
    path = tmp_path / "eval.jsonl"
    path.write_bytes(GOOD[0] + b"\n" + b'{"prompt": "\xc3("}\n' + b'{"prompt": "\xc3\xa9\xff"}\n')
    rows = read_rows(str(path))
    assert rows[2]["__error__"] == "line 4: invalid UTF-8 (byte 0xff at column 14)"  # columns in characters
    assert rows[0] == json.loads(GOOD[0])
    assert rows[1] == {
        "__error__": "line 3: invalid UTF-8 (byte 0xc3 at column 13)",
        "__kind__": INVALID_UTF8,
    }
    assert parse_row(rows[1], 1, DataConfig(), "x") == BadRow(
        INVALID_UTF8, "line 3: invalid UTF-8 (byte 0xc3 at column 13)"
    )
    q = parse_row({"prompt": "hi", "ground_truth": ["7"]}, 4, DataConfig(), "x")
    assert not isinstance(q, BadRow) and (q.uid, q.answer) == ("x-4", "7")
    assert parse_row({"prompt": 3, "ground_truth": "7"}, 4, DataConfig(), "x") == BadRow(
        WRONG_TYPE, "question (prompt) is a number, not a string or chat list"
    )


# ----------------------------------------------------------------------------- parquet


def _not_utf8(values: list[bytes | None]) -> pa.Array:
    """A string column holding bytes that are not UTF-8, as another writer may leave them."""
    return pa.array(values, type=pa.binary()).view(pa.string())


def test_parquet_nulls_wrong_types_and_bad_bytes_are_counted(tmp_path: Path) -> None:
    chat = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    table = pa.table(
        {
            "prompt": pa.array(
                [
                    [{"role": "user", "content": "What is 1+1?"}],
                    None,
                    [{"role": "user", "content": None}],  # content null: not a chat message
                    [{"role": "system", "content": "be brief"}],  # no user turn
                    [{"role": "user", "content": "What is 2+2?"}],
                    [{"role": "user", "content": "What is 3+3?"}],
                ],
                type=chat,
            ),
            "gold": _not_utf8([b"2", b"1", b"1", b"1", b"4\xff", None]),
        }
    )
    path = tmp_path / "train.parquet"
    pq.write_table(table, path)
    cfg = DataConfig(source="parquet", path=str(path), answer_key="gold", val_size=0)
    train, _, report = load_questions(cfg)
    assert [(q.question, q.answer) for q in train] == [("What is 1+1?", "2")]
    assert report.kinds == {MISSING: 3, WRONG_TYPE: 1, INVALID_UTF8: 1}
    assert skipped_rows_lines(report) == [
        f"skipped 5 of 6 rows of {path}: 3 missing or empty field, 1 wrong type, 1 invalid UTF-8 "
        "(first: row 2: no question (prompt is absent or null))"
    ]
    assert report.reasons[1:] == [
        "row 3: prompt is a list but not of {role, content}",
        "row 4: prompt has no user turn",
        "row 5: invalid UTF-8 in gold (invalid start byte)",
        "row 6: no answer (gold is absent or null)",
    ]
    with pytest.raises(
        DataError, match=rf"^{path}: row 2: no question \(prompt is absent or null\) \(data.on_bad_row=error"
    ):
        load_questions(DataConfig(source="parquet", path=str(path), answer_key="gold", on_bad_row="error"))


def test_parquet_column_of_the_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"prompt": [1, 2], "ground_truth": ["1", "2"]}), path)
    with pytest.raises(DataError, match=r"2 skipped: row 1: question \(prompt\) is a number"):
        load_questions(DataConfig(source="parquet", path=str(path)))


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_corrupt_parquet_file_is_a_data_error(tmp_path: Path, damage: str) -> None:
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"prompt": ["What is 1+1?"] * 50, "ground_truth": ["2"] * 50}), good)
    path = tmp_path / "bad.parquet"
    raw = good.read_bytes()
    path.write_bytes(b"PAR1 not parquet" if damage == "garbage" else raw[: len(raw) // 2])
    with pytest.raises(DataError, match=rf"^{path} is not a readable parquet file \(ArrowInvalid: "):
        load_questions(DataConfig(source="parquet", path=str(path)))


# ----------------------------------------------------------------------------- held-out file


def test_a_missing_val_path_says_where_the_paper_recipes_read_it(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"".join(GOOD))
    missing = tmp_path / "official" / "valid.parquet"
    with pytest.raises(DataError) as err:
        load_questions(_cfg(path, val_path=str(missing)))
    msg = str(err.value)
    assert msg.startswith(f"data.val_path={missing}: no such file.")
    assert "data.val_path: ${eval.data_dir}/valid.parquet" in msg and "eval.data_dir=<" in msg
    assert "data.val_path=''" in msg


def test_skips_are_counted_per_file_and_later_ones_go_to_the_training_file(tmp_path: Path) -> None:
    train_path, val_path = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train_path.write_bytes(b"".join(GOOD[:4]) + b"\xff\n")
    val_path.write_bytes(GOOD[4] + b"[]\n[]\n")
    train, val, report = load_questions(_cfg(train_path, val_path=str(val_path)))
    assert (len(train), len(val)) == (4, 1)
    # run/setup.py's prompt length filter, once the tokenizer is there: the first question's
    # prompt counts 300 tokens here, the others 10
    from exgrpo_cli.data.templates import get_template
    from exgrpo_cli.run.setup import filter_long

    def tokenizer(text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [0] * (300 if train[0].question in text else 10)}

    assert filter_long(train, get_template("plain"), tokenizer, 128, report) == train[1:]
    assert skipped_rows_lines(report) == [
        f"skipped 2 of 5 rows of {train_path}: 1 invalid UTF-8, 1 prompt too long "
        "(first: line 5: invalid UTF-8 (byte 0xff at column 1))",
        f"skipped 2 of 3 rows of {val_path}: 2 not an object (first: line 2: a JSON array, not an object)",
    ]
    assert (report.rows, report.skipped) == (8, 4)


def test_nothing_skipped_says_nothing(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"".join(GOOD))
    _, _, report = load_questions(_cfg(path))
    assert (report.rows, report.skipped, skipped_rows_lines(report)) == (12, 0, [])


# a 200 KB line of brackets: json.loads raised RecursionError, which stopped the whole load (issue 46)
DEEP = b"[" * 200_000 + b"\n"
# a question that looks like a chat list stored as text (DeepMath's): kept as the text it is
DEEP_CHAT = _line({"prompt": "[{" + "[" * 90_000, "ground_truth": "1"})


@pytest.mark.parametrize("on_bad_row", ["skip", "error"])
def test_a_deeply_nested_line_is_one_bad_row(tmp_path: Path, on_bad_row: str) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(GOOD[0] + DEEP + GOOD[1] + DEEP_CHAT + b"".join(GOOD[2:]))
    if on_bad_row == "error":
        with pytest.raises(DataError, match="line 2: invalid JSON .nested deeper"):
            load_questions(_cfg(path, on_bad_row="error"))
        return
    train, _, report = load_questions(_cfg(path))
    assert len(train) == len(GOOD) + 1 and report.skipped == 1, report
    assert report.kinds == {INVALID_JSON: 1}, report.kinds
    rows = read_rows(str(path))  # what `exgrpo eval eval=custom` reads
    assert rows[1]["__kind__"] == INVALID_JSON and len(rows) == len(GOOD) + 2
