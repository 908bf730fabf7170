"""MetricLogger: the metrics.jsonl rows, the rows a resume keeps, the plain console line, and how
the W&B mode is chosen (never the network: W&B is disabled, faked, or offline in a temp dir)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exgrpo_cli.config.schema import LoggerConfig, WandbConfig
from exgrpo_cli.metrics import logger as logger_mod
from exgrpo_cli.metrics.logger import (
    FINISH_TIMEOUT_S,
    INIT_TIMEOUT_S,
    MetricLogger,
    resume_point,
    wandb_mode,
)


def _cfg(console: bool = False, mode: str = "disabled", **wandb: Any) -> LoggerConfig:
    return LoggerConfig(console=console, wandb=WandbConfig(mode=mode, **wandb))


def _rows(path: Path) -> list[dict[str, Any]]:
    def refuse(name: str) -> None:
        raise AssertionError(f"metrics.jsonl holds {name}, which is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def _write_rows(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


@pytest.fixture
def no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich would take a terminal for granted with any of these set."""
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(var, raising=False)


# ----------------------------------------------------------------------------- metrics.jsonl


def test_each_log_call_appends_one_row_at_once(tmp_path: Path) -> None:
    log = MetricLogger(str(tmp_path / "out"), _cfg(), {}, total_steps=3)
    path = tmp_path / "out" / "metrics.jsonl"
    assert log.path == path and path.read_text() == ""
    log.log(0, {"val/accuracy": 0.25})
    assert _rows(path) == [{"step": 0, "val/accuracy": 0.25}]  # flushed before close
    log.log(1, {"reward/accuracy": 0.5, "loss/total": -0.125, "replay/active": 1, "note": "x"})
    log.close()
    assert _rows(path) == [
        {"step": 0, "val/accuracy": 0.25},
        {"step": 1, "reward/accuracy": 0.5, "loss/total": -0.125, "replay/active": 1, "note": "x"},
    ]
    assert list(_rows(path)[1]) == ["step", "reward/accuracy", "loss/total", "replay/active", "note"]


def test_non_finite_floats_become_null_and_strings(tmp_path: Path) -> None:
    log = MetricLogger(str(tmp_path), _cfg(), {}, total_steps=1)
    log.log(1, {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "zero": 0.0, "none": None})
    log.close()
    line = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in line and "Infinity" not in line
    assert _rows(tmp_path / "metrics.jsonl") == [
        {"step": 1, "nan": None, "inf": "inf", "ninf": "-inf", "zero": 0.0, "none": None}
    ]


def test_numpy_and_torch_scalars_are_written_as_numbers(tmp_path: Path) -> None:
    import numpy as np
    import torch

    log = MetricLogger(str(tmp_path), _cfg(), {}, total_steps=1)
    log.log(
        1,
        {
            "f32": np.float32(0.5),
            "f64": np.float64(0.25),
            "i64": np.int64(3),
            "flag": np.bool_(True),
            "nan32": np.float32("nan"),
            "t": torch.tensor(0.75),
            "t_int": torch.tensor(2),
            "bf16": torch.tensor(1.5, dtype=torch.bfloat16),
            "vec": torch.tensor([1.0, float("inf")]),
            "arr": np.array([[1, 2]]),
        },
    )
    log.close()
    assert _rows(tmp_path / "metrics.jsonl") == [
        {
            "step": 1,
            "f32": 0.5,
            "f64": 0.25,
            "i64": 3,
            "flag": True,
            "nan32": None,
            "t": 0.75,
            "t_int": 2,
            "bf16": 1.5,
            "vec": [1.0, "inf"],
            "arr": [[1, 2]],
        }
    ]


# ----------------------------------------------------------------------------- resume


def test_resume_drops_rows_after_the_checkpoint_and_torn_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": s, "loss/total": s / 10}) for s in range(6)]
    torn = '{"step": 6, "loss/to'  # the run was killed mid-write
    _write_rows(path, [*rows[:2], "[1, 2]", *rows[2:], "", torn])
    log = MetricLogger(str(tmp_path), _cfg(), {}, total_steps=8, start_step=3)
    assert path.read_text() == "".join(r + "\n" for r in rows[:4])  # steps 0..3, kept verbatim
    log.log(4, {"loss/total": 0.4})
    log.close()
    assert [r["step"] for r in _rows(path)] == [0, 1, 2, 3, 4]
    assert _rows(path)[-1] == {"step": 4, "loss/total": 0.4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no .tmp left behind


def test_fresh_start_empties_an_old_metrics_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _write_rows(path, [json.dumps({"step": s}) for s in range(3)])
    log = MetricLogger(str(tmp_path), _cfg(), {}, total_steps=2, start_step=0)
    assert path.read_text() == ""
    log.log(0, {"val/accuracy": 1.0})
    log.close()
    assert _rows(path) == [{"step": 0, "val/accuracy": 1.0}]


# ----------------------------------------------------------------------------- console


def test_plain_line_per_step_when_not_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_terminal: None
) -> None:
    log = MetricLogger(str(tmp_path), _cfg(console=True), {}, total_steps=3)
    assert not log.live and log._progress is None
    log.log(
        2,
        {
            "timing/step": 1.234,
            "loss/total": -0.01234,
            "reward/accuracy": 0.5,
            "val/accuracy": math.nan,  # not finite: left out of the line
            "replay/active": "yes",  # not a number: left out
            "optim/grad_norm": 3.0,  # not a console key
        },
    )
    log.print("hello")
    log.close()
    out = capsys.readouterr()
    # console keys in CONSOLE_KEYS order, not in the order they were logged
    assert out.err == "step 2/3  acc 0.500  loss -0.0123  s/step 1.23\nhello\n"
    assert out.out == ""


def test_print_keeps_a_long_line_whole_and_literal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_terminal: None
) -> None:
    """A path or command in a message stays copyable: no folding at the console's width (80 off a
    terminal), no rich markup eaten ([...])."""
    log = MetricLogger(str(tmp_path), _cfg(console=True), {}, total_steps=1)
    msg = "sync later with `wandb sync " + "/very/long/path" * 12 + "/run[bold]x[/]`"
    assert len(msg) > 2 * log.console.width
    log.print(msg)
    log.close()
    assert capsys.readouterr().err == msg + "\n"


def test_status_ends_the_plain_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_terminal: None
) -> None:
    log = MetricLogger(str(tmp_path), _cfg(console=True), {}, total_steps=40)
    log.log(3, {"reward/accuracy": np.float32(0.125)}, status="replay waits: acc 0.12 < 0.35")
    log.log(4, {}, status="[not markup]")
    log.log(5, {"reward/accuracy": 0.5})
    log.close()
    assert capsys.readouterr().err.splitlines() == [
        "step 3/40  acc 0.125  replay waits: acc 0.12 < 0.35",
        "step 4/40  [not markup]",
        "step 5/40  acc 0.500",
    ]
    assert _rows(tmp_path / "metrics.jsonl")[0] == {"step": 3, "reward/accuracy": 0.125}  # not logged


def test_console_off_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_terminal: None
) -> None:
    log = MetricLogger(str(tmp_path), _cfg(console=False), {}, total_steps=3)
    log.log(1, {"reward/accuracy": 0.5})
    log.print("hello")
    log.close()
    assert capsys.readouterr() == ("", "")
    assert _rows(tmp_path / "metrics.jsonl") == [{"step": 1, "reward/accuracy": 0.5}]


def test_a_terminal_gets_the_progress_bar_not_plain_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: treat stderr as a terminal
    log = MetricLogger(str(tmp_path), _cfg(console=True), {}, total_steps=4, start_step=1)
    try:
        assert log.live and log._progress is not None
        (task,) = log._progress.tasks
        assert (task.total, task.completed) == (4, 1)
        log.log(2, {"reward/accuracy": 0.75})
        assert task.completed == 2 and task.fields["line"] == "acc 0.750"
        log.log(3, {"reward/accuracy": 0.25}, status="replay waits: acc 0.25 < 0.35")
        assert task.completed == 3 and task.fields["line"] == "acc 0.250  replay waits: acc 0.25 < 0.35"
    finally:
        log.close()
    assert log._progress is None
    assert "step 2/4" not in capsys.readouterr().err


# ----------------------------------------------------------------------------- W&B mode


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No W&B variables and a HOME of our own (the CI exports WANDB_MODE=disabled)."""
    for var in ("WANDB_MODE", "WANDB_API_KEY", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    assert Path.home() == home
    return home


@pytest.mark.parametrize("mode", ["online", "offline", "disabled"])
def test_an_explicit_mode_is_kept_whatever_the_environment(
    mode: str, wandb_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline" if mode != "offline" else "online")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_mode(mode) == mode


def test_auto_is_offline_without_a_login(wandb_env: Path) -> None:
    assert wandb_mode("auto") == "offline"
    (wandb_env / ".netrc").write_text("machine github.com\n  login me\n  password x\n")
    assert wandb_mode("auto") == "offline"  # a netrc for another host


def test_auto_is_online_with_an_api_key(wandb_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_mode("auto") == "online"


def test_auto_is_online_with_a_wandb_netrc(wandb_env: Path) -> None:
    (wandb_env / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_mode("auto") == "online"


def test_auto_is_online_with_a_netrc_for_the_configured_server(
    wandb_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`wandb login` writes the netrc entry under the host of the server it logs in to."""
    monkeypatch.setenv("WANDB_BASE_URL", "http://wandb.example.test:8080")
    (wandb_env / ".netrc").write_text("machine wandb.example.test:8080\n  password " + "k" * 40 + "\n")
    assert wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_BASE_URL", "http://other.example.test")
    assert wandb_mode("auto") == "offline"


def test_auto_follows_wandb_mode_first(wandb_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    (wandb_env / ".netrc").write_text("machine api.wandb.ai\n  password x\n")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode("auto") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_MODE", "")  # set but empty: as if unset
    assert wandb_mode("auto") == "online"


@pytest.mark.parametrize("how", ["disabled", "auto+WANDB_MODE=disabled"])
def test_disabled_never_starts_wandb_and_writes_nothing(
    how: str, tmp_path: Path, wandb_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb

    def no_init(**kwargs: Any) -> None:
        raise AssertionError(f"wandb.init called with {kwargs}")

    monkeypatch.setattr(wandb, "init", no_init)
    if how == "disabled":
        monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # would be online under auto
        mode = "disabled"
    else:
        monkeypatch.setenv("WANDB_MODE", "disabled")
        mode = "auto"
    out = tmp_path / "out"
    log = MetricLogger(str(out), _cfg(mode=mode), {"a": 1}, total_steps=1, wandb_id="keep")
    log.log(1, {"reward/accuracy": 1.0})
    log.close()
    assert log.wandb_run is None and log.wandb_id == "keep"
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]
    assert not any(wandb_env.iterdir())


class FakeRun:
    def __init__(self, run_id: str, root: str = "/nowhere") -> None:
        self.id = run_id
        self.dir = f"{root}/wandb/run-x-{run_id}/files"
        self.logged: list[tuple[dict[str, Any], int]] = []
        self.finished = 0

    def log(self, data: dict[str, Any], step: int) -> None:
        self.logged.append((data, step))

    def finish(self) -> None:
        self.finished += 1


def test_wandb_gets_the_run_settings_and_numbers_only(
    tmp_path: Path,
    wandb_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_terminal: None,
) -> None:
    import wandb

    calls: list[dict[str, Any]] = []
    runs: list[FakeRun] = []

    def fake_init(**kwargs: Any) -> FakeRun:
        calls.append(kwargs)
        runs.append(FakeRun(kwargs["id"] or "new-id", kwargs["dir"]))
        return runs[-1]

    probed: list[str] = []
    monkeypatch.setattr(wandb, "init", fake_init)
    monkeypatch.setattr(logger_mod, "probe_server", lambda url, timeout: probed.append(url))  # reachable
    monkeypatch.setenv("WANDB_BASE_URL", "http://wandb.test:8080")
    out = str(tmp_path / "out")
    cfg = _cfg(console=True, mode="auto", project="proj", group="g", tags=["a", "b"])
    log = MetricLogger(out, cfg, {"k": 1}, total_steps=2, job_type="eval")
    settings = calls[0].pop("settings")
    assert (settings.init_timeout, settings.finish_timeout) == (INIT_TIMEOUT_S, FINISH_TIMEOUT_S)
    assert probed == []  # offline: no need of the server
    assert calls == [
        dict(
            project="proj",
            entity=None,
            name=None,
            group="g",
            tags=["a", "b"],
            config={"k": 1},
            dir=out,
            mode="offline",
            job_type="eval",
            id=None,
            resume=None,
        )
    ]
    assert log.wandb_id == "new-id"
    log.log(1, {"loss/total": 0.5, "replay/active": 1, "note": "x", "none": None})
    log.close()
    log.close()  # a second close does not finish the run twice
    (run,) = runs
    assert run.logged == [({"loss/total": 0.5, "replay/active": 1}, 1)] and run.finished == 1
    assert capsys.readouterr().err == (  # one line, as it is, however long
        f"W&B is offline (not logged in): sync later with `wandb sync {out}/wandb/run-x-new-id`, "
        "or set logger.wandb.mode=disabled\nstep 1/2  loss +0.5000  replay 1\n"
    )

    resumed = MetricLogger(out, _cfg(mode="online"), {}, total_steps=2, start_step=1, wandb_id="new-id")
    assert (calls[-1]["id"], calls[-1]["resume"], calls[-1]["mode"]) == ("new-id", "allow", "online")
    assert probed == ["http://wandb.test:8080"]
    assert resumed.wandb_id == "new-id" and resumed.wandb_online and not resumed.wandb_fallback
    resumed.close()
    assert "W&B is offline" not in capsys.readouterr().err


def test_offline_run_is_written_under_the_output_dir_and_resumed(
    tmp_path: Path, wandb_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb

    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # no wrapping of pytest's stdout/stderr
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "out"
    try:
        log = MetricLogger(str(out), _cfg(mode="offline"), {"seed": 3}, total_steps=2)
        run_id = log.wandb_id
        assert run_id and log.wandb_run is not None and log.wandb_run.offline
        log.log(1, {"loss/total": 0.5})
        log.close()
        (run_dir,) = (out / "wandb").glob(f"offline-run-*-{run_id}")
        assert (run_dir / f"run-{run_id}.wandb").stat().st_size > 0

        again = MetricLogger(str(out), _cfg(mode="offline"), {}, total_steps=2, start_step=1, wandb_id=run_id)
        assert again.wandb_id == run_id and again.wandb_run.id == run_id
        again.close()
    finally:
        wandb.teardown()
    assert _rows(out / "metrics.jsonl") == [{"step": 1, "loss/total": 0.5}]


# ----------------------------------------------------------------------------- resume point


def test_resume_point_reads_step_and_run_id_without_loading_the_checkpoint(tmp_path: Path) -> None:
    assert resume_point(None) == (0, None)
    ckpt = tmp_path / "step_7"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 7, "wandb_id": "abc123", "seed": 0}))
    assert resume_point(ckpt) == (7, "abc123")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 7, "wandb_id": None}))
    assert resume_point(str(ckpt)) == (7, None)
