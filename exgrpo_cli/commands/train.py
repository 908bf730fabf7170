"""`exgrpo train`: one RL run (ExGRPO, or on-policy Dr.GRPO with replay.ratio=0)."""

from __future__ import annotations

from exgrpo_cli.config import ExgrpoConfig


def run(cfg: ExgrpoConfig) -> None:
    from exgrpo_cli.train.run import run_training

    final = run_training(cfg)
    parts = [f"{k}={v:.4f}" for k, v in sorted(final.items())]
    print("exgrpo train done: " + "  ".join(parts))
