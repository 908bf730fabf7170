"""The built-in arithmetic task: worked solutions (exact text, and every step's value) and the split."""

from __future__ import annotations

import re

import pytest

from exgrpo_cli.data.synthetic import compute, train_and_val, worked_solution


@pytest.mark.parametrize(
    "a,op,b,trace",
    [
        (47, "+", 38, "47+38 = 40 + 30 + 7 + 8 = 70 + 15 = 85"),
        (47, "+", 8, "47+8 = 40 + 7 + 8 = 40 + 15 = 55"),
        (40, "+", 50, "40+50 = 40 + 50 = 90"),
        (3, "+", 4, "3+4 = 7"),
        (82, "-", 37, "82-37 = 80 - 30 + 2 - 7 = 50 - 5 = 45"),
        (7, "-", 82, "7-82 = -80 + 7 - 2 = -80 + 5 = -75"),
        (45, "-", 45, "45-45 = 40 - 40 + 5 - 5 = 0"),
        (37, "*", 4, "37*4 = 30*4 + 7*4 = 120 + 28 = 148"),
        (37, "*", 45, "37*45 = 40*37 + 5*37 = 1480 + 185 = 1665"),
        (40, "*", 7, "40*7 = 280"),
    ],
)
def test_worked_solution_text(a: int, op: str, b: int, trace: str):
    result = compute(a, op, b)
    assert worked_solution(a, op, b) == f"<think>{trace}</think>\\boxed{{{result}}}"


def _value(step: str) -> int:
    """Value of one chain step: signed terms, each a number or a product of two (no eval)."""
    total = 0
    for sign, term in re.findall(r"(^-?|[+-] )(\d+(?:\*\d+)?)", step):
        x, _, y = term.partition("*")
        value = int(x) * (int(y) if y else 1)
        total += -value if sign.strip() == "-" else value
    return total


@pytest.mark.parametrize("op", ["+", "-", "*"])
def test_every_step_of_every_trace_equals_the_result(op: str):
    for a in range(100):
        for b in range(100):
            text = worked_solution(a, op, b)
            chain = text[len("<think>") : text.index("</think>")].split(" = ")
            assert chain[0] == f"{a}{op}{b}"
            assert len(set(chain)) == len(chain), text  # no step repeats the one before
            for step in chain[1:]:
                assert _value(step) == compute(a, op, b), text


def test_train_and_val_are_disjoint_and_seeded():
    train, val = train_and_val(300, 50, max_digits=2, ops=["+", "-", "*"], seed=7)
    again, _ = train_and_val(300, 50, max_digits=2, ops=["+", "-", "*"], seed=7)
    assert [q.question for q in train] == [q.question for q in again]
    assert not {q.question for q in train} & {q.question for q in val}
    assert len(train) == 300 and len(val) == 50
