"""A full disk under the run's log files (issue 46, item 3): metrics.jsonl and train.log writes the
kernel refuses (/dev/full answers every write with ENOSPC) are one line each, not a traceback."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from exgrpo_cli.config.schema import LoggerConfig, WandbConfig
from exgrpo_cli.errors import ExgrpoError
from exgrpo_cli.metrics.logger import MetricLogger
from exgrpo_cli.run.log_files import guard_log_files

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")


def test_a_full_disk_under_train_log_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """logging's default printed '--- Logging error ---' and a traceback for every record."""
    logger = logging.getLogger("exgrpo-test-full-disk")
    logger.propagate = False
    handler = logging.FileHandler("/dev/full")
    logger.addHandler(handler)
    try:
        guard_log_files(logger)
        for n in range(3):
            logger.warning("record %d", n)
    finally:
        logger.removeHandler(handler)
        try:
            handler.close()
        except OSError:
            pass
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "exgrpo train: warning: writing the log /dev/full failed (No space left on device); it takes "
        "no more lines (the checkpoints already written are intact)"
    ], err


def test_a_full_disk_under_metrics_jsonl_is_one_line(tmp_path: Path) -> None:
    logger = MetricLogger(
        str(tmp_path), LoggerConfig(console=False, wandb=WandbConfig(mode="disabled")), {}, 3
    )
    logger._fh.close()
    logger._fh = open("/dev/full", "w", encoding="utf-8")  # the kernel's full disk  # noqa: SIM115
    with pytest.raises(ExgrpoError) as stopped:
        logger.log(1, {"reward/accuracy": 0.5})
    message = str(stopped.value)
    assert "No space left on device" in message and "checkpoints" in message and "\n" not in message
    assert "exit_code" not in message and stopped.value.exit_code == 1
    logger.close()  # the refused rows are not flushed again with a traceback


def test_exgrpo_train_guards_the_log_files_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_training installs the guard on the root logger's file handlers (Hydra's train.log)
    before anything else: stopped here right after it, at the distributed start."""
    from exgrpo_cli.run import training
    from exgrpo_cli.run.log_files import GUARD

    from conftest import compose_train

    class Stop(Exception):
        pass

    def stop(**_: object) -> None:
        raise Stop

    monkeypatch.setattr(training.D, "init_distributed", stop)
    handler = logging.FileHandler(tmp_path / "train.log")
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with pytest.raises(Stop):
            training.run_training(compose_train([]))
        assert getattr(handler, GUARD, False)
    finally:
        root.removeHandler(handler)
        handler.close()
