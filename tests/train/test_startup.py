"""Start-up of a multi-rank run: refusals before any collective, and failures every rank shares.

The ranks are simulated by threads exchanging objects (the stand-in for `broadcast_object`), so the
code runs as under torchrun without a process group.
"""

from __future__ import annotations

import dataclasses

import pytest

from exgrpo_cli.config import ExgrpoConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.policy.distributed import DistInfo
from exgrpo_cli.train import run


def _cfg(questions: int, updates: int) -> ExgrpoConfig:
    cfg = ExgrpoConfig()
    algo = dataclasses.replace(cfg.algo, questions_per_step=questions, updates_per_step=updates)
    return dataclasses.replace(cfg, algo=algo)


def test_more_updates_than_a_ranks_questions_are_refused() -> None:
    """4 questions over 2 ranks: 2 each, so at most 2 mini-batches per step; a third would be
    empty on every rank and the step would make 2 updates instead of 3."""
    with pytest.raises(UsageError, match=r"algo.updates_per_step=3 .*algo.questions_per_step=4") as err:
        run._train(_cfg(4, 3), DistInfo(rank=0, world_size=2))
    assert err.value.exit_code == 2
    run._check_rank_shares(_cfg(4, 2), DistInfo(rank=0, world_size=2))  # one question per update
    run._check_rank_shares(_cfg(4, 3), DistInfo())  # one process: config validation's business


def test_questions_not_divisible_by_the_ranks_are_refused() -> None:
    with pytest.raises(UsageError, match="multiple of the 3 ranks"):
        run._train(_cfg(4, 1), DistInfo(rank=0, world_size=3))
