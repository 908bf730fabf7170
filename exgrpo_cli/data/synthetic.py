"""The built-in arithmetic task: questions with graded difficulty and verifiable answers.

Questions are `a <op> b` with 1..max_digits-digit operands; the worked solution is a short
decomposition by place value inside `<think>...</think>` followed by `\\boxed{answer}`, the same
answer convention as the real math data. Used for the embedded default run, for the tiny model's
supervised warm start, and for the `synthetic` eval suite. Pure and seeded: the same config always
gives the same pool, whatever the training seed.
"""

from __future__ import annotations

import dataclasses
import random

from exgrpo_cli.data.types import Question


def _operand(rng: random.Random, digits: int) -> int:
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(lo, 10**digits - 1)


def _split(n: int) -> list[int]:
    """Place-value parts of n, largest first: 307 -> [300, 7]; 0 -> [0]."""
    parts = [int(d) * 10**i for i, d in enumerate(reversed(str(n))) if d != "0"]
    return list(reversed(parts)) or [0]


def _signed_sum(terms: list[int]) -> str:
    """[-80, 7, -2] -> "-80 + 7 - 2"."""
    text = str(terms[0])
    for t in terms[1:]:
        text += f" + {t}" if t >= 0 else f" - {-t}"
    return text


def _column_steps(a: int, op: str, b: int) -> list[str]:
    """Addition and subtraction by columns: the tens, then the ones, each a one-digit fact, then the
    two partial results joined, e.g. 82-37: `80 - 30 + 2 - 7`, `50 - 5`."""
    sign = 1 if op == "+" else -1
    terms = [t for t in (a // 10 * 10, sign * (b // 10 * 10), a % 10, sign * (b % 10)) if t != 0] or [0]
    tens = a // 10 * 10 + sign * (b // 10 * 10)
    ones = a % 10 + sign * (b % 10)
    steps = [_signed_sum(terms)]
    if tens != 0 and ones != 0:
        steps.append(_signed_sum([tens, ones]))
    return steps


def worked_solution(a: int, op: str, b: int) -> str:
    """A short reasoning trace and the boxed result, one small fact per step, e.g.
    `<think>47+38 = 40 + 30 + 7 + 8 = 70 + 15 = 85</think>\\boxed{85}` or for 37*4
    `<think>37*4 = 30*4 + 7*4 = 120 + 28 = 148</think>\\boxed{148}`.

    Each step is a lookup in a small table shared by many questions (a one-digit sum, difference or
    product, then joining tens and ones), not a question-specific computation: what the model gets
    wrong, and what RL then corrects, carries over between questions that use the same facts.
    """
    result = compute(a, op, b)
    steps: list[str] = []
    if a >= 10 or b >= 10:
        if op == "*":
            parts = _split(a) if a >= b else _split(b)
            other = b if a >= b else a
            if len(parts) > 1:
                steps = [" + ".join(f"{p}*{other}" for p in parts), " + ".join(str(p * other) for p in parts)]
        else:
            steps = _column_steps(a, op, b)
    chain = [f"{a}{op}{b}"]
    for step in [*steps, str(result)]:
        if step != chain[-1]:  # e.g. 40+8: the column form "40 + 8" is kept, "48" follows it
            chain.append(step)
    return f"<think>{' = '.join(chain)}</think>\\boxed{{{result}}}"


def direct_answer(a: int, op: str, b: int) -> str:
    """The answer with an empty reasoning block, `<think></think>\\boxed{85}` for 47+38: the habit
    that part of the tiny model's warm-start data teaches it (scripts/build_tiny_model.py's
    `direct_fraction`)."""
    return f"<think></think>\\boxed{{{compute(a, op, b)}}}"


def compute(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}")


def make_question(uid: str, a: int, op: str, b: int) -> Question:
    digits = max(len(str(a)), len(str(b)))
    meta = {"source": "synthetic", "op": op, "digits": digits, "a": a, "b": b}
    question, answer = f"What is {a}{op}{b}?", str(compute(a, op, b))
    # its "data columns", as a reward=python function receives them; `target`: the worked solution
    # the generator knows, as the column of that name in LUFFY's data (replay.method=luffy)
    columns = {"question": question, "answer": answer, "target": worked_solution(a, op, b), **meta}
    return Question(uid=uid, question=question, answer=answer, meta=meta, columns=columns)


def generate(n: int, *, max_digits: int, ops: list[str], seed: int, prefix: str) -> list[Question]:
    """n distinct questions; digits and operator drawn uniformly, so difficulty is graded."""
    rng = random.Random(seed)
    seen: set[tuple[int, str, int]] = set()
    out: list[Question] = []
    capacity = len(ops) * (10**max_digits) ** 2
    if n > capacity:
        raise ValueError(f"cannot draw {n} distinct questions from {capacity} possible ones")
    while len(out) < n:
        op = rng.choice(ops)
        a = _operand(rng, rng.randint(1, max_digits))
        b = _operand(rng, rng.randint(1, max_digits))
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        out.append(make_question(f"{prefix}-{len(out):05d}", a, op, b))
    return out


def train_and_val(
    num_train: int, num_val: int, *, max_digits: int, ops: list[str], seed: int
) -> tuple[list[Question], list[Question]]:
    """Disjoint training pool and held-out set, split at random from one stream of distinct questions.

    The split is shuffled because the stream is not stationary: distinct draws use up the few
    one-digit questions early, so the stream's tail is harder than its head.
    """
    pool = generate(num_train + num_val, max_digits=max_digits, ops=ops, seed=seed, prefix="syn")
    order = random.Random(seed + 1).sample(range(len(pool)), len(pool))
    train = [pool[i] for i in order[:num_train]]
    val = [
        dataclasses.replace(q, uid=q.uid.replace("syn-", "syn-val-"))
        for q in (pool[i] for i in order[num_train:])
    ]
    return train, val
