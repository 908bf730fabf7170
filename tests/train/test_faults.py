"""Faults a long run meets, through the real CLI: a corrupted checkpoint is never trusted, and a
full disk while a checkpoint is written loses nothing (issue #13 points 1 and 2)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from policy.test_metadata_guard import _Touch

from exgrpo_cli.checkpoint import store as ckpt

from conftest import SMALL_RUN, SharedRun, metrics, run_cli, shared_train_run, train_ok
from shared_artefacts import private_copy

pytestmark = pytest.mark.slow

SMALL = [*SMALL_RUN, "trainer.save_every=2", "trainer.keep_checkpoints=2"]


@pytest.fixture(scope="session")
def four_steps(request: pytest.FixtureRequest) -> SharedRun:
    """SMALL's 4-step run (checkpoints step_2 and step_4), trained once per test run: two tests
    below start from their own copy of it."""
    return shared_train_run(request, "faults-4-steps", [*SMALL, "trainer.steps=4"])


def test_a_corrupted_checkpoint_is_quarantined_and_the_run_resumes_from_the_last_good_one(
    four_steps: SharedRun, tmp_path: Path
) -> None:
    out = private_copy(four_steps.dir, tmp_path / "run")
    root = out / "checkpoints"
    keep = tmp_path / "step_4-copy"
    shutil.copytree(root / "step_4", keep)
    weights = root / "step_4" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
    weights.write_bytes(bytes(data))

    # an explicit resume from the corrupted copy is refused (exit 2), nothing renamed
    (keep / "model" / "model.safetensors").write_bytes(bytes(data))
    refused = run_cli(["train", f"hydra.run.dir={tmp_path / 'other'}", *SMALL, f"trainer.resume={keep}"])
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "does not verify" in refused.stderr and "model.safetensors: checksum mismatch" in refused.stderr
    assert keep.is_dir()

    train_ok(out, *SMALL, "trainer.steps=6")
    log = (out / "train.log").read_text()
    assert "step_4 failed verification" in log and f"resumed from {root / 'step_2'} (step 2)" in log
    assert (root / "corrupt-step_4" / "QUARANTINED.txt").is_file()
    assert sorted(p.name for p in root.glob("step_*")) == ["step_4", "step_6"]  # both new and verified
    assert ckpt.verify(root / "step_6") is None and ckpt.verify(root / "step_4") is None
    assert [r["step"] for r in metrics(out)] == [0, 1, 2, 3, 4, 5, 6]  # steps 3-4 retrained once, logged once


def test_a_full_disk_while_checkpointing_stops_cleanly_and_the_rerun_resumes(
    tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    env = {ckpt.FAULT_DISK_FULL_IN_CHECKPOINT: "4"}
    full = run_cli(["train", f"hydra.run.dir={out}", *SMALL, "trainer.steps=4"], env_extra=env)
    assert full.returncode == 1, full.stderr[-3000:]
    assert "writing checkpoint step_4 failed" in full.stderr and "No space left on device" in full.stderr
    assert "Traceback" not in full.stderr
    root = out / "checkpoints"
    assert ckpt.latest_checkpoint(root) == root / "step_2" and ckpt.verify(root / "step_2") is None
    assert (root / ".tmp-step_4").is_dir()

    train_ok(out, *SMALL, "trainer.steps=4")
    log = (out / "train.log").read_text()
    assert "removed .tmp-step_4" in log and f"resumed from {root / 'step_2'}" in log
    assert not (root / ".tmp-step_4").exists() and ckpt.verify(root / "step_4") is None


def _poison_optimizer_metadata(folder: Path, marker: Path) -> None:
    """Replace the checkpoint's optimizer/.metadata with a pickle that runs a command, and update
    its size and checksum in COMPLETE as someone who can write the folder would."""
    meta = folder / "optimizer" / ".metadata"
    meta.write_bytes(pickle.dumps(_Touch(marker)))
    record = json.loads((folder / ckpt.COMPLETE).read_text())
    record["files"]["optimizer/.metadata"] = {"bytes": meta.stat().st_size, "sha256": ckpt.file_sha256(meta)}
    (folder / ckpt.COMPLETE).write_text(json.dumps(record))


def test_a_checkpoint_whose_optimizer_metadata_is_code_runs_nothing(
    four_steps: SharedRun, tmp_path: Path
) -> None:
    """The issue's scenario: an explicit resume from the crafted checkpoint exits 2 with one
    message and runs nothing; an automatic resume quarantines it and falls back to the older one."""
    out = private_copy(four_steps.dir, tmp_path / "run")
    root = out / "checkpoints"
    marker = tmp_path / "pwned"
    _poison_optimizer_metadata(root / "step_4", marker)

    refused = run_cli(
        ["train", f"hydra.run.dir={tmp_path / 'other'}", *SMALL, f"trainer.resume={root / 'step_4'}"]
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "holds something other than data" in refused.stderr and "Traceback" not in refused.stderr
    assert not marker.exists()

    train_ok(out, *SMALL, "trainer.steps=5")
    assert not marker.exists()
    log = (out / "train.log").read_text()
    assert "step_4 failed verification" in log and "something other than data" in log
    assert f"resumed from {root / 'step_2'} (step 2)" in log
    assert "something other than data" in (root / "corrupt-step_4" / "QUARANTINED.txt").read_text()
