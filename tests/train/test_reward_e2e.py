"""`exgrpo train` with the user's reward through the real CLI: a data column reaching the
function, a function that fails on some calls or runs past its budget (the run goes on, counting
them), one that always fails (the run stops with one message), one that does not import (exit 2
before any model loads), and reward_std buckets that `exgrpo inspect-buffer` shows."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from exgrpo_cli.data.synthetic import generate

from conftest import SMALL_RUN, metrics, run_cli, train_ok

FUNCTIONS = """
import os, time
from pathlib import Path

COUNTER = Path({counter!r})


def _call():
    n = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(n))
    return n


def by_level(completions, level, answers, **columns):
    # a data column: the reward is the row's own level / 10, the same for each of its responses
    assert len(level) == len(completions) == len(answers)
    return [lvl / 10 for lvl in level]


def flaky(completions, **columns):
    n = _call()  # call 1 is step 0's validation
    if n == 2:
        raise RuntimeError("no luck on call 2")
    if n == 3:
        time.sleep(60)
    return [0.5] * len(completions)


def broken(completions, **columns):
    raise KeyError("always")
"""


def _functions(tmp_path: Path) -> Path:
    path = tmp_path / "rewards.py"
    path.write_text(FUNCTIONS.format(counter=str(tmp_path / "calls")))
    return path


def _rows(tmp_path: Path) -> Path:
    data = tmp_path / "data.jsonl"
    with data.open("w") as fh:
        for i, q in enumerate(generate(80, max_digits=1, ops=["+"], seed=3, prefix="x")):
            fh.write(json.dumps({"prompt": q.question, "level": i % 5}) + "\n")  # no answer at all
    return data


@pytest.mark.slow
def test_a_data_column_reaches_the_function_and_rows_need_no_answer(tiny_model: Path, tmp_path: Path) -> None:
    fns, data = _functions(tmp_path), _rows(tmp_path)
    args = ["reward=python", f"reward.function={fns}:by_level", "data=local", f"data.path={data}"]
    train_ok(tmp_path / "run", *args, "data.question_key=prompt", "trainer.steps=2", *SMALL_RUN)
    rows = [m for m in metrics(tmp_path / "run") if "reward/mean" in m]
    assert len(rows) == 2
    for m in rows:  # non-binary, and exactly the mean level of the step's rows / 10
        assert 0 < m["reward/mean"] < 0.4 and m["reward/mean"] * 10 == pytest.approx(
            round(m["reward/mean"] * 10 * 4) / 4
        )
        assert m["reward/errors"] == 0 and m["reward/accuracy"] == 0  # nothing reaches correct_at=1


@pytest.mark.slow
def test_failing_and_slow_calls_score_0_and_the_run_goes_on(tiny_model: Path, tmp_path: Path) -> None:
    fns = _functions(tmp_path)
    flaky = ["reward=python", f"reward.function={fns}:flaky", "reward.timeout_s=3", "trainer.steps=3"]
    res = train_ok(tmp_path / "run", *flaky, *SMALL_RUN)
    steps = {m["step"]: m for m in metrics(tmp_path / "run") if "reward/mean" in m}
    assert steps[1]["reward/errors"] == 16 and steps[1]["reward/mean"] == 0  # 4 questions x 4
    assert steps[2]["reward/timeouts"] == 16 and steps[2]["reward/mean"] == 0
    assert steps[3]["reward/errors"] == steps[3]["reward/timeouts"] == 0 and steps[3]["reward/mean"] == 0.5
    assert res.stderr.count("no luck on call 2") == 1  # the first error, said once
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count("Traceback") == 1 and "RuntimeError: no luck on call 2" in log


@pytest.mark.slow
def test_a_function_failing_always_stops_the_run_with_one_message(tiny_model: Path, tmp_path: Path) -> None:
    fns = _functions(tmp_path)
    res = run_cli(
        ["train", "reward=python", f"reward.function={fns}:broken", "reward.max_failed_steps=2",
         "trainer.steps=5", f"hydra.run.dir={tmp_path / 'run'}", *SMALL_RUN]
    )  # fmt: skip
    assert res.returncode == 1, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"exgrpo train: reward.function={fns}:broken failed on every response for 2 steps")
    assert "KeyError: 'always'" in last
    assert "Traceback" not in res.stderr
    assert max(m["step"] for m in metrics(tmp_path / "run")) <= 1  # stopped at step 2


def test_a_function_that_does_not_import_exits_2_before_any_model_loads(tmp_path: Path) -> None:
    t = time.monotonic()
    for spec, says in [
        (f"{tmp_path}/absent.py:f", "no such file"),
        (f"{_functions(tmp_path)}:nope", "has no 'nope'"),
    ]:
        res = run_cli(
            ["train", "reward=python", f"reward.function={spec}", f"hydra.run.dir={tmp_path / 'run'}"]
        )
        assert res.returncode == 2, res.stderr[-3000:]
        lines = res.stderr.strip().splitlines()
        assert lines[-1].startswith(f"exgrpo train: invalid reward.function={spec!r}: ") and says in lines[-1]
        assert "Traceback" not in res.stderr and "Loading weights" not in res.stderr
        assert not (tmp_path / "run" / "checkpoints").exists()
    assert time.monotonic() - t < 120


@pytest.mark.slow
def test_reward_std_buckets_fill_and_inspect_buffer_shows_the_rule(tiny_model: Path, tmp_path: Path) -> None:
    closeness = Path(__file__).resolve().parents[2] / "docs" / "examples" / "closeness.py"
    run = tmp_path / "run"
    rule = ["reward=python", f"reward.function={closeness}:closeness", "replay.bucket_by=reward_std"]
    train_ok(run, *rule, "replay.start_threshold=0", "trainer.steps=3", *SMALL_RUN)
    last = metrics(run)[-1]
    assert last["replay/buffer_questions"] > 0
    out = run_cli(
        ["inspect-buffer", f"inspect.target={run}", "inspect.format=json", f"hydra.run.dir={tmp_path / 'i'}"]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout[out.stdout.index("{") :])
    assert report["bucket_by"] == "reward_std" and sum(b["questions"] for b in report["buckets"]) > 0
    text = run_cli(["inspect-buffer", f"inspect.target={run}", f"hydra.run.dir={tmp_path / 'j'}"])
    assert "normalised reward std (replay.bucket_by=reward_std)" in text.stdout
