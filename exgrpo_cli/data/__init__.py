"""Question sources and prompt templates: the first stage of a train step (what to ask)."""
