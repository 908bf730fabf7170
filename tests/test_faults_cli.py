"""Nothing lost, nothing hung, nothing silent (#13), through the real CLI on the shipped tiny model:
bad data rows are counted and training goes on, or refused with exit 2 naming file and line; a W&B
server that cannot be reached stops an explicit `online` run with exit 2 in seconds."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, cli_env, metrics, run_captured, run_cli

TINY_RUN = [
    "data=local",
    "data.question_key=question",
    "data.answer_key=answer",
    "trainer.steps=1",
    "algo.questions_per_step=2",
    "rollout.n=2",
    "trainer.val_questions=4",
    "trainer.val_samples=1",
    "logger.wandb.mode=disabled",
    "trainer.threads=1",
]


def _data_with_bad_rows(path: Path) -> None:
    """40 arithmetic questions as the tiny model knows them, and five bad lines among them."""
    good = [
        json.dumps({"question": f"What is {a}+{a % 7}?", "answer": str(a + a % 7)}).encode() + b"\n"
        for a in range(1, 41)
    ]
    bad = [
        b'{"question": "What is 2\xd7 3?", "answer": "6"}\n',  # a latin-1 byte: not UTF-8
        b'{"question": "What is 1+1?", "answer": \n',  # cut off: not JSON
        b'"What is 1+1?"\n',  # a JSON string, not an object
        json.dumps({"question": ["What is 1+1?"], "answer": "2"}).encode() + b"\n",  # a list of strings
        json.dumps({"question": "What is 1+1?"}).encode() + b"\n",  # no answer
    ]
    with open(path, "wb") as fh:
        for i, line in enumerate(good):
            fh.write(line)
            if i % 8 == 3:
                fh.write(bad[i // 8])


def _train_on_bad_rows(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """`exgrpo train` of TINY_RUN on tmp_path/data.jsonl (_data_with_bad_rows) into tmp_path/run."""
    _data_with_bad_rows(tmp_path / "data.jsonl")
    args = [*TINY_RUN, f"data.path={tmp_path / 'data.jsonl'}", *extra, f"hydra.run.dir={tmp_path / 'run'}"]
    return run_cli(["train", *args], cwd=tmp_path)


@pytest.mark.slow
def test_training_goes_on_with_the_bad_rows_counted(tiny_model: Path, tmp_path: Path) -> None:
    data, out = tmp_path / "data.jsonl", tmp_path / "run"
    res = _train_on_bad_rows(tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["data/skipped_rows"] == 5.0
    log = (out / "train.log").read_text()
    assert (
        f"skipped 5 of 45 rows of {data}: 1 invalid UTF-8, 1 invalid JSON, 1 not an object, 1 wrong type, "
        "1 missing or empty field (first: line 5: invalid UTF-8 (byte 0xd7 at column 24))"
    ) in log
    assert log.count(f"skipped 5 of 45 rows of {data}") == 1  # said once, not by the loader too


def test_on_bad_row_error_stops_before_the_model_with_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    t = time.monotonic()
    res = _train_on_bad_rows(tmp_path, "data.on_bad_row=error")
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1] == (
        f"exgrpo train: {data}: line 5: invalid UTF-8 (byte 0xd7 at column 24) "
        "(data.on_bad_row=error; data.on_bad_row=skip skips and counts such rows)"
    )
    assert "Traceback" not in res.stderr
    assert time.monotonic() - t < 60


def test_a_missing_val_path_stops_with_the_paper_hint(tmp_path: Path) -> None:
    nowhere = [f"eval.data_dir={tmp_path / 'nowhere'}", "data.val_path=${eval.data_dir}/valid.parquet"]
    res = _train_on_bad_rows(tmp_path, *nowhere)
    assert res.returncode == 2, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"exgrpo train: data.val_path={tmp_path / 'nowhere'}/valid.parquet: no such file.")
    assert "set eval.data_dir=<that folder>" in last


@pytest.mark.slow
def test_wandb_online_with_an_unreachable_server_exits_2_in_seconds(tiny_model: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = cli_env()
    env.pop("WANDB_MODE")  # the CI's disabled: this test is about online
    home = tmp_path / "home"
    home.mkdir()
    env.update(
        HOME=str(home),
        WANDB_DIR=str(tmp_path / "wandb"),
        WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
        WANDB_DATA_DIR=str(tmp_path / "wandb-data"),
        WANDB_BASE_URL=f"http://127.0.0.1:{port}",
        WANDB_API_KEY="k" * 40,
    )
    args = [a for a in TINY_RUN if not a.startswith(("logger.", "data"))]
    t = time.monotonic()
    online = ["logger.wandb.mode=online", f"hydra.run.dir={tmp_path / 'run'}"]
    res = run_captured([sys.executable, "-m", "exgrpo_cli", "train", *args, *online], REPO, env)
    took = time.monotonic() - t
    assert res.returncode == 2, res.stderr[-3000:]
    assert (
        res.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"exgrpo train: logger.wandb.mode=online: the W&B server http://127.0.0.1:{port} is unreachable "
            "(connection refused)."
        )
    )
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert took < 60, took  # the probe answers at once; the rest is start-up
