"""Question sources and prompt templates: the first stage of a train step (what to ask)."""

from exgrpo_cli.data.types import Question

__all__ = ["Question"]
