"""The replay selection of a mixed step, through the method's hooks (replay/methods.py).

Place in the train step: first thing of a mixed step, after the method's `expire`. The method says
how many questions and which; the current policy scores their stored candidates when the method
asks for a score (one batched forward over every candidate, `score`); the method then says which
stored responses join each question's group and how many fresh ones complete it. At the rollout,
a solution a method guides a fresh question with becomes a row here (`guidance_response`). The
step itself never asks which method it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.experience import Experience
from exgrpo_cli.replay.methods import Replayed, ReplayMethod
from exgrpo_cli.replay.mixing import Response

# (the owner uid of each candidate, the candidates' response ids) -> one score per candidate
Scorer = Callable[[list[str], list[list[int]]], list[float]]


def choose_replay(
    method: ReplayMethod,
    buffer: ExperienceBuffer,
    questions: Mapping[str, Question],
    group_size: int,
    rng: np.random.Generator,
    step: int,
    score: Scorer,
) -> tuple[list[Replayed], float]:
    """The step's replayed questions with their stored responses and fresh counts, and the mean
    score of the chosen responses (mean token entropy, or mean NLL, as the method's `score` is;
    NaN when it has none or nothing was chosen)."""
    n = method.how_many(buffer)
    uids = method.questions(buffer, n, rng, step)
    if not uids:
        return [], float("nan")
    cands: dict[str, Sequence[Experience]] = {u: buffer.experiences(u) for u in uids}
    scores: dict[str, list[float]] = {u: [] for u in uids}
    if method.score is not None:
        owners = [u for u in uids for _ in cands[u]]
        flat = score(owners, [e.response_ids.tolist() for u in uids for e in cands[u]])
        for u, s in zip(owners, flat):
            scores[u].append(s)
    # every rank chooses alike without asking rank 0: the same candidates (buffers agree, checked
    # every step), the same scores (each computed by one rank, then shared with all) and the same
    # generator (seed, step)
    values = {u: method.values(buffer, u, cands[u], scores[u]) for u in uids}
    members = [method.members(cands[u], values[u], rng, group_size) for u in uids]
    chosen = [
        Replayed(questions[u], tuple(cands[u][i] for i in m.picks), m.fresh) for u, m in zip(uids, members)
    ]
    picked = [scores[u][i] for u, m in zip(uids, members) if scores[u] for i in m.picks]
    return chosen, float(np.mean(picked)) if picked else float("nan")


def replayed_ages(replayed: Sequence[Replayed], step: int) -> list[int]:
    """Steps since collection of every replayed response of the step."""
    return [step - e.step for r in replayed for e in r.experiences]


def guidance_response(tokenizer: Any, text: str, max_tokens: int) -> Response:
    """A solution from elsewhere (the method's `guidance`) as a replayed row of its question's group:
    the text's tokens, then end-of-sequence, at most `max_tokens` (model.max_response_tokens);
    behaviour log-probs 0 (pi_behaviour = 1: no model's log-probs come with it)."""
    eos = tokenizer.eos_token_id
    ids = list(tokenizer.encode(text, add_special_tokens=False)) + ([eos] if eos is not None else [])
    ids = ids[:max_tokens]
    return Response(ids=ids, behavior_logp=[0.0] * len(ids), replayed=True)
