"""Experience replay: the buffer (observe / retire / persist) and the pure selection rules."""

from exgrpo_cli.replay.buckets import default_bucket_edges
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.experience import Experience
from exgrpo_cli.replay.selection import (
    QUESTION_SELECTION,
    bucket_probabilities,
    gaussian_weights,
    n_replay,
    sample_bucket_counts,
)
from exgrpo_cli.replay.trajectory import TRAJECTORY_SELECTION, TrajectoryRule

__all__ = [
    "QUESTION_SELECTION",
    "TRAJECTORY_SELECTION",
    "Experience",
    "ExperienceBuffer",
    "TrajectoryRule",
    "bucket_probabilities",
    "default_bucket_edges",
    "gaussian_weights",
    "n_replay",
    "sample_bucket_counts",
]
