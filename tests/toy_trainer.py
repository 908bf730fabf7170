"""A `Trainer` (step/loop.py) for the tests of its stages: a run state with no model or optimizer,
eight questions p0..p7 in its sampler (a test's own where the uids matter), an empty buffer and a
delayed start that has or has not fired; the parts a stage does not use are None."""

from __future__ import annotations

from typing import Any

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.sampler import QuestionSampler
from exgrpo_cli.data.types import Question
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.schedule import DelayedStart
from exgrpo_cli.run.setup import choices
from exgrpo_cli.step.loop import Trainer
from exgrpo_cli.step.state import RunState


def toy_state(
    buffer: ExperienceBuffer | None = None, started: bool = False, questions: list[Question] | None = None
) -> RunState:
    switch = DelayedStart(0.0)
    if started:
        switch.update(1, 1.0)
    pool = questions if questions is not None else [Question(f"p{i}", "p", "1") for i in range(8)]
    buffer = buffer if buffer is not None else ExperienceBuffer(4)
    return RunState(None, None, QuestionSampler(pool, seed=0), buffer, switch, seed=0)  # type: ignore[arg-type]


def toy_trainer(
    cfg: ExgrpoConfig, state: RunState | None = None, rank: int = 0, world: int = 1, **parts: Any
) -> Trainer:
    """`parts`: tokenizer, template, engine, scorer (None when not given)."""
    given = dict.fromkeys(("tokenizer", "template", "engine", "scorer")) | parts
    parallel = DataParallel(rank=rank, world_size=world)
    return Trainer(cfg, state or toy_state(), **given, choices=choices(cfg), parallel=parallel)
