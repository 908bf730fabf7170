"""`exgrpo eval`: evaluate a model (or several, `eval.compare`) on a benchmark suite.

Thin: the runner (exgrpo_cli.evaluation.runner) does the work. Bad input (a missing benchmark
file, a model path that holds no model, an unreadable regrade file) raises a `UsageError` there,
which `dispatch` turns into one line on stderr and exit code 2. With `trainer.nproc` above one
(`auto`: one rank per visible GPU), the node's ranks share every benchmark's questions, each with
its own copy of the model and engine; rank 0 writes the results, which equal one process's. Under
`torchrun ... -m exgrpo_cli eval` every process is one of those ranks.
"""

from __future__ import annotations

from typing import Any

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import exit_on_error


def run(cfg: ExgrpoConfig) -> None:
    from exgrpo_cli.evaluation.runner import run_eval
    from exgrpo_cli.run.launch import launch, resolve_nproc, under_launcher

    if cfg.eval.fetch_only:  # a login node: the files and weights into the caches, nothing loaded
        from exgrpo_cli.commands.fetch_only import fetch_for_eval

        fetch_for_eval(cfg)
        return
    if under_launcher() and not cfg.eval.regrade:  # torchrun started this rank: join the others
        rank_main(cfg)
        return
    nproc = 1 if cfg.eval.regrade else resolve_nproc(cfg)  # a regrade loads no model
    if nproc > 1:
        from exgrpo_cli.evaluation.runner import check_one_engine_per_rank

        check_one_engine_per_rank(cfg, nproc)  # here, before any rank starts
        launch(cfg, nproc, rank_main)
    else:
        run_eval(cfg)


def rank_main(cfg: ExgrpoConfig) -> dict[str, Any] | None:
    """What every rank of a multi-rank eval runs (in a fresh process)."""
    from exgrpo_cli.evaluation.runner import run_eval
    from exgrpo_cli.parallel import fsdp as D
    from exgrpo_cli.run.launch import launched_rank

    parallel = D.init_distributed(timeout_s=cfg.trainer.dist_timeout_s, device=cfg.trainer.device)
    try:
        with exit_on_error("eval", say=launched_rank() == 0):
            return run_eval(cfg, parallel)
    finally:
        D.close_distributed()
