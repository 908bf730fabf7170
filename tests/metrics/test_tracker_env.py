"""The tracker's environment (issue 46, item 3): an empty WANDB_MODE (or another W&B variable we
read) is taken as unset, a value wandb does not accept is refused in one line naming it, before
anything of the run is created; both used to be pydantic tracebacks from wandb.init."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from exgrpo_cli.config.schema import LoggerConfig, WandbConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.metrics.logger import METRICS_FILE, MetricLogger

from conftest import run_cli


@pytest.fixture
def wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Not logged in, W&B's files under tmp_path, its console output off."""
    import wandb

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    for var in ("WANDB_MODE", "WANDB_INIT_TIMEOUT", "WANDB_FINISH_TIMEOUT", "NETRC", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()  # wandb's settings singleton holds the environment it was made in
    try:
        yield home
    finally:
        wandb.teardown()


def test_an_empty_wandb_mode_is_unset(
    wandb_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WANDB_MODE", "")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "")
    logger = MetricLogger(str(tmp_path), LoggerConfig(console=False, wandb=WandbConfig(mode="auto")), {}, 1)
    try:
        assert logger.wandb_run is not None and logger.wandb_dir
    finally:
        logger.close()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("WANDB_MODE", "bogus"),
        ("WANDB_INIT_TIMEOUT", "soon"),
        ("WANDB_SILENT", "maybe"),
        ("WANDB_BASE_URL", "x"),
        ("WANDB_BASE_URL", "http://[::1"),  # urlsplit's ValueError was a traceback
        ("WANDB_BASE_URL", "https://host:port"),
    ],
)
def test_a_bad_tracker_variable_is_one_line_before_any_file(
    wandb_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
    value: str,
) -> None:
    monkeypatch.setenv(name, value)
    refusal = f"^{re.escape(name)}='{re.escape(value)}' is not a value W&B accepts: "
    with pytest.raises(UsageError, match=refusal) as refused:
        MetricLogger(str(tmp_path), LoggerConfig(console=False, wandb=WandbConfig(mode="offline")), {}, 1)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / METRICS_FILE).exists() and not (tmp_path / "wandb").exists()


@pytest.mark.parametrize("url", ["https://api.wandb.ai", "http://[::1]:8080", "http://10.0.0.2:8080/"])
def test_a_wandb_base_url_with_a_host_and_port_is_accepted(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    from exgrpo_cli.metrics.tracker_env import check_tracker_env

    monkeypatch.setenv("WANDB_BASE_URL", url)
    check_tracker_env()
    assert os.environ["WANDB_BASE_URL"] == url


def test_train_refuses_a_bad_wandb_mode_at_start_up(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run_cli(
        ["train", f"hydra.run.dir={out}", "logger.wandb.mode=auto"], env_extra={"WANDB_MODE": "bogus"}
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines() == [
        "exgrpo train: WANDB_MODE='bogus' is not a value W&B accepts: "
        "one of online, offline, disabled, shared, dryrun, run (or unset it)"
    ], res.stderr[-2000:]
    assert not (out / ".exgrpo.lock").exists() and not (out / METRICS_FILE).exists()
