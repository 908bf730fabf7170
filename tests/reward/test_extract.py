"""Exact values for answer extraction (`exgrpo_cli.reward.extract`), including hostile shapes."""

from __future__ import annotations

import time

import pytest

from exgrpo_cli.reward import extract_answer
from exgrpo_cli.reward.extract import (
    AnswerRule,
    choice_letter,
    last_boxed,
    last_boxed_strict,
    normalise,
    prepare_math,
    strip_think,
    think_part,
    training_rule,
)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("so \\boxed{42}", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}} done", "\\frac{\\sqrt{2}}{2}"),
        ("\\boxed{ {a}{b{c}} }", "{a}{b{c}}"),
        ("first \\boxed{1}, then \\boxed{2}", "2"),
        ("\\fbox{7}", "7"),
        ("\\boxed{1} and \\fbox{8}", "8"),
        ("\\fbox{8} and \\boxed{9}", "9"),
        ("\\boxed {5}", "5"),
        ("\\boxed 5$", "5"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("\\boxed{\\left\\{ x \\right.}", "\\left\\{ x \\right."),
        ("$\\boxed{(1,2]}$.", "(1,2]"),
        ("\\boxed{3} then mentions \\boxed", "3"),
        ("\\boxedfoo{1} \\boxed{2} \\fboxsep{3}", "2"),
    ],
)
def test_boxed(response: str, expected: str) -> None:
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    "response",
    [
        "",
        "no answer here",
        "truncated \\boxed{\\frac{1}{",  # the last box is never closed
        "\\boxed{1} then truncated \\boxed{2",  # an earlier box does not stand in
        "empty \\boxed{}",
        "\\boxed{   }",
    ],
)
def test_no_answer(response: str) -> None:
    assert extract_answer(response) is None


def test_think_handling() -> None:
    r = "<think>maybe \\boxed{1}</think>so \\boxed{2}"
    assert extract_answer(r) == "2"
    assert extract_answer(r, requires_think=True) == "2"
    # without think tags required: only the text after the LAST </think> counts
    assert extract_answer("<think>a</think>\\boxed{1}<think>b</think>\\boxed{3}") == "3"
    assert extract_answer("<think>\\boxed{1}</think> nothing after") is None
    # required tag missing -> no answer, even with a box
    assert extract_answer("\\boxed{5}", requires_think=True) is None
    assert extract_answer("<think>unfinished \\boxed{5}", requires_think=True) is None
    assert extract_answer("<think>unfinished \\boxed{5}") == "5"
    assert strip_think("a</think>b</think>c") == "c"
    assert strip_think("abc", requires_think=True) is None


def test_think_template_reads_after_the_first_close_tag() -> None:
    """The official training reward (math_verify_reward.py) verifies
    `("<think>\\n" + response).split("</think>")[1]`: the text between the first `</think>` and the
    next one; `<think>` itself is always there, since the reward manager prepends it."""
    several = "<think>a</think>\\boxed{1}<think>b</think>\\boxed{3}"
    assert extract_answer(several, requires_think=True) == "1"
    assert extract_answer("a</think> \\boxed{1} </think> \\boxed{2} </think> \\boxed{3}", True) == "1"
    assert strip_think("a</think>b</think>c", requires_think=True) == "b"
    assert strip_think("a</think>b", requires_think=True) == "b"
    # nothing between the first two tags: no answer, however many boxes follow
    assert extract_answer("a</think></think>\\boxed{4}", requires_think=True) is None
    # a close tag without an open tag is enough (the official prepends "<think>\\n")
    assert extract_answer("reasoning</think>\\boxed{6}", requires_think=True) == "6"


@pytest.mark.parametrize(
    ("think", "expected"),
    [
        ("first", ["b", None, "", "b"]),
        ("last", ["c", "abc", "", "b"]),
        ("first_or_whole", ["b", "abc", "", "b"]),
        ("whole", ["a</think>b</think>c", "abc", "</think>", "a</think>b"]),
    ],
)
def test_think_rules(think: str, expected: list[str | None]) -> None:
    texts = ["a</think>b</think>c", "abc", "</think>", "a</think>b"]
    assert [think_part(t, think) for t in texts] == expected  # type: ignore[arg-type]


def test_unknown_think_rule() -> None:
    with pytest.raises(ValueError, match="think rule"):
        AnswerRule("after")  # type: ignore[arg-type]


def test_training_rule() -> None:
    assert training_rule(True) == AnswerRule("first") and training_rule(False) == AnswerRule("last")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}", "42"),
        ("\\boxed{1} then \\boxed{ \\frac{1}{2} }.", "\\frac{1}{2}"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("\\boxed{C}", "C"),
        # the last \\boxed decides, and it must open a brace at once
        ("\\boxed{1} then \\boxed 5", None),
        ("\\boxed{1} then \\boxed {5}", None),
        ("\\boxed{3} then mentions \\boxed", None),
        ("\\boxed{1} then truncated \\boxed{2", None),
        # every brace counts, escaped ones too (oat_math_grader.last_boxed_only_string)
        ("\\boxed{\\{1}", None),
        ("\\fbox{7}", None),  # \\fbox is not read
        ("\\fbox{7} \\boxed{8}", "8"),
        ("empty \\boxed{ }", None),
        ("no box: the answer is 12", None),
        ("", None),
    ],
)
def test_last_boxed_strict(text: str, expected: str | None) -> None:
    assert last_boxed_strict(text) == expected
    assert AnswerRule("whole", boxed_only=True).extract(text) == expected


def test_boxed_only_rule_has_no_fallback_and_reads_the_whole_text() -> None:
    rule = AnswerRule("whole", boxed_only=True)
    assert rule.extract("The answer is 12.") is None and extract_answer("The answer is 12.") == "12"
    assert rule.extract("<think>\\boxed{1}</think>\\boxed{2}</think>\\boxed{3}") == "3"
    # a think prompt: the first segment after </think>, or the whole text when there is none
    think = AnswerRule("first_or_whole", boxed_only=True)
    assert think.extract("<think>\\boxed{1}</think>\\boxed{2}</think>\\boxed{3}") == "2"
    assert think.extract("never closed \\boxed{5}") == "5"
    assert think.extract("a</think>nothing boxed</think>\\boxed{3}") is None
    assert rule.extract(None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("The answer is 12.", "12"),
        ("so the final answer is $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("Answer: (C)", "(C)"),
        ("The answer is: **7**", "7"),
        ("answer is 3.5 meters. Let me check 1+1", "3.5 meters"),
        ("The answer is 4\nbut 5 later", "4"),
        ("12 + 7 = 19", "19"),
        ("x = -3", "-3"),
        ("8-3", "3"),
        ("total 1,000 apples", "1,000"),
        ("ratio 3/4", "3/4"),
        ("pi is 3.14159", "3.14159"),
        ("The answer is \n", None),  # empty phrase, no number either
    ],
)
def test_fallback(response: str, expected: str | None) -> None:
    assert extract_answer(response) == expected


def test_fallback_number_longer_than_window() -> None:
    digits = "7" * 5000
    assert extract_answer("value " + digits) == digits


def test_non_string_is_none() -> None:
    assert extract_answer(None) is None  # type: ignore[arg-type]


def test_last_boxed_found_flags() -> None:
    assert last_boxed("nothing") == (False, None)
    assert last_boxed("\\boxed{") == (True, None)
    assert last_boxed("\\boxed{x}") == (True, "x")


def test_prepare_and_normalise() -> None:
    assert prepare_math("$\\boxed{3}$") == "3"
    assert prepare_math("\\boxed{\\frac12}") == "\\frac12"
    assert prepare_math("1\\,000") == "1000"
    assert prepare_math("\\(x+1\\)") == "x+1"
    assert normalise(" 1 000. ") == "1000"
    assert normalise("$x = 3$") == "x=3"


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("C", "C"),
        ("c", "C"),
        ("(C)", "C"),
        ("C)", "C"),
        ("C.", "C"),
        ("C: blue", "C"),
        ("(C) 42", "C"),
        ("\\text{C}", "C"),
        ("\\textbf{(b)}", "B"),
        ("$\\text{(D)}$", "D"),
        ("J", "J"),
        ("K", None),
        ("Cat", None),
        ("CD", None),
        ("", None),
        ("42", None),
        (None, None),
    ],
)
def test_choice_letter(text: str | None, letter: str | None) -> None:
    assert choice_letter(text) == letter


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" + "{" * 100_000 + "x" + "}" * 100_000 + "}",
        "\\boxed{" * 200_000,
        "{" * 2_000_000 + "\\boxed{1}",
        "\\boxed{" + "{}" * 500_000,
        "\\boxed{" + "\\{" * 500_000,
        "\\boxedx" * 300_000 + "\\fbox{1}",
        "\\fbox{1}" + "\\boxedx" * 300_000,
        "answer is " * 300_000,
        "1" * 3_000_000,
        "a" * 3_000_000,
        "</think>" * 300_000,
        "-" * 2_000_000 + "5",
    ],
)
def test_hostile_inputs_are_fast(text: str) -> None:
    start = time.perf_counter()
    extract_answer(text)
    extract_answer(text, requires_think=True)
    AnswerRule("first_or_whole", boxed_only=True).extract(text)
    assert time.perf_counter() - start < 10.0  # linear: well under a second each when quiet


def test_deep_nesting_exact() -> None:
    inner = "{" * 10_000 + "x" + "}" * 10_000
    assert extract_answer("\\boxed{" + inner + "}") == inner
    assert extract_answer("\\boxed{" + inner) is None
