"""The settings of the registry's replay methods that have knobs of their own (`replay.<method>.*`):
one dataclass per method, each a section of `replay` (exgrpo_cli/config/train.py). A registry
entry (replay/method_registry.py) owns its section: only that method reads it. The defaults are
the method's paper's where it gives one, and marked "(ours)" where it leaves the choice open
(docs/algorithm.md §9)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RlepConfig:
    """replay.method=rlep: RLEP (arXiv 2507.07451) replays verified successes beside G fresh rollouts."""

    replayed: int = field(
        default=2,
        metadata={"help": "M: stored successes that join a replayed question's K fresh ones (RLEP: 2)"},
    )


@dataclass
class LuffyConfig:
    """replay.method=luffy: LUFFY (arXiv 2504.14945) trains on another model's solutions, read from
    the data column data.solution_key, beside the fresh rollouts."""

    gamma: float = field(
        default=0.1,
        metadata={"help": "policy shaping f(x) = x / (x + gamma) of the solution's tokens (LUFFY: 0.1)"},
    )


@dataclass
class RepoConfig:
    """replay.method=repo: RePO (arXiv 2506.09340) adds off-policy responses retrieved from a
    per-question buffer of past ones to each replayed question's fresh group."""

    strategy: str = field(
        default="reward",
        metadata={
            "help": "which stored responses are retrieved: reward (highest stored reward first, RePO's "
            "reward-oriented highest_k) | recency (newest first, its recent_k) | random (its random_k)"
        },
    )
    replayed: int = field(
        default=8, metadata={"help": "off-policy responses retrieved per replayed question (RePO: 8)"}
    )
    min_stored: int = field(
        default=8,
        metadata={
            "help": "stored responses a question needs before it is replayed (ours: 8, enough to retrieve "
            "replayed; RePO waits for its full per-prompt cache of 16)"
        },
    )
    clip_eps: float = field(
        default=0.2, metadata={"help": "the off-policy term's ratio clip [1 - eps, 1 + eps] (RePO: 0.2)"}
    )
