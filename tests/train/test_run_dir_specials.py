"""A downloaded run is data, round three (issue 46, items 1 and 4): a special file where a run dir's
path is opened is refused in one line instead of blocking the start (a FIFO) or reading for ever
(a link to /dev/zero); a stop signal ends a start that is blocked anyway at once; the message for
an unreadable lock names what it found. Every special file is made here; nothing waits unbounded
(a FIFO's reader is released by a writer after a few seconds, a subprocess has a timeout)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exgrpo_cli.run import lock as run_lock

from conftest import REPO, cli_env, run_cli


@contextmanager
def released_after(folder: Path, seconds: float = 4.0) -> Iterator[None]:
    """Bound a test against a reader that blocks on a FIFO in `folder` (the old code): after
    `seconds`, and then twice a second, a writer and a reader open and close every FIFO under it (a
    renamed one too), so that a blocked reader sees an end of file, a blocked writer a broken pipe,
    and the test goes on, to fail."""
    done = threading.Event()

    def release() -> None:
        wait = seconds
        while not done.wait(wait):
            wait = 0.5
            for entry in [e for e in folder.rglob("*") if e.is_fifo()]:
                for mode in (os.O_WRONLY, os.O_RDONLY):  # a blocked reader, a blocked writer
                    try:
                        os.close(os.open(entry, mode | os.O_NONBLOCK))
                    except OSError:  # no reader waiting on it
                        pass

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _special(path: Path, kind: str) -> None:
    """A FIFO, or a link (to a device: /dev/null stands for /dev/zero, which the old code read until
    memory ran out; to a regular file elsewhere, which it read through)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device-link":
        path.symlink_to("/dev/null")
    else:
        outside = path.with_name("elsewhere.json")
        outside.write_text("{}")
        path.symlink_to(outside)


@pytest.mark.parametrize("kind", ["fifo", "device-link", "file-link"])
def test_a_special_file_at_the_lock_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """The old acquire read the lock with read_bytes(): a FIFO blocked it for ever (and then took it
    over as 'a torn write'), a link was read through and taken over."""
    lock_path = tmp_path / run_lock.LOCK
    _special(lock_path, kind)
    t0 = time.monotonic()
    with released_after(tmp_path), pytest.raises(run_lock.RunDirLocked) as refused:
        run_lock.RunLock(tmp_path).acquire()
    assert time.monotonic() - t0 < 3
    message = str(refused.value)
    assert "not a regular file" in message or "cannot be opened" in message, message
    assert str(lock_path) in message and "\n" not in message
    assert lock_path.is_symlink() if kind != "fifo" else lock_path.is_fifo()  # left as found


@pytest.mark.parametrize(
    ("content", "named"),
    [(b"", "an empty file"), (b"[1, 2]", "not a lock record (b'[1, 2]')"), (b"\x00garbage", "not a lock")],
)
def test_an_unreadable_lock_is_described_by_what_it_holds(tmp_path: Path, content: bytes, named: str) -> None:
    """The old note said 'took over the stale lock of pid None on host None, since None'. (Taken
    over once it has been unreadable for TORN_GRACE_S: tests/train/test_run_lock_races.py.)"""
    (tmp_path / run_lock.LOCK).write_bytes(content)
    old = time.time() - run_lock.TORN_GRACE_S - 60
    os.utime(tmp_path / run_lock.LOCK, (old, old))
    lock = run_lock.RunLock(tmp_path)
    note = lock.acquire()
    lock.release()
    assert note is not None and named in note and "None" not in note, note


def test_a_live_lock_without_a_holder_names_no_none(tmp_path: Path) -> None:
    """A fresh lock of another writer that names no pid or host: refused, without 'pid None'."""
    (tmp_path / run_lock.LOCK).write_text(json.dumps({"owner": "someone"}))
    with pytest.raises(run_lock.RunDirLocked) as refused:
        run_lock.RunLock(tmp_path).acquire()
    assert "None" not in str(refused.value) and "owner" in str(refused.value), refused.value


def test_a_start_blocked_on_a_fifo_ends_on_sigterm(tmp_path: Path) -> None:
    """The old start deferred SIGTERM to a checkpoint that never came: `timeout`, scancel or a
    preemption could not end a start blocked in open(). Bounded: the process is killed after 30 s."""
    fifo, ready = tmp_path / "fifo", tmp_path / "blocked"
    os.mkfifo(fifo)
    env = cli_env() | {"PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    cmd = [sys.executable, str(REPO / "tests" / "train" / "blocked_start.py"), str(fifo), str(ready)]
    proc = subprocess.Popen(
        [*cmd, str(tmp_path / "run")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate(timeout=5)
        time.sleep(0.3)  # inside open()
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert time.monotonic() - sent < 15
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    lines = err.strip().splitlines()
    assert lines == ["exgrpo train: stopped by SIGTERM before training started (nothing was trained)"], err


@pytest.mark.parametrize("rel", ["train.log", ".hydra/config.yaml", "metrics.jsonl"])
def test_a_fifo_in_a_run_dir_is_refused_before_hydra_writes(tmp_path: Path, rel: str) -> None:
    """Hydra opened `<run>/train.log` and `.hydra/config.yaml` before exgrpo's code ran: a FIFO
    there blocked `exgrpo train hydra.run.dir=<run>` for ever. Now one line, exit 2, at once."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    os.mkfifo(run / rel)
    t0 = time.monotonic()
    with released_after(run):
        res = run_cli(["train", f"hydra.run.dir={run}"], timeout=90)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines() == [
        f"exgrpo train: {run / rel} is a FIFO, where a run dir holds a regular file: remove it, "
        "or use another run dir"
    ], res.stderr[-2000:]
    assert time.monotonic() - t0 < 30 and (run / rel).is_fifo()


@pytest.mark.parametrize("prefix", ["+", "++"])
def test_a_prefixed_run_dir_override_is_checked_too(tmp_path: Path, prefix: str) -> None:
    """`++hydra.run.dir=<run>` names the run dir as the plain form does, but the check knew only the
    plain form: Hydra opened the FIFO at .hydra/config.yaml and the command blocked (`+`: Hydra's
    own error)."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    os.mkfifo(run / ".hydra" / "config.yaml")
    t0 = time.monotonic()
    with released_after(run):
        res = run_cli(["train", f"{prefix}hydra.run.dir={run}"], timeout=90)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines() == [
        f"exgrpo train: {run / '.hydra' / 'config.yaml'} is a FIFO, where a run dir holds a regular "
        "file: remove it, or use another run dir"
    ], res.stderr[-2000:]
    assert time.monotonic() - t0 < 30


def test_only_a_run_dir_override_names_the_run_dir() -> None:
    from exgrpo_cli.config.paths import run_dir_override

    assert run_dir_override("hydra.run.dir='a b'") == "a b"
    assert run_dir_override("++hydra.run.dir=x") == run_dir_override("+hydra.run.dir=x") == "x"
    for other in ("+++hydra.run.dir=x", "hydra.run.dir.x=y", "~hydra.run.dir", "trainer.steps=3"):
        assert run_dir_override(other) is None, other


def test_a_fifo_at_metrics_jsonl_is_refused_by_the_logger(tmp_path: Path) -> None:
    from exgrpo_cli.config.schema import LoggerConfig, WandbConfig
    from exgrpo_cli.errors import UsageError
    from exgrpo_cli.metrics.logger import METRICS_FILE, MetricLogger

    os.mkfifo(tmp_path / METRICS_FILE)
    cfg = LoggerConfig(console=False, wandb=WandbConfig(mode="disabled"))
    with released_after(tmp_path), pytest.raises(UsageError, match="is a FIFO"):
        MetricLogger(str(tmp_path), cfg, {}, 3, start_step=1)


def test_a_fifo_at_a_sweep_marker_is_refused_and_its_temporary_file_replaced(tmp_path: Path) -> None:
    from exgrpo_cli.ablation import sweep as sw
    from exgrpo_cli.errors import UsageError

    marker = tmp_path / sw.MARKER
    os.mkfifo(marker)
    with released_after(tmp_path), pytest.raises(UsageError, match="is a FIFO"):
        sw.read_json(marker)
    marker.unlink()
    os.mkfifo(marker.with_suffix(".json.tmp"))  # the writer's own temporary name: replaced
    job = sw.Job(variant=sw.Variant("base", "base", ()), seed=0, run_dir=tmp_path, overrides=())
    with released_after(tmp_path):
        sw.write_marker(job, True, 1.0, 0)
    assert marker.is_file() and (sw.read_json(marker) or {})["finished"] is True
