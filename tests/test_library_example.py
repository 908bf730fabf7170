"""docs/library.md's example ("The objective as a library") runs as printed and computes the
Dr.GRPO objective, checked against a recomputation from full logits."""

from __future__ import annotations

import re

import torch

from conftest import REPO


def _example() -> str:
    text = (REPO / "docs" / "library.md").read_text()
    section = text[text.index("# The objective as a library") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/library.md: no python block under 'The objective as a library'"
    return match.group(1)


def test_library_example_runs_and_matches_full_logits():
    torch.manual_seed(0)
    ns: dict = {}
    exec(compile(_example(), "docs/library.md", "exec"), ns)  # the project's own doc, not model output
    B, T, V = ns["B"], ns["T"], ns["V"]
    hidden, head, targets = ns["hidden"].detach(), ns["head"], ns["targets"]

    logits = hidden @ head.T  # [B*T, V], what the chunked call never holds at once
    logp = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).view(B, T)
    probs = torch.softmax(logits, -1)
    ent = -(probs * torch.log_softmax(logits, -1)).sum(-1).view(B, T)
    ratio = torch.exp(logp - ns["behaviour"])
    adv = ns["adv"][:, None]
    fresh = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    replay = -adv * ratio / (ratio + 0.1)
    token_losses = torch.where(ns["replayed"][:, None], replay, fresh)
    expected = token_losses.sum() / (B * T) - 0.001 * ent.sum() / (B * T)

    assert V == 1000 and ns["loss"].dim() == 0
    torch.testing.assert_close(ns["loss"].detach(), expected, rtol=1e-5, atol=1e-7)
    assert ns["hidden"].grad is not None and ns["hidden"].grad.abs().sum() > 0
    assert abs(sum(ns["p"]) - 1) < 1e-9 and max(ns["p"]) == ns["p"][3]
