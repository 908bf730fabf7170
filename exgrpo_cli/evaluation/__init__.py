"""Evaluation: held-out validation inside `exgrpo train` and the benchmark suites of `exgrpo eval`."""
