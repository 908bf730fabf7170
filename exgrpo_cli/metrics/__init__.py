"""Metric sinks (logger.py: the console (rich), metrics.jsonl, and Weights & Biases) and the
per-phase peak memory (memory.py).

Where it sits in the step: memory.py around the step's stages, the logger last. Each module
namespaces its metrics (rollout/, reward/, replay/, loss/, optim/, timing/, memory/, data/, val/);
the logger only writes them out.
"""

from exgrpo_cli.metrics.logger import MetricLogger

__all__ = ["MetricLogger"]
