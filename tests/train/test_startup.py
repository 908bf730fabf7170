"""Start-up of a multi-rank run: refusals before any collective, and failures every rank shares.

The ranks are simulated by threads exchanging objects (tests/thread_ranks.py), so the
code runs as under torchrun without a process group.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from thread_ranks import run_ranks, thread_world

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.errors import ExgrpoError, UsageError
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.run import training as run
from exgrpo_cli.run.preempt import StopRequested


def _cfg(questions: int, updates: int) -> ExgrpoConfig:
    cfg = ExgrpoConfig()
    algo = dataclasses.replace(cfg.algo, questions_per_step=questions, updates_per_step=updates)
    return dataclasses.replace(cfg, algo=algo)


class PastTheRefusals(Exception):
    """Raised by the stand-in of the first step after the refusals: a run that was not refused
    fails fast here instead of training (the default run, in the working directory)."""


@pytest.fixture(autouse=True)
def _stop_after_the_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    def past(*args: object) -> None:
        raise PastTheRefusals

    monkeypatch.setattr(run, "share_run_dir", past)


def test_more_updates_than_a_ranks_questions_are_refused() -> None:
    """4 questions over 2 ranks: 2 each, so at most 2 mini-batches per step; a third would be
    empty on every rank and the step would make 2 updates instead of 3."""
    with pytest.raises(UsageError, match=r"algo.updates_per_step=3 .*algo.questions_per_step=4") as err:
        run._train(_cfg(4, 3), DataParallel(rank=0, world_size=2), StopRequested())
    assert err.value.exit_code == 2
    run._refuse_before_start(_cfg(4, 2), DataParallel(rank=0, world_size=2))  # one question per update
    run._refuse_before_start(_cfg(4, 3), DataParallel())  # one process: config validation's business


def test_questions_not_divisible_by_the_ranks_are_refused() -> None:
    with pytest.raises(UsageError, match="multiple of the 3 ranks"):
        run._train(_cfg(4, 1), DataParallel(rank=0, world_size=3), StopRequested())


def _start_on_two_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    thread_world(monkeypatch, 2)

    def rank(r: int) -> Any:
        try:
            return run._start_logger(ExgrpoConfig(), DataParallel(rank=r, world_size=2), tmp_path, None)
        except BaseException as err:  # noqa: BLE001 - compared below
            return err

    return run_ranks(2, rank)


@pytest.mark.parametrize("error", [OSError("disk full"), UsageError("logger.wandb.mode=online: no login")])
def test_rank0s_logger_failure_is_every_ranks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: Exception
) -> None:
    """Any exception of rank 0's logger start (not only a refusal) reaches the other ranks at
    once: a refusal stays a UsageError (exit 2), anything else fails them with an ExgrpoError."""

    def failing(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(run, "MetricLogger", failing)
    r0, r1 = _start_on_two_ranks(monkeypatch, tmp_path)
    assert r0 is error
    assert isinstance(r1, ExgrpoError) and str(error) in str(r1)
    assert isinstance(r1, UsageError) == isinstance(error, UsageError)


def test_a_started_logger_lets_every_rank_go_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(run, "MetricLogger", lambda *args, **kwargs: "rank 0's logger")
    r0, r1 = _start_on_two_ranks(monkeypatch, tmp_path)
    assert r0 == "rank 0's logger" and isinstance(r1, run._NoLogger)


def test_offload_all_on_one_cpu_process_is_refused() -> None:
    """One CPU process is plain PyTorch (no FSDP2), so trainer.offload=all would be ignored."""
    cfg = _cfg(4, 1)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, offload="all"))
    with pytest.raises(UsageError, match="trainer.offload=all") as err:
        run._train(cfg, DataParallel(), StopRequested())
    assert err.value.exit_code == 2
    run._refuse_before_start(cfg, DataParallel(device=torch.device("cuda", 0)))  # one GPU: FSDP2 applies it
    run._refuse_before_start(cfg, DataParallel(rank=0, world_size=2))  # gloo ranks: FSDP2 applies it


def test_a_training_set_smaller_than_a_step_is_refused_before_the_model_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from exgrpo_cli.policy import load
    from exgrpo_cli.run import setup

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(load, "load_model", no_model)
    cfg = _cfg(8, 1)
    synthetic = dataclasses.replace(cfg.data.synthetic, num_train=5, num_val=4)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, synthetic=synthetic))
    with pytest.raises(UsageError, match="has 5 usable questions, fewer than the 8") as err:
        setup.build_trainer(cfg, torch.device("cpu"))
    assert err.value.exit_code == 2


@pytest.fixture
def no_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    """The metric logger (metrics.jsonl, the tracker run) must not start: the refusal comes first."""

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the logger or tracker started before the refusal")

    monkeypatch.setattr(run, "MetricLogger", started)


def test_a_data_refusal_comes_before_the_logger(no_logger: None, tmp_path: Path) -> None:
    """The old start opened metrics.jsonl and the W&B run, then loaded the data (issue 46)."""
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"prompt": 5}\n')
    cfg = ExgrpoConfig()
    data = dataclasses.replace(cfg.data, source="jsonl", path=str(bad), on_bad_row="error", val_size=0)
    cfg = dataclasses.replace(cfg, data=data)
    with pytest.raises(UsageError, match="line 1"):
        run._start(cfg, DataParallel(), tmp_path / "run")


def test_another_rollout_n_at_resume_is_refused_before_the_logger(no_logger: None, tmp_path: Path) -> None:
    import json

    from exgrpo_cli.checkpoint import store as ckpt
    from exgrpo_cli.run.resume_changes import CONFIG_FILE, trained_with

    out = tmp_path / "run"
    cfg = ExgrpoConfig()
    trainer = dataclasses.replace(cfg.trainer, output_dir=str(out), resume_changes=True)
    cfg = dataclasses.replace(cfg, trainer=trainer)

    def write(tmp: Path) -> None:
        (tmp / "replay").mkdir()
        (tmp / "replay" / "index.json").write_text(json.dumps({"group_size": cfg.rollout.n + 1}))
        (tmp / "trainer_state.json").write_text(json.dumps({"step": 1}))
        (tmp / CONFIG_FILE).write_text(json.dumps(trained_with(cfg)))

    ckpt.save_checkpoint(out / "checkpoints", 1, write, keep=1)
    with pytest.raises(UsageError, match=f"rollout.n={cfg.rollout.n}, but"):
        run._start(cfg, DataParallel(), out)
