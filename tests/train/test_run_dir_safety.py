"""Nothing of a run is lost, and a run dir is data (issue 30, items 3-7): resume=never and auto keep
best/ and quarantined checkpoints, a run dir is locked (stale locks recognised), temporary
checkpoint folders are per writer, verify refuses what is not a listed regular file, the config's
optimizer hyper-parameters win, other data or rollout.n is refused at start, BEST.json and the
buffer's group size are checked. Every crafted file is built here."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch
from train.test_checkpoint import _write

from exgrpo_cli.checkpoint import best_copy
from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.checkpoint.store import ResumeRefused
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.run import lock as run_lock
from exgrpo_cli.run.resume import check_resume_data, decide_resume


def _cfg(out: Path, **trainer: object) -> ExgrpoConfig:
    cfg = ExgrpoConfig()
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=str(out), **trainer))


def _with_best_and_quarantined(out: Path) -> Path:
    root = out / "checkpoints"
    first = ckpt.save_checkpoint(root, 1, _write("one"), keep=2)
    assert first is not None
    best_copy.keep_best(root, first, 1, 0.5, "val/accuracy")
    ckpt.quarantine(first, "test: rotten")
    return root


# ----------------------------------------------------------------------------- nothing lost


def test_resume_never_keeps_best_and_quarantined_checkpoints_without_overwrite(tmp_path: Path) -> None:
    """The old refusal counted step_* only: resume=never deleted best/ and corrupt-step_*."""
    root = _with_best_and_quarantined(tmp_path)
    with pytest.raises(ResumeRefused, match=r"best.*trainer\.overwrite=true|corrupt-step_1.*best"):
        decide_resume(_cfg(tmp_path, resume="never"), DataParallel())
    assert (root / "best" / "BEST.json").is_file() and (root / "corrupt-step_1").is_dir()
    assert decide_resume(_cfg(tmp_path, resume="never", overwrite=True), DataParallel())[0] is None
    assert not root.exists()  # asked for: deleted


def test_resume_auto_with_only_best_refuses_and_names_it(tmp_path: Path) -> None:
    """The old auto resume started fresh here, replacing best/ and emptying metrics.jsonl."""
    root = _with_best_and_quarantined(tmp_path)
    with pytest.raises(ResumeRefused, match=f"trainer.resume={root / 'best'}"):
        decide_resume(_cfg(tmp_path), DataParallel())
    assert (root / "best").is_dir()


# ----------------------------------------------------------------------------- the run lock


def test_a_second_run_in_the_same_dir_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = run_lock.RunLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(run_lock.RunDirLocked, match=f"pid {os.getpid()} on host {socket.gethostname()}"):
            run_lock.RunLock(tmp_path).acquire()
    finally:
        first.release()
    assert not (tmp_path / run_lock.LOCK).exists()
    second = run_lock.RunLock(tmp_path)
    assert second.acquire() is None
    second.release()


def _plant(folder: Path, **changes: object) -> None:
    rec = {**run_lock.holder_record(), **changes}
    (folder / run_lock.LOCK).write_text(json.dumps(rec))


def test_a_dead_holder_on_this_host_is_stale(tmp_path: Path) -> None:
    import subprocess
    import sys

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    _plant(tmp_path, pid=int(gone.stdout))
    lock = run_lock.RunLock(tmp_path)
    note = lock.acquire()
    assert note is not None and "is gone" in note
    lock.release()


def test_a_slurm_requeue_onto_another_node_takes_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old node's pid cannot be probed: the same SLURM job id at a lower restart count says its
    allocation ended."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _plant(
        tmp_path, host="node-that-died", boot_id="other", pid=1, slurm_job_id="4242", slurm_restart_count="0"
    )
    lock = run_lock.RunLock(tmp_path)
    note = lock.acquire()
    assert note is not None and "SLURM job 4242" in note
    lock.release()


def test_another_hosts_lock_is_live_until_its_heartbeat_is_old(tmp_path: Path) -> None:
    _plant(tmp_path, host="other-node", boot_id="other", pid=1, slurm_job_id="")
    with pytest.raises(run_lock.RunDirLocked, match="other-node"):
        run_lock.RunLock(tmp_path).acquire()
    old = time.time() - run_lock.STALE_S - 60
    os.utime(tmp_path / run_lock.LOCK, (old, old))
    lock = run_lock.RunLock(tmp_path)
    note = lock.acquire()
    assert note is not None and "heartbeat" in note
    lock.release()


# ----------------------------------------------------------------------------- per-writer folders


def test_two_writers_of_one_step_never_share_a_temporary_folder(tmp_path: Path) -> None:
    """The old fixed .tmp-step_N was shared: a checkpoint came out with two runs' files."""
    root, seen = tmp_path / "checkpoints", []

    def writer_a(tmp: Path) -> None:
        seen.append(tmp)
        ckpt.save_checkpoint(root, 3, lambda t: (seen.append(t), (t / "payload.txt").write_text("B")), keep=2)
        (tmp / "payload.txt").write_text("A")

    folder = ckpt.save_checkpoint(root, 3, writer_a, keep=2)
    assert seen[0] != seen[1]
    assert folder is not None and ckpt.verify(folder) is None and (folder / "payload.txt").read_text() == "A"


# ----------------------------------------------------------------------------- verify


@pytest.mark.parametrize("kind", ["symlink", "fifo", "unlisted", "no-file-list", "outside-path"])
def test_verify_refuses_what_is_not_a_listed_regular_file(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "checkpoints"
    folder = ckpt.save_checkpoint(root, 1, _write("one"), keep=2)
    assert folder is not None
    marker = folder / ckpt.COMPLETE
    record = json.loads(marker.read_text())
    outside = tmp_path / "outside.txt"  # the same bytes as the payload, outside the checkpoint
    outside.write_text("one")
    if kind == "symlink":  # checksums match through the link: only the file type gives it away
        (folder / "payload.txt").unlink()
        (folder / "payload.txt").symlink_to(outside)
    elif kind == "fifo":
        os.mkfifo(folder / "extra")
    elif kind == "unlisted":
        (folder / "model").mkdir()
        (folder / "model" / "evil.py").write_text("print('hi')")
    elif kind == "no-file-list":
        marker.write_text(json.dumps({k: v for k, v in record.items() if k != "files"}))
    else:
        record["files"]["../../outside.txt"] = {"bytes": 3, "sha256": ckpt.file_sha256(outside)}
        marker.write_text(json.dumps(record))
    t0 = time.monotonic()
    reason = ckpt.verify(folder)
    assert reason is not None and time.monotonic() - t0 < 5, reason


# ----------------------------------------------------------------------------- optimizer, data, files


def _saved_optimizer(folder: Path, lr: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from exgrpo_cli.checkpoint.optimizer_files import save_optimizer

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    save_optimizer(model, opt, folder, DataParallel())
    return model, opt


def test_resume_keeps_the_configs_hyper_parameters_and_no_crafted_flag(tmp_path: Path) -> None:
    """The old load kept the checkpoint's lr and took any key of param_groups.json (maximize)."""
    from exgrpo_cli.checkpoint.optimizer_files import PARAM_GROUPS, load_optimizer
    from exgrpo_cli.checkpoint.optimizer_groups import own_hyper, restore_hyper

    _saved_optimizer(tmp_path, lr=0.1)
    groups = json.loads((tmp_path / PARAM_GROUPS).read_text())
    groups[0]["maximize"] = True
    (tmp_path / PARAM_GROUPS).write_text(json.dumps(groups))
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.0)  # the config's
    own = own_hyper(opt)
    load_optimizer(model, opt, tmp_path, DataParallel())
    notes = restore_hyper(opt, own)
    g = opt.param_groups[0]
    assert (g["lr"], g["weight_decay"], g["maximize"]) == (0.5, 0.0, False)
    assert any("lr=0.5 from the config (the checkpoint had 0.1)" in n for n in notes), notes
    groups[0]["lr"] = "0.1; import os"
    (tmp_path / PARAM_GROUPS).write_text(json.dumps(groups))
    with pytest.raises(ValueError, match="not a number"):
        load_optimizer(model, opt, tmp_path, DataParallel())


def _trainer_state(folder: Path, fingerprint: str, group_size: int) -> None:
    (folder / "replay").mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"step": 3, "data_fingerprint": fingerprint}))
    (folder / "replay" / "index.json").write_text(json.dumps({"format_version": 1, "group_size": group_size}))


def test_other_data_or_rollout_n_is_refused_at_start(tmp_path: Path) -> None:
    """The old resume failed mid-run (IndexError, KeyError) or trained on other questions."""
    _trainer_state(tmp_path, "aaaa", 8)
    cfg = _cfg(tmp_path / "run")
    assert check_resume_data(cfg, tmp_path, "aaaa") is False
    with pytest.raises(ResumeRefused, match="trainer.resume_new_data=true"):
        check_resume_data(cfg, tmp_path, "bbbb")
    assert check_resume_data(_cfg(tmp_path / "run", resume_new_data=True), tmp_path, "bbbb") is True
    other_n = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, n=4))
    with pytest.raises(ResumeRefused, match="rollout.n=4.*rollout.n=8"):
        check_resume_data(other_n, tmp_path, "aaaa")


def test_a_huge_group_size_is_refused_before_anything_is_allocated(tmp_path: Path) -> None:
    from exgrpo_cli.replay.buffer import ExperienceBuffer

    _trainer_state(tmp_path, "aaaa", 10**9)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="group size"):
        ExperienceBuffer.load(str(tmp_path / "replay"))
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize(
    "content",
    [
        '{"step": 1, "score": "high"}',
        '{"step": -1, "score": 0.5}',
        '{"step": 1, "score": NaN}',
        "[1, 2]",
        '{"step": 1, "score": 0.5, "metric": "val/accuracy", "extra": 1}',
        '{"step": true, "score": 0.5}',
    ],
)
def test_a_malformed_best_json_is_refused_as_malformed(tmp_path: Path, content: str) -> None:
    """A string score crashed the end of a finished run (the summary's :.4f)."""
    root = tmp_path / "checkpoints"
    first = ckpt.save_checkpoint(root, 1, _write("one"), keep=2)
    assert first is not None
    best_copy.keep_best(root, first, 1, 0.5, "val/accuracy")
    assert best_copy.best_record(root) == {"step": 1, "score": 0.5, "metric": "val/accuracy"}
    (root / "best" / ckpt.BEST_SCORE).write_text(content)
    with pytest.raises(ckpt.CheckpointError, match="malformed"):
        best_copy.best_record(root)


def test_a_full_disk_inside_torchs_writer_is_the_documented_write_error(tmp_path: Path) -> None:
    """torch's writer wraps a rank's OSError in a CheckpointException (a BaseException): the old
    `except OSError` let it through as a traceback."""
    import errno

    from torch.distributed.checkpoint.api import CheckpointException

    root = tmp_path / "checkpoints"
    ckpt.save_checkpoint(root, 1, _write("one"), keep=2)

    def full(tmp: Path) -> None:
        disk = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        raise CheckpointException("save", {0: (disk, None)})

    with pytest.raises(ckpt.CheckpointWriteError, match="No space left on device"):
        ckpt.save_checkpoint(root, 2, full, keep=2)
    assert ckpt.latest_checkpoint(root) == root / "step_1"


def test_a_read_only_run_dir_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root writes anyway: a file where the dir should be fails for root too
        (tmp_path / "run").write_text("not a dir")
        out = tmp_path / "run" / "sub"
    else:
        tmp_path.chmod(0o500)
        out = tmp_path / "run"
    with pytest.raises(run_lock.RunDirLocked, match="cannot write to the run dir"):
        run_lock.lock_run_dir(out, DataParallel())


def test_under_torchrun_the_refusal_says_which_process_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    first = run_lock.RunLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(
            run_lock.RunDirLocked, match=f"rank 0 of torchrun job-7, launched by pid {os.getppid()}"
        ):
            run_lock.RunLock(tmp_path).acquire()
    finally:
        first.release()
