"""`exgrpo train`: one RL run (ExGRPO, or on-policy Dr.GRPO with replay.ratio=0)."""

from __future__ import annotations

import os

from exgrpo_cli.config import ExgrpoConfig


def run(cfg: ExgrpoConfig) -> None:
    from exgrpo_cli.train.run import run_training

    final = run_training(cfg)
    if os.environ.get("RANK", "0") != "0":  # torchrun: rank 0 reports for the run
        return
    parts = [f"{k}={v:.4f}" for k, v in sorted(final.items())]
    print("exgrpo train done: " + "  ".join(parts))
