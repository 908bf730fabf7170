"""`exgrpo train` with a sabotaged vLLM weight sync (tests/rollout/test_vllm_train.py): the worker
extension consumes the trainer's tensors but never reloads them, so the engine keeps the dummy
weights it started with, as a reload that silently fails on a GPU would.

Usage: python broken_sync_train.py train rollout=vllm ...   (the arguments of `exgrpo`)
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

from exgrpo_cli.rollout import vllm_ext


def consume_only(self: Any, weights: Iterable[Any] | Mapping[str, Any]) -> int:
    return sum(1 for _ in (weights.items() if isinstance(weights, Mapping) else weights))


vllm_ext.WeightSyncExtension.exgrpo_reload_weights = consume_only  # type: ignore[method-assign]

if __name__ == "__main__":
    from exgrpo_cli.cli.main import main

    main(sys.argv[1:])
