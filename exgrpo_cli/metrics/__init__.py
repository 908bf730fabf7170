"""Metric sinks: the console (rich), metrics.jsonl, and Weights & Biases.

Where it sits in the step: last. Each module namespaces its metrics (rollout/, reward/, replay/,
loss/, optim/, timing/, val/); this package only writes them out.
"""

from exgrpo_cli.metrics.logger import MetricLogger

__all__ = ["MetricLogger"]
