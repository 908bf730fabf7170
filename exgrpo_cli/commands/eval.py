"""`exgrpo eval`: evaluate a model (or several, `eval.compare`) on a benchmark suite.

Thin: the runner (exgrpo_cli.evaluation.runner) does the work; here bad input (a missing benchmark
file, a model path that holds no model, an unreadable regrade file) becomes one line on stderr and
exit code 2, like the config errors caught by `dispatch`.
"""

from __future__ import annotations

import sys

from exgrpo_cli.config import ConfigError, ExgrpoConfig


def run(cfg: ExgrpoConfig) -> None:
    from exgrpo_cli.evaluation.benchmarks import BenchmarkDataError
    from exgrpo_cli.evaluation.runner import run_eval

    try:
        run_eval(cfg)
    except (BenchmarkDataError, ConfigError) as err:
        print(f"exgrpo eval: {err}", file=sys.stderr)
        raise SystemExit(2) from None
