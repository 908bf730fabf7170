"""Scoring exact values, timeouts and worker crashes (`exgrpo_cli.reward.scorer` / `pool`)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from exgrpo_cli.reward import AnswerRule, RewardScorer, ScoreResult, score

SLOW_GOLD, SLOW_PRED = "9^{9^{9^9}}", "\\boxed{10^{10^{10^{10}}}}"  # verify runs until its alarm


@pytest.fixture(scope="module")
def scorer() -> Iterator[RewardScorer]:
    with RewardScorer(workers=2, timeout_s=5.0) as s:
        yield s


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _ready(s: RewardScorer) -> list[int]:
    """Score one item that needs a worker so that every worker has started; return their pids."""
    s.score(["\\boxed{1/3}"] * 2, ["0.5"] * 2)
    return [p for p in s.worker_pids() if p is not None]


MATH_CASES = [
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{x=3}", "3", 1.0),
    ("so x=3", "3", 1.0),  # fallback: last number
    ("\\boxed{(1,2]}", "(1,2]", 1.0),
    ("\\boxed{\\{3,2,1\\}}", "\\{1,2,3\\}", 1.0),
    ("\\boxed{2,1}", "\\boxed{1,2}", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\sqrt{2}/2", 1.0),
    ("\\boxed{6.283185307}", "2\\pi", 1.0),
    ("\\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
    ("\\boxed{1\\,000}", "1000", 1.0),
    ("The answer is $\\frac{3}{4}$.", "0.75", 1.0),
    ("\\boxed{42}", "42", 1.0),
    ("\\boxed{\\frac{1}{3}}", "\\frac12", 0.0),
    ("I think it's 41", "42", 0.0),
    ("\\boxed{(1,2)}", "(1,2]", 0.0),
    ("\\boxed{x \\ge 0}", "[0,\\infty)", 0.0),  # math-verify needs allow_set_relation_comp for this
    ("\\boxed{2}", "x=2, y=3", 0.0),
    ("\\boxed{}", "1", 0.0),
    ("", "1", 0.0),
    ("\\boxed{1}", "", 0.0),
    ("", "", 0.0),
    ("\\boxed{$$}", "1", 0.0),
    ("\\boxed{\\frac{1}{", "\\frac{1}{2}", 0.0),  # truncated
]


def test_math_exact_values(scorer: RewardScorer) -> None:
    responses, golds, _ = zip(*MATH_CASES)
    result = scorer.score(list(responses), list(golds))
    assert isinstance(result, ScoreResult)
    assert list(zip(responses, golds, result.rewards)) == MATH_CASES
    assert result.timeouts == 0
    assert result.errors == 2  # the two empty gold answers (counted whatever the response)
    assert result.extracted[0] == "0.5" and result.extracted[19] is None


def test_choice_kind(scorer: RewardScorer) -> None:
    cases = [
        ("\\boxed{C}", "C", 1.0),
        ("\\boxed{(c)}", "C", 1.0),
        ("\\boxed{C)}", "(C)", 1.0),
        ("\\boxed{\\text{C}}", "c", 1.0),
        ("The answer is (B).", "B", 1.0),
        ("\\boxed{(C) 42}", "C", 1.0),
        ("\\boxed{D}", "C", 0.0),
        ("\\boxed{Cat}", "C", 0.0),
        ("no letter", "A", 0.0),
        ("\\boxed{K}", "K", 0.0),
    ]
    responses, golds, expected = (list(x) for x in zip(*cases))
    result = scorer.score(responses, golds, kinds=["choice"] * len(cases))
    assert result.rewards == expected
    assert result.errors == 1  # "K" is not a choice letter A-J
    mixed = scorer.score(["\\boxed{B}", "\\boxed{0.5}"], ["B", "1/2"], kinds=["choice", "math"])
    assert mixed.rewards == [1.0, 1.0]


def test_think_requirement() -> None:
    with RewardScorer(requires_think=True, workers=1) as s:
        result = s.score(["<think>1</think>\\boxed{2}", "\\boxed{2}", "<think>\\boxed{2}"], ["2", "2", "2"])
    assert result.rewards == [1.0, 0.0, 0.0]
    assert result.extracted == ["2", None, None]


def test_think_template_grades_the_text_after_the_first_close_tag() -> None:
    responses = ["<think>a</think>\\boxed{2}</think>\\boxed{3}", "<think>a</think>x</think>\\boxed{2}"]
    with RewardScorer(requires_think=True, workers=1) as s:
        result = s.score(responses, ["2", "2"])
    assert result.rewards == [1.0, 0.0]
    assert result.extracted == ["2", None]


def test_answer_rules_per_item(scorer: RewardScorer) -> None:
    official = AnswerRule("first_or_whole", boxed_only=True)
    responses = ["no think \\boxed{2}", "the answer is 2", "<think>a</think>\\boxed{2}", "\\boxed{C}"]
    rules = [official, official, AnswerRule("first"), official]
    result = scorer.score(responses, ["2", "2", "2", "C"], kinds=["math"] * 3 + ["choice"], rules=rules)
    assert result.rewards == [1.0, 0.0, 1.0, 1.0]
    assert result.extracted == ["2", None, "2", "C"]
    # without rules: the scorer's own (training) rule, here "last" with its fallbacks
    assert scorer.score(responses[:2], ["2", "2"]).rewards == [1.0, 1.0]
    with pytest.raises(ValueError, match="answer rules"):
        scorer.score(responses, ["2"] * 4, rules=rules[:2])


def test_module_level_score() -> None:
    responses = ["\\boxed{0.5}", "<think>\\boxed{7}</think>\\boxed{3}", "nothing"]
    assert score(responses, ["1/2", "3", "1"]) == [1.0, 1.0, 0.0]
    assert score([], []) == []


def test_long_answer_scores_zero_without_parsing(scorer: RewardScorer) -> None:
    long = "1" * 1001
    result = scorer.score(["\\boxed{" + long + "}"], [long])
    assert result.rewards == [0.0] and result.timeouts == 0 and result.errors == 0


def test_bad_arguments(scorer: RewardScorer) -> None:
    with pytest.raises(ValueError, match="answers"):
        scorer.score(["a"], [])
    with pytest.raises(ValueError, match="kind"):
        scorer.score(["a"], ["a"], kinds=["code"])
    with pytest.raises(ValueError, match="timeout_s"):
        RewardScorer(timeout_s=0)


def test_works_from_a_non_main_thread(scorer: RewardScorer) -> None:
    out: list[list[float]] = []

    def work() -> None:
        out.append(scorer.score(["\\boxed{0.5}", "\\boxed{2}"], ["1/2", "3"]).rewards)

    t = threading.Thread(target=work)
    t.start()
    t.join(60)
    assert out == [[1.0, 0.0]]


def test_slow_item_times_out_and_scorer_recovers(scorer: RewardScorer) -> None:
    before = scorer.metrics()
    start = time.monotonic()
    result = scorer.score([SLOW_PRED, "\\boxed{0.5}"], [SLOW_GOLD, "1/2"], timeout_s=1)
    assert time.monotonic() - start < 10.0
    assert result.rewards == [0.0, 1.0]
    assert result.timeouts == 1 and result.errors == 0
    after = scorer.metrics()
    assert after["reward/timeouts"] == before["reward/timeouts"] + 1
    assert after["reward/errors"] == before["reward/errors"]
    assert scorer.score(["\\boxed{\\frac{2}{4}}"], ["0.5"]).rewards == [1.0]


def test_unresponsive_worker_is_killed_at_the_hard_deadline() -> None:
    with RewardScorer(workers=1, timeout_s=1.0) as s:
        (pid,) = _ready(s)
        os.kill(pid, signal.SIGSTOP)  # alive but deaf: only the parent's deadline can end this
        start = time.monotonic()
        result = s.score(["\\boxed{1/3}"], ["0.5"])
        assert time.monotonic() - start < 10.0
        assert result.rewards == [0.0] and result.timeouts == 1 and result.errors == 0
        assert not _alive(pid)
        assert s.worker_pids() != [pid]
        assert s.score(["\\boxed{0.25}"], ["1/4"]).rewards == [1.0]


def test_worker_killed_mid_item_is_replaced() -> None:
    with RewardScorer(workers=1, timeout_s=30.0) as s:
        (pid,) = _ready(s)
        os.kill(pid, signal.SIGSTOP)  # the item below is sent but never answered ...
        killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))  # ... then the worker dies
        killer.start()
        start = time.monotonic()
        result = s.score(["\\boxed{1/3}", "\\boxed{0.5}"], ["0.5", "1/2"])
        killer.join()
        assert time.monotonic() - start < 15.0
        assert result.rewards == [0.0, 1.0]
        assert result.errors == 1 and result.timeouts == 0
        assert s.metrics() == {"reward/timeouts": 0, "reward/errors": 1}
        assert s.worker_pids() != [pid]


def test_worker_killed_between_calls_is_replaced_silently() -> None:
    with RewardScorer(workers=2) as s:
        pids = _ready(s)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        result = s.score(["\\boxed{0.5}", "\\boxed{1/3}", "\\boxed{3}"], ["1/2", "0.5", "x=3"])
        assert result.rewards == [1.0, 0.0, 1.0]
        assert result.errors == 0 and result.timeouts == 0
        assert not set(s.worker_pids()) & set(pids)


def test_close_stops_workers() -> None:
    s = RewardScorer(workers=1)
    pids = _ready(s)
    s.close()
    s.close()  # idempotent
    assert not any(_alive(p) for p in pids)
    with pytest.raises(RuntimeError, match="closed"):
        s.score(["\\boxed{1/3}"], ["0.5"])
    # nothing to verify in a worker: still answers
    assert s.score(["\\boxed{A}"], ["A"], kinds=["choice"]).rewards == [1.0]


def test_workers_that_cannot_start_raise() -> None:
    # a 1 MiB address-space limit makes every worker die while importing math-verify
    with RewardScorer(workers=1, memory_limit_mb=1) as s:
        with pytest.raises(RuntimeError, match="failed to start"):
            s.score(["\\boxed{1/3}"], ["0.5"])


INTEGER_PAIRS = [
    ("7", "007"),
    ("-0", "0"),
    ("12", "13"),
    ("+4", "4"),
    ("-3", "3"),
    ("148", "148.0"),
    ("12345678901234567890", "12345678901234567891"),
    ("1000", "1,000"),
    ("5", "x=5"),
]


def test_integer_fast_path_agrees_with_math_verify(
    scorer: RewardScorer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two plain integers are settled in-process; the result is the worker's (math-verify's)."""
    preds = [f"\\boxed{{{p}}}" for p, _ in INTEGER_PAIRS]
    golds = [g for _, g in INTEGER_PAIRS]
    fast = scorer.score(preds, golds).rewards
    sent = []
    run = scorer._pool.run
    monkeypatch.setattr(scorer._pool, "run", lambda items, budget: sent.extend(items) or run(items, budget))
    monkeypatch.setattr("exgrpo_cli.reward.scorer._INTEGER", __import__("re").compile(r"(?!)"))  # off
    slow = scorer.score(preds, golds).rewards
    assert fast == slow == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    assert len(sent) == len(INTEGER_PAIRS)  # with the fast path off, every pair went to a worker
