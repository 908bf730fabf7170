"""Two starts never both hold a run dir's lock (run/lock.py): a lock is published whole, so a start
between its create and its write is never taken for a torn lock, and two tasks of one SLURM
allocation are not taken for a requeue. Each interleaving is made here step by step."""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path

import pytest

from exgrpo_cli.run import lock as run_lock


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_fresh_empty_lock_is_a_start_mid_acquire_and_is_left_alone(tmp_path: Path) -> None:
    """Start X has created the lock (O_EXCL) and not yet written it. The old acquire took the empty
    file over at once as 'a torn write'; X then wrote its record into the unlinked file and both ran."""
    lock_path = tmp_path / run_lock.LOCK
    lock_path.write_bytes(b"")  # X, mid-acquire
    with pytest.raises(run_lock.RunDirLocked) as refused:
        run_lock.RunLock(tmp_path).acquire()
    message = str(refused.value)
    assert "being locked by another start" in message and "\n" not in message, message
    assert str(lock_path) in message
    assert lock_path.is_file() and lock_path.read_bytes() == b""  # still X's
    _age(lock_path, run_lock.TORN_GRACE_S + 5)  # X died before writing: taken over
    lock = run_lock.RunLock(tmp_path)
    note = lock.acquire()
    lock.release()
    assert note is not None and "an empty file" in note, note


def test_a_half_written_fresh_lock_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / run_lock.LOCK).write_bytes(b'{"pid": 12')
    with pytest.raises(run_lock.RunDirLocked, match="being locked by another start"):
        run_lock.RunLock(tmp_path).acquire()


def test_the_lock_appears_with_its_whole_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whenever the lock's name exists it names its holder: published by a link of a written file."""
    real_link = os.link
    at_publish: list[tuple[bool, object]] = []

    def link(src: str | Path, dst: str | Path) -> None:
        at_publish.append((Path(dst).exists(), json.loads(Path(src).read_bytes())))
        real_link(src, dst)

    monkeypatch.setattr(run_lock.os, "link", link)
    lock = run_lock.RunLock(tmp_path)
    assert lock.acquire() is None
    try:
        assert at_publish == [(False, lock.record)]
        assert json.loads((tmp_path / run_lock.LOCK).read_bytes()) == lock.record
        assert sorted(p.name for p in tmp_path.iterdir()) == [run_lock.LOCK]  # no temporary file left
        with pytest.raises(run_lock.RunDirLocked, match=f"pid {os.getpid()} on host {socket.gethostname()}"):
            run_lock.RunLock(tmp_path).acquire()
        assert at_publish[1:] == [(True, at_publish[1][1])]  # the second start's link: refused
    finally:
        lock.release()
    assert not any(tmp_path.iterdir())


def test_without_hard_links_the_lock_is_created_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_link(src: str | Path, dst: str | Path) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(run_lock.os, "link", no_link)
    lock = run_lock.RunLock(tmp_path)
    assert lock.acquire() is None
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == [run_lock.LOCK]
        with pytest.raises(run_lock.RunDirLocked, match="in use by exgrpo train"):
            run_lock.RunLock(tmp_path).acquire()
    finally:
        lock.release()


def _plant_other_task(folder: Path, restart_count: str) -> Path:
    rec = {
        **run_lock.holder_record(),
        "host": "node-2",
        "boot_id": "other",
        "pid": 1,
        "slurm_job_id": "4242",
        "slurm_restart_count": restart_count,
    }
    path = folder / run_lock.LOCK
    path.write_text(json.dumps(rec))
    return path


def test_two_tasks_of_one_slurm_allocation_do_not_both_hold_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`srun -N2 exgrpo train` without torchrun: node-2's task holds the lock with the same job id and
    restart count. The old check took any lock of the same job over as a requeue's."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    path = _plant_other_task(tmp_path, "0")
    with pytest.raises(run_lock.RunDirLocked, match="in use by exgrpo train pid 1 on host node-2"):
        run_lock.RunLock(tmp_path).acquire()
    monkeypatch.delenv("SLURM_RESTART_COUNT")  # SLURM sets it only once requeued: 0
    with pytest.raises(run_lock.RunDirLocked, match="node-2"):
        run_lock.RunLock(tmp_path).acquire()
    _age(path, run_lock.STALE_S + 60)  # its heartbeat stopped: stale like any other host's
    lock = run_lock.RunLock(tmp_path)
    note = lock.acquire()
    lock.release()
    assert note is not None and "heartbeat" in note, note


def test_a_lock_from_a_later_restart_is_not_taken_by_an_earlier_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _plant_other_task(tmp_path, "2")
    with pytest.raises(run_lock.RunDirLocked, match="node-2"):
        run_lock.RunLock(tmp_path).acquire()
    _plant_other_task(tmp_path, "0")
    lock = run_lock.RunLock(tmp_path)
    note = lock.acquire()
    lock.release()
    assert note is not None and "restart 0 of this SLURM job 4242, now at restart 1" in note, note
