"""Experience replay: the buffer (observe / retire / persist) and the pure selection rules."""

from exgrpo_cli.replay.buckets import default_bucket_edges
from exgrpo_cli.replay.buffer import Experience, ExperienceBuffer
from exgrpo_cli.replay.selection import (
    QUESTION_MODES,
    TRAJECTORY_MODES,
    bucket_probabilities,
    choose_trajectory,
    gaussian_weights,
    n_replay,
    sample_bucket_counts,
    select_questions,
)

__all__ = [
    "QUESTION_MODES",
    "TRAJECTORY_MODES",
    "Experience",
    "ExperienceBuffer",
    "bucket_probabilities",
    "choose_trajectory",
    "default_bucket_edges",
    "gaussian_weights",
    "n_replay",
    "sample_bucket_counts",
    "select_questions",
]
