"""A start that fails after the rollout engine is built closes it (vLLM's workers and GPU memory
would outlive it otherwise); here with a stand-in engine and the tiny model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.run import setup


class StandInEngine:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class Broken(Exception):
    pass


def _fail(*args: object, **kwargs: object) -> None:
    raise Broken


@pytest.mark.parametrize("stage", ["make_optimizer", "build_reward"])
def test_the_engine_is_closed_when_the_start_fails_after_it(
    stage: str, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = StandInEngine()
    monkeypatch.setattr(setup, "build_engine", lambda cfg, model, tok: engine)
    monkeypatch.setattr(setup, stage, _fail)
    cfg = ExgrpoConfig()
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, threads=1))
    with pytest.raises(Broken):
        setup.build_trainer(cfg, torch.device("cpu"))
    assert engine.closed == 1
