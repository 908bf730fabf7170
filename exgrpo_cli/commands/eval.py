"""`exgrpo eval`: evaluate a model (or several, `eval.compare`) on a benchmark suite.

Thin: the runner (exgrpo_cli.evaluation.runner) does the work. Bad input (a missing benchmark
file, a model path that holds no model, an unreadable regrade file) raises a `UsageError` there,
which `dispatch` turns into one line on stderr and exit code 2.
"""

from __future__ import annotations

from exgrpo_cli.config import ExgrpoConfig


def run(cfg: ExgrpoConfig) -> None:
    from exgrpo_cli.evaluation.runner import run_eval

    run_eval(cfg)
