"""A partial-credit reward, written as a user would: how close the final number is to the answer.

    exgrpo train reward=python reward.function=docs/examples/closeness.py:closeness
    exgrpo train data=local data.path=docs/examples/my_task.jsonl data.question_key=prompt \
        data.answer_key=answer reward=python reward.function=docs/examples/closeness.py:strict_on_easy

1.0 for the exact answer, less the further off it is (relative to the answer's size), 0.0 when
the response has no number after its </think>. Arguments in TRL's convention: the responses as
`completions`, the gold answers as `answers`, and every data column under its own name.
"""

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def closeness(completions, answers, **columns):
    rewards = []
    for text, answer in zip(completions, answers):
        numbers = NUMBER.findall(text.split("</think>")[-1])
        if not numbers:
            rewards.append(0.0)
            continue
        gold = float(answer)
        error = abs(float(numbers[-1]) - gold)
        rewards.append(max(0.0, 1.0 - error / (abs(gold) + 1.0)))
    return rewards


def strict_on_easy(completions, answers, difficulty, **columns):
    """Partial credit on hard rows only: a row whose `difficulty` column is 1 must be exact."""
    scores = closeness(completions, answers)
    return [s if level >= 2 else float(s == 1.0) for s, level in zip(scores, difficulty)]
