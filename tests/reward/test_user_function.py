"""reward=python: loading the user's function, checking what it returns, and running it in its
worker process under a time budget (exgrpo_cli/reward/user_function.py)."""

from __future__ import annotations

import math
import time
from contextlib import closing
from pathlib import Path

import pytest

from exgrpo_cli.config.schema import ConfigError
from exgrpo_cli.data.types import Question
from exgrpo_cli.reward.user_function import FunctionReward, call_arguments, check_output, load_function

FUNCTIONS = """
import time

def length(completions, **kw):
    return [float(len(c)) for c in completions]

def echo_level(completions, level, prompts, answers, **kw):
    return [float(x) for x in level]

def flaky(completions, **kw):
    if any("boom" in c for c in completions):
        raise ZeroDivisionError("boom in a completion")
    return [1.0] * len(completions)

def slow(completions, **kw):
    if any("slow" in c for c in completions):
        time.sleep(60)
    return [0.5] * len(completions)

def maybe(completions, **kw):
    return [None if c == "skip" else 1.0 for c in completions]

NOT_CALLABLE = 3
"""


@pytest.fixture
def module(tmp_path: Path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(FUNCTIONS)
    return path


def test_load_function_refuses_what_cannot_be_called(module: Path, tmp_path: Path) -> None:
    assert load_function(f"{module}:length")(["ab"]) == [2.0]
    assert load_function("math:sqrt")(4.0) == 2.0  # package.module:name
    bad = tmp_path / "broken.py"
    bad.write_text("def f(:\n")
    for spec, says in [
        (f"{tmp_path}/absent.py:f", "no such file"),
        (f"{module}:absent", "has no 'absent'"),
        (f"{module}:NOT_CALLABLE", "not callable"),
        (f"{bad}:f", "SyntaxError"),
        ("no_such_module_xyz:f", "ModuleNotFoundError"),
        (str(module), "allowed path/to/file.py:name"),
    ]:
        with pytest.raises(ConfigError, match=says):
            load_function(spec)


def test_check_output_accepts_one_finite_number_or_none_per_completion() -> None:
    assert check_output([1, 0.5, None], 3) == [1.0, 0.5, None]
    for out, says in [
        ([1.0], "1 values for 2"),
        ("ab", "not a list"),
        ([1.0, math.nan], "not a finite number"),
        ([1.0, "1"], "not a number"),
        ([True, 1.0], "not a number"),
        (None, "not a list"),
    ]:
        with pytest.raises(ValueError, match=says):
            check_output(out, 2)


def test_call_arguments_pass_every_column_under_its_name_and_our_aliases() -> None:
    qs = [
        Question("a", "1+1", "2", columns={"prompt": "1+1", "level": 3}),
        Question("b", "2+2", "", columns={"prompt": "2+2", "tag": "x", "answers": "shadowed"}),
    ]
    kw = call_arguments(["r1", "r2"], qs)
    assert kw["completions"] == ["r1", "r2"] and kw["prompts"] == ["1+1", "2+2"]
    assert kw["answers"] == ["2", ""]  # ours win over a column of the same name
    assert kw["level"] == [3, None] and kw["tag"] == [None, "x"]


@pytest.mark.slow
def test_worker_scores_counts_failures_and_survives_them(
    module: Path, caplog: pytest.LogCaptureFixture
) -> None:
    qs = [Question(str(i), "q", "1", columns={"level": i}) for i in range(3)]
    with closing(FunctionReward(f"{module}:echo_level", timeout_s=10)) as fr:
        assert fr.score(["a", "b", "c"], ["1"] * 3, questions=qs).rewards == [0.0, 1.0, 2.0]
    with closing(FunctionReward(f"{module}:flaky", timeout_s=10)) as fr:
        bad = fr.score(["ok", "boom"], ["1", "1"])
        assert bad.rewards == [0.0, 0.0] and bad.errors == 2
        assert "ZeroDivisionError: boom in a completion" in fr.first_error
        fr.score(["boom"], ["1"])
        assert caplog.text.count("Traceback") == 1  # the first traceback, once
        assert fr.score(["ok"], ["1"]).rewards == [1.0]  # the worker lives on
        assert fr.metrics()["reward/errors"] == 3
    with closing(FunctionReward(f"{module}:slow", timeout_s=1.5)) as fr:
        t0 = time.monotonic()
        late = fr.score(["slow", "x"], ["1", "1"])
        assert late.timeouts == 2 and late.rewards == [0.0, 0.0]
        assert time.monotonic() - t0 < 10
        assert fr.score(["fast"], ["1"]).rewards == [0.5]  # a fresh worker took its place
    with closing(FunctionReward(f"{module}:maybe", timeout_s=10)) as fr:
        res = fr.score(["skip", "x"], ["1", "1"])
        assert res.rewards == [0.0, 1.0] and res.unscored == 1 and res.errors == 0
