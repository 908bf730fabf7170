"""The schema's `replay` section: the experience replay buffer and its methods
(`replay.method`), with one dataclass per method that has knobs of its own (`replay.<method>.*`).
A registry entry (replay/method_registry.py) owns its section: only that method reads it. The
defaults are the method's paper's where it gives one, and marked "(ours)" where it leaves the
choice open (docs/algorithm.md §9). Part of the one schema, exgrpo_cli/config/schema.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


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


@dataclass
class PromptReplayConfig:
    """replay.method=prompt: Prompt Replay (arXiv 2603.21177) reuses prompts, not responses."""

    cooldown: int = field(
        default=2, metadata={"help": "steps a replayed prompt waits before it can be replayed again (ours)"}
    )
    max_reuse: int = field(
        default=2, metadata={"help": "times a prompt is replayed before it leaves the buffer (ours)"}
    )


@dataclass
class PrioritizedReplayConfig:
    """replay.method=prioritized: problem-level priority p(1-p) (arXiv 2601.02648)."""

    retest_every: int = field(
        default=10,
        metadata={"help": "every this many steps solved (retired) problems are retested (0: never; ours)"},
    )
    retest_fraction: float = field(
        default=0.1, metadata={"help": "the share of the solved problems put back into fresh sampling (ours)"}
    )


@dataclass
class ReplayConfig:
    ratio: float = field(
        default=0.5, metadata={"help": "rho: share of the step's questions drawn from the buffer (0 = GRPO)"}
    )
    start_threshold: float = field(
        default=0.35, metadata={"help": "delayed start: mean rollout accuracy that switches replay on"}
    )
    beta: float = field(default=0.1, metadata={"help": "policy shaping f(w) = w / (w + beta)"})
    shaping: bool = field(default=True, metadata={"help": "false: replayed tokens use the plain ratio w"})
    importance_correction: bool = field(
        default=True, metadata={"help": "false: behaviour policy = current policy"}
    )
    method: str = field(
        default="exgrpo",
        metadata={
            "help": "what the buffer stores, which questions and responses replay and how they enter "
            "the loss (docs/replay-methods.md): path/to/file.py:Name, or a name of replay.REPLAY_METHODS"
        },
    )
    prompt: PromptReplayConfig = field(
        default_factory=PromptReplayConfig, metadata={"help": "replay.method=prompt's settings"}
    )
    prioritized: PrioritizedReplayConfig = field(
        default_factory=PrioritizedReplayConfig, metadata={"help": "replay.method=prioritized's settings"}
    )
    rlep: RlepConfig = field(default_factory=RlepConfig, metadata={"help": "replay.method=rlep's settings"})
    repo: RepoConfig = field(default_factory=RepoConfig, metadata={"help": "replay.method=repo's settings"})
    luffy: LuffyConfig = field(
        default_factory=LuffyConfig, metadata={"help": "replay.method=luffy's settings"}
    )
    question_selection: str = field(
        default="gaussian", metadata={"help": "a name of replay.QUESTION_SELECTION"}
    )
    trajectory_selection: str = field(
        default="lowest_entropy",
        metadata={"help": "a name of replay.TRAJECTORY_SELECTION"},
    )
    # null: the most informative point of replay.bucket_by's scale (`gaussian_mu`); 0.5 under `count`
    # is the official K/2, 1.0 under `reward_std` is ours (the paper gives no mu for that rule)
    mu: Optional[float] = field(
        default=None,
        metadata={
            "help": "centre of the bucket Gaussian on the bucket scale (null: 0.5 under bucket_by=count, "
            "medium accuracy; 1.0 under reward_std, the largest spread)"
        },
    )
    sigma: float = field(
        default=0.125, metadata={"help": "width of the bucket Gaussian (accuracy scale; official code's 1/K)"}
    )
    bucket_edges: Optional[list[float]] = field(
        default=None, metadata={"help": "None: one bucket per success count 1..K-1"}
    )
    readmit_retired_fraction: float = field(
        default=0.0, metadata={"help": "share of retired questions put back into sampling"}
    )
    readmit_every: int = field(default=0, metadata={"help": "steps between re-admissions (0: never)"})
    readmit_into: str = field(
        default="sampling",
        metadata={
            "help": "where re-admitted retired questions go: sampling (back into fresh sampling from "
            "the next epoch) | batch (also into the next steps' fresh slots, first; the paper's App. E.4)"
        },
    )
    # ours (the paper's App. E.4 gives no queue): without a cap, 10% of a large retired set every 25
    # steps can fill most fresh slots until the next re-admission
    readmit_batch_share: float = field(
        default=0.25,
        metadata={
            "help": "readmit_into=batch: at most this share of a step's questions are re-admitted ones; "
            "the rest of the queue waits, and is dropped from the queue (not from sampling) at the "
            "next re-admission"
        },
    )
    max_experiences: int = field(
        default=0, metadata={"help": "optional cap on stored experiences (0: no cap)"}
    )
    max_age: int = field(
        default=0,
        metadata={"help": "drop experiences collected more than this many steps ago (0: no cap, the paper)"},
    )
    # a group with k of K correct enters the buffer when lbound < k <= rbound (the official
    # experience_lbound / experience_rbound, 0 and 7 at K = 8; k == K retires the question regardless)
    experience_lbound: int = field(
        default=0, metadata={"help": "buffer eligibility: lower bound (exclusive) of a group's success count"}
    )
    # null: K - 1, every partly solved group, whatever rollout.n is
    experience_rbound: Optional[int] = field(
        default=None, metadata={"help": "buffer eligibility: upper bound of the success count (null: K - 1)"}
    )
    bucket_by: str = field(
        default="count",
        metadata={
            "help": "a name of replay.BUCKET_BY (count: correct responses k of K; reward_std: the "
            "group's reward std, min-max normalised over the step's groups, rounded to 0..K)"
        },
    )

    def gaussian_mu(self) -> float:
        """The Gaussian's centre: `mu`, or when it is null the point of the bucket scale that holds
        the most informative questions. On accuracy (`count`) that is 0.5, the medium questions; on
        the normalised reward std (`reward_std`) it is 1.0, the largest spread, where the medium
        questions of a 0/1 reward land (0.5 there would favour the nearly solved and the nearly
        hopeless, docs/algorithm.md §9, item 17)."""
        if self.mu is not None:
            return self.mu
        return 1.0 if self.bucket_by == "reward_std" else 0.5

    def experience_bounds(self, K: int) -> tuple[int, int]:
        """(lbound, rbound) for groups of K responses."""
        return self.experience_lbound, K - 1 if self.experience_rbound is None else self.experience_rbound

    # (the official code); false: the rollout engine's (vLLM's bf16 ones on a GPU)
    store_trainer_logprobs: bool = field(
        default=True, metadata={"help": "store the trainer's pre-update log-probs of a collected response"}
    )
    entropy_batch_size: int = field(
        default=64, metadata={"help": "rows per no-grad forward when scoring candidates"}
    )
    # run/carry.py: read as data from a verified checkpoint; a resumed run keeps its own buffer
    init_from: str = field(
        default="",
        metadata={
            "help": "start a fresh run with the replay buffer of this run dir (its newest verified "
            "checkpoint) or checkpoint dir; rollout.n, bucket rule and tokenizer must match; "
            "ignored on resume (empty: an empty buffer)"
        },
    )
