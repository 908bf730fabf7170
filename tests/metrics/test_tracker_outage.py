"""The experiment tracker never stops training: W&B against local addresses only (a closed port, a
server that accepts connections and never answers, a fake W&B server that goes away mid-run).
HOME and every W&B folder are the test's own; nothing reaches the network."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exgrpo_cli.config.schema import LoggerConfig, WandbConfig
from exgrpo_cli.errors import UsageError
from exgrpo_cli.metrics import logger as logger_mod
from exgrpo_cli.metrics.logger import MetricLogger, probe_server


def _cfg(mode: str) -> LoggerConfig:
    return LoggerConfig(console=True, wandb=WandbConfig(mode=mode, project="outage"))


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Logged in (an API key of the right length) to whatever WANDB_BASE_URL the test sets; W&B's
    own console output off, so that stderr holds exgrpo's lines only."""
    import wandb

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    for var in ("WANDB_MODE", "WANDB_INIT_TIMEOUT", "WANDB_FINISH_TIMEOUT", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):  # plain lines, not a live bar
        monkeypatch.delenv(var, raising=False)
    wandb.teardown()  # wandb's settings singleton holds the environment it was made in
    try:
        yield home
    finally:
        wandb.teardown()


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers a request."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


class _FakeWandb(BaseHTTPRequestHandler):
    """Just enough of a W&B server for wandb 0.31 to start an online run."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            req = json.loads(body)
        except ValueError:  # file_stream uploads and the like
            req = {}
        op = req.get("operationName") if isinstance(req, dict) else None
        data: dict[str, Any] = {}
        if op == "Viewer":
            data = {"viewer": {"id": "u1", "entity": "me", "username": "me"}}
        elif op == "UpsertBucket":
            v = req["variables"]
            project = {"id": "p1", "name": v.get("project") or "outage", "entity": {"id": "e1", "name": "me"}}
            bucket = {"id": "b1", "name": v.get("name"), "displayName": "run", "project": project}
            data = {"upsertBucket": {"bucket": bucket, "inserted": True}}
        payload = json.dumps({"data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def fake_wandb() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeWandb)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()  # a no-op when the test already took it down
        server.server_close()


# ----------------------------------------------------------------------------- the probe


def test_probe_says_a_closed_port_refuses_at_once() -> None:
    t = time.monotonic()
    assert probe_server(f"http://127.0.0.1:{_closed_port()}", timeout=5.0) == "connection refused"
    assert time.monotonic() - t < 2.0


def test_probe_gives_up_on_a_server_that_never_answers(silent_url: str) -> None:
    t = time.monotonic()
    assert probe_server(silent_url, timeout=0.5) == "no answer within 0.5 s"
    assert time.monotonic() - t < 2.0


def test_probe_takes_any_http_answer_as_reachable(
    fake_wandb: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{fake_wandb.server_address[1]}"
    assert probe_server(url, timeout=5.0) is None  # GET / answers 404: the server is there
    # a proxy is not used for a loopback address (nor by wandb-core): this one would refuse
    for var in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert probe_server(url, timeout=5.0) is None
    assert probe_server(url.replace("127.0.0.1", "localhost"), timeout=5.0) is None


# ----------------------------------------------------------------------------- start-up


def test_auto_logs_offline_at_once_when_the_server_refuses(
    tmp_path: Path, wandb_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("WANDB_BASE_URL", url)
    out = tmp_path / "out"
    t = time.monotonic()
    log = MetricLogger(str(out), _cfg("auto"), {"seed": 1}, total_steps=2)
    started = time.monotonic() - t
    assert started < 10.0, started
    assert log.wandb_run is not None and not log.wandb_online
    assert log.wandb_fallback == f"the server {url} is unreachable (connection refused)"
    log.log(1, {"reward/accuracy": np.float32(0.5)})
    log.close()
    run_dir = Path(log.wandb_dir)
    assert run_dir.parent == out / "wandb" and run_dir.name.startswith("offline-run-")
    assert (run_dir / f"run-{log.wandb_id}.wandb").stat().st_size > 0
    assert _rows(out / "metrics.jsonl") == [{"step": 1, "reward/accuracy": 0.5}]
    assert capsys.readouterr().err.splitlines() == [
        f"W&B is offline (the server {url} is unreachable (connection refused)): sync later with "
        f"`wandb sync {run_dir}`, or set logger.wandb.mode=disabled",
        "step 1/2  acc 0.500",
    ]


def test_auto_logs_offline_when_the_server_never_answers(
    tmp_path: Path, wandb_home: Path, silent_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_BASE_URL", silent_url)
    monkeypatch.setattr(logger_mod, "PROBE_TIMEOUT_S", 1.0)
    t = time.monotonic()
    log = MetricLogger(str(tmp_path / "out"), _cfg("auto"), {}, total_steps=1)
    assert time.monotonic() - t < 8.0
    assert log.wandb_fallback == f"the server {silent_url} is unreachable (no answer within 1 s)"
    assert log.wandb_run is not None and not log.wandb_online
    log.close()


def test_online_refuses_within_seconds_and_leaves_the_metrics_alone(
    tmp_path: Path, wandb_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb

    def no_init(**kwargs: Any) -> None:
        raise AssertionError("wandb.init was called although the server is unreachable")

    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.setattr(wandb, "init", no_init)
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    t = time.monotonic()
    with pytest.raises(UsageError) as caught:
        MetricLogger(str(out), _cfg("online"), {}, total_steps=4, start_step=1)
    assert time.monotonic() - t < 3.0
    assert caught.value.exit_code == 2
    msg = str(caught.value)
    assert msg.startswith(
        f"logger.wandb.mode=online: the W&B server {url} is unreachable (connection refused)"
    )
    assert "logger.wandb.mode=auto" in msg and "disabled" in msg
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'  # not cut to step 1


# ----------------------------------------------------------------------------- mid-run


def test_a_connection_lost_mid_run_blocks_neither_log_nor_close(
    tmp_path: Path,
    wandb_home: Path,
    fake_wandb: ThreadingHTTPServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{fake_wandb.server_address[1]}")
    monkeypatch.setattr(logger_mod, "FINISH_TIMEOUT_S", 3.0)
    out = tmp_path / "out"
    log = MetricLogger(str(out), _cfg("online"), {}, total_steps=60)
    assert log.wandb_online and log.wandb_run is not None and not log.wandb_run.offline
    log.log(1, {"loss/total": 0.5})
    fake_wandb.shutdown()
    fake_wandb.server_close()  # from now on: connection refused
    t = time.monotonic()
    for step in range(2, 61):
        log.log(step, {"loss/total": 1.0 / step})
    assert time.monotonic() - t < 5.0  # W&B logs asynchronously
    t = time.monotonic()
    log.close()
    closing = time.monotonic() - t
    assert closing < 3.0 + 7.0, closing  # FINISH_TIMEOUT_S, and some slack for a busy machine
    run_dir = Path(log.wandb_dir)
    assert (run_dir / f"run-{log.wandb_id}.wandb").stat().st_size > 0  # what `wandb sync` sends
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == list(range(1, 61))
    err = capsys.readouterr().err
    assert f"W&B did not upload everything in time: `wandb sync {run_dir}` sends the rest\n" in err
    assert re.search(r"step 60/60  loss \+0\.0167\n", err)
