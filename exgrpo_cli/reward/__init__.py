"""Reward stage of the train step: after rollouts, before the replay buffer update.

Turns each response into a 0/1 reward: `extract.py` pulls the final answer out of the text (pure,
linear-time), `scorer.py` settles the easy cases in-process, and `pool.py` / `verify.py` check the
rest with math-verify in persistent worker processes under a hard per-item timeout, so that no
model output can crash or hang training.

    score(responses, answers, timeout_s=5.0) -> list[float]        # module-level default scorer
    extract_answer(response, requires_think=False) -> str | None   # the training reward's rule
    AnswerRule("first_or_whole", boxed_only=True).extract(response)  # another rule (the eval's)
    with RewardScorer(requires_think=True, workers=2, timeout_s=5.0) as scorer:
        result = scorer.score(responses, answers, kinds=None, rules=None)  # ScoreResult
        scorer.metrics()                                           # cumulative reward/* counts
"""

from exgrpo_cli.reward.extract import AnswerRule, extract_answer
from exgrpo_cli.reward.scorer import RewardScorer, ScoreResult, default_scorer, score

__all__ = ["AnswerRule", "RewardScorer", "ScoreResult", "default_scorer", "extract_answer", "score"]
