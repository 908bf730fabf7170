"""Hostile model outputs: scoring never crashes, hangs or runs model text; rewards stay 0/1.

Inputs are generated deterministically (fixed seed). Besides the hand-written shapes below
(megabyte strings, 10k nested braces, unbalanced boxes, huge exponents, invalid LaTeX, Python
code, null bytes, odd unicode), a few hundred random token soups are scored through both
`RewardScorer` and the module-level `score`.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from exgrpo_cli.reward import RewardScorer, score

# fmt: off
TOKENS = [
    "\\boxed{", "\\fbox{", "}", "{", "\\frac", "^", "_", "10", "9", "0", "-1", ".", "\\sqrt", "</think>",
    "<think>", "$", "$$", "\\", "\x00", "é", "🙂", "\u202e", "\u0301", "\ud800", "answer is", "Answer:", " ",
    "\n", "(", ")", "[", "]", "\\left", "\\right", ",", "=", "!", "\\infty", "\\{", "\\}", "x", "\\pi",
    "\\int", "\\sum", "\\begin{pmatrix}", "\\end{pmatrix}", "&", "\\\\", "%", "\\%", "9^{9^{9}}", "e^{",
    "\\log", "/", "*", "**", "__import__('os')", "\\text{", "\\mathrm{", "C", "(C)", "\\dfrac", "\\cdot",
    "\\times", "1,000", "0.5",
]
# fmt: on
GOLDS = ["1", "\\frac{1}{2}", "x^2+1", "(1,2]", "\\{1,2\\}", "3\\pi", "-4", "\\sqrt{2}", "10\\%", "C"]


def _hand_written(pwned: Path) -> list[str]:
    code = [
        f"__import__('os').system('touch {pwned}')",
        f"eval(\"__import__('os').system('touch {pwned}')\")",
        f"exec(\"open('{pwned}', 'w').write('x')\")",
        f"(lambda: __import__('subprocess').run(['touch', '{pwned}']))()",
        f"1+__import__('os').system('touch {pwned}')",
        f"{{}}.__class__.__base__.__subclasses__()  # touch {pwned}",
    ]
    out = []
    for c in code:
        out += [f"\\boxed{{{c}}}", f"The answer is {c}", f"<think></think>{c}", f"\\boxed{{2}} {c}"]
    big = 1_000_000
    out += [
        "",
        " ",
        "\x00",
        "\x00" * 1000,
        "\\boxed{\x00}",
        "\\boxed{1\x001}",
        "\ud800\\boxed{\ud800}",
        "\\boxed{🙂}",
        "\\boxed{١٢٣}",
        "\\boxed{\u202e1\u202c}",
        "\\boxed{ⅷ}",
        "\\boxed{𝟙}",
        "a" * big + "\\boxed{1}",
        "\\boxed{" + "1" * (5 * big) + "}",
        "1" * (2 * big),
        "\\boxed{" * (big // 7),
        "{" * (3 * big),
        "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
        "\\boxed{" + "{" * 10_000 + "1",
        "\\boxed{" + "\\frac{" * 10_000 + "}" * 20_000,
        "\\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}",
        "\\boxed{" + "(" * 400 + "1" + ")" * 400 + "}",
        "\\boxed{" + "-" * 900 + "1}",
        "\\boxed{" + "1+" * 450 + "1}",
        "\\boxed{" + "x^" * 300 + "2}",
        "\\boxed{",
        "\\boxed",
        "\\boxed{{}",
        "\\boxed}{",
        "}\\boxed{1}}}}",
        "\\fbox{",
        "\\boxed{10^{10^{10^{10}}}}",
        "\\boxed{9^{9^{9^{9^9}}}}",
        "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
        "\\boxed{10^{10^{100}}}",
        "\\boxed{(10^{100})!}",
        "\\boxed{10!!!!!!}",
        "\\boxed{9^9^9^9^9}",
        "\\boxed{\\sum_{n=1}^{10^{12}} n}",
        "\\boxed{\\int_0^\\infty e^{-x^{1000}} dx}",
        "\\boxed{\\prod_{k=1}^{10^{9}} k}",
        "\\boxed{1e999999999}",
        "\\boxed{10^{-10^{10}}}",
        "The answer is 9**9**9**9",
        "answer: (9**9)**(9**9)",
        "\\boxed{\\frac{}{}}",
        "\\boxed{\\left(}",
        "\\boxed{^^^}",
        "\\boxed{\\begin{pmatrix}1&2\\\\}",
        "\\boxed{\\sqrt[}",
        "\\boxed{\\frac{1}{0}}",
        "\\boxed{0/0}",
        "\\boxed{\\infty-\\infty}",
        "\\boxed{\\undefinedmacro{3}}",
        "\\boxed{$}",
        "\\boxed{\\}",
        "\\boxed{\\text{\\text{\\text{C}}}}",
        "\\boxed{%}",
        "\\boxed{\\\\\\\\}",
        "</think>" * 1000,
        "<think>" * 1000 + "\\boxed{1}",
        "answer is " * 100_000,
        "\\boxed{" + "é" * 999 + "}",
        "\\boxed{" + "\\frac{1}{2}" * 90 + "}",
        "\\boxed{\\begin{pmatrix}" + "1&" * 300 + "1\\end{pmatrix}}",
    ]
    return out


def _soup(rng: random.Random) -> str:
    return "".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 120)))


def _check(rewards: list[float], n: int) -> None:
    assert len(rewards) == n
    assert all(r in (0.0, 1.0) for r in rewards)


def test_fuzz_bounded_and_safe(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned_reward_fuzz"
    rng = random.Random(20261201)
    responses = _hand_written(pwned) + [_soup(rng) for _ in range(220)]
    golds = [rng.choice(GOLDS) for _ in responses]
    kinds = ["choice" if g == "C" else "math" for g in golds]
    start = time.monotonic()
    timeouts = errors = 0
    with RewardScorer(workers=2, timeout_s=1.0) as scorer:
        for lo in range(0, len(responses), 64):
            result = scorer.score(responses[lo : lo + 64], golds[lo : lo + 64], kinds[lo : lo + 64])
            _check(result.rewards, len(responses[lo : lo + 64]))
            assert all(e is None or isinstance(e, str) for e in result.extracted)
            timeouts += result.timeouts
            errors += result.errors
        assert scorer.metrics() == {"reward/timeouts": timeouts, "reward/errors": errors}
        # still healthy afterwards
        assert scorer.score(["\\boxed{0.5}", "\\boxed{3}"], ["1/2", "4"]).rewards == [1.0, 0.0]
    # the module-level scorer on a slice of the same inputs (and the thinking variant of one)
    _check(score(responses[:40] + ["<think>" + responses[-1]], golds[:41], timeout_s=1.0), 41)
    elapsed = time.monotonic() - start
    assert not pwned.exists(), "model text was executed"
    assert elapsed < 120.0, f"fuzz took {elapsed:.1f}s"
    assert errors == 0  # hostile text may time out, but must not crash a worker
