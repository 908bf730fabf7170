"""A train step draws from none of the global RNGs (Python, NumPy, torch's CPU generator).

Why a checkpoint may hold rank 0's global RNG states only (step/state.py): every random draw of a
step comes from generators derived from (trainer.seed, step), so a resumed rank repeats its steps
whatever the global states are. Here: three steps of the built-in default at toy sizes, replay on
from the first (candidate selection, replayed rows and the buffer included), leave them untouched.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import torch

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.run.setup import build_trainer


def test_train_steps_leave_the_global_rngs_alone(tiny_model: Path) -> None:
    cfg = ExgrpoConfig()
    cfg = dataclasses.replace(
        cfg,
        algo=dataclasses.replace(cfg.algo, questions_per_step=2),
        rollout=dataclasses.replace(cfg.rollout, n=2),
        model=dataclasses.replace(cfg.model, max_response_tokens=16),
        replay=dataclasses.replace(cfg.replay, start_threshold=0.0),
        trainer=dataclasses.replace(cfg.trainer, threads=1),
    )
    trainer, _, _ = build_trainer(cfg, torch.device("cpu"))
    try:
        py, (_, np_keys, np_pos, *_), th = random.getstate(), np.random.get_state(), torch.get_rng_state()
        replayed = 0.0
        for step in (1, 2, 3):
            replayed += trainer.train_step(step)["replay/replayed_questions"]
        assert replayed > 0, "the steps must exercise replay"
        _, keys, pos, *_ = np.random.get_state()
        assert random.getstate() == py
        assert np.array_equal(keys, np_keys) and pos == np_pos
        assert torch.equal(torch.get_rng_state(), th)
    finally:
        trainer.scorer.close()
        trainer.engine.close()
