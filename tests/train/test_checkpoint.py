"""Atomic checkpoints: a torn write is never picked up; pruning keeps the newest."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from exgrpo_cli.checkpoint import best_copy
from exgrpo_cli.checkpoint import store as ckpt


def _write(payload: str) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        (tmp / "payload.txt").write_text(payload)

    return write


def test_latest_pointer_prune_and_torn_write(tmp_path: Path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        ckpt.save_checkpoint(root, step, _write(str(step)), keep=2)
    assert sorted(p.name for p in ckpt.complete_checkpoints(root)) == ["step_2", "step_3"]
    assert ckpt.latest_checkpoint(root).name == "step_3"
    # a write killed midway leaves a .tmp folder and no COMPLETE marker: never resumed from
    torn = root / ".tmp-step_4"
    torn.mkdir()
    (torn / "payload.txt").write_text("half")
    (root / "step_5").mkdir()  # a folder without COMPLETE, e.g. from a foreign tool
    assert ckpt.latest_checkpoint(root).name == "step_3"
    # a stale pointer to a removed checkpoint falls back to the newest complete one
    (root / "latest").write_text("step_9")
    assert ckpt.latest_checkpoint(root).name == "step_3"


def test_optimizer_state_round_trip(tmp_path: Path):
    """The optimizer state is written with torch.distributed.checkpoint (one process here) and
    read back exactly, param groups included."""
    from exgrpo_cli.checkpoint.optimizer_files import load_optimizer, read_optimizer_tensors, save_optimizer
    from exgrpo_cli.parallel.sharding import DataParallel

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    save_optimizer(model, opt, tmp_path, DataParallel())
    model2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.5)
    load_optimizer(model2, opt2, tmp_path, DataParallel())
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s2["param_groups"][0]["lr"] == 0.1
    for k in s1["state"]:
        for name, v in s1["state"][k].items():
            assert torch.equal(v, s2["state"][k][name])
    flat = read_optimizer_tensors(tmp_path)
    assert torch.equal(flat["state.weight.exp_avg"], s1["state"][0]["exp_avg"])


def test_manifest_verification_quarantine_and_fallback(tmp_path: Path):
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        ckpt.save_checkpoint(root, step, _write(f"payload of step {step}" * 100), keep=2)
    manifest = json.loads((root / "step_4" / ckpt.COMPLETE).read_text())["files"]
    assert list(manifest) == ["payload.txt"] and len(manifest["payload.txt"]["sha256"]) == 64
    assert ckpt.verify(root / "step_4") is None
    # bit rot in the newest checkpoint: 64 bytes flipped in the middle of a file
    path = root / "step_4" / "payload.txt"
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
    path.write_bytes(bytes(data))
    assert "payload.txt: checksum mismatch" in (ckpt.verify(root / "step_4") or "")
    found, warnings = ckpt.latest_verified(root)
    assert found == root / "step_2"
    assert warnings and "step_4 failed verification" in warnings[0]
    assert not (root / "step_4").exists() and (root / "corrupt-step_4" / "QUARANTINED.txt").is_file()
    # a quarantined checkpoint is never counted or pruned: two more saves keep it, and step_2 goes
    # only once newer verified checkpoints exist
    for step in (6, 8):
        ckpt.save_checkpoint(root, step, _write(str(step)), keep=2)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["corrupt-step_4", "step_6", "step_8"]


def test_resume_follows_latest_not_an_abandoned_newer_checkpoint(tmp_path: Path) -> None:
    """A run rolled back with trainer.resume=<step_2> writes step_3 while its abandoned step_4 is
    still on disk: auto-resume takes step_3, as `latest` (and eval, inspect-buffer) say."""
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        ckpt.save_checkpoint(root, step, _write(str(step)), keep=3)
    ckpt.save_checkpoint(root, 3, _write("3 after the rollback"), keep=3)
    assert (root / ckpt.LATEST).read_text().strip() == "step_3" and (root / "step_4").is_dir()
    assert ckpt.latest_checkpoint(root) == root / "step_3"
    assert ckpt.latest_verified(root) == (root / "step_3", [])
    # step_3 rotten: the fallback goes back to step_2, never forward to the abandoned step_4
    (root / "step_3" / "payload.txt").write_text("x" * len("3 after the rollback"))
    found, warnings = ckpt.latest_verified(root)
    assert found == root / "step_2" and "step_3 failed verification" in warnings[0]


def test_none_verifies_refuses_and_deletes_nothing(tmp_path: Path):
    root = tmp_path / "checkpoints"
    ckpt.save_checkpoint(root, 1, _write("one"), keep=2)
    (root / "step_1" / "payload.txt").write_text("two")  # same size, other bytes
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint in .* verifies"):
        ckpt.latest_verified(root)
    assert (root / "corrupt-step_1" / "payload.txt").read_text() == "two"
    (root / "step_3").mkdir()
    (root / "step_3" / ckpt.COMPLETE).write_text(json.dumps({"step": 3}))  # before manifests: trusted
    assert ckpt.latest_verified(root)[0] == root / "step_3"


def test_a_missing_or_resized_file_fails(tmp_path: Path):
    root = tmp_path / "checkpoints"
    ckpt.save_checkpoint(root, 1, _write("abc"), keep=2)
    (root / "step_1" / "payload.txt").write_text("abcd")
    assert "4 bytes, the manifest says 3" in (ckpt.verify(root / "step_1") or "")
    (root / "step_1" / "payload.txt").unlink()
    assert "payload.txt: missing" in (ckpt.verify(root / "step_1") or "")
    assert ckpt.verify(root / "step_1", prefix="model/") is None  # only what a reader reads


def test_a_failed_write_leaves_the_published_checkpoints_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    root = tmp_path / "checkpoints"
    ckpt.save_checkpoint(root, 1, _write("one"), keep=2)

    def full_disk(tmp: Path) -> None:
        (tmp / "payload.txt").write_text("half")
        ckpt.disk_fault(2)

    monkeypatch.setenv(ckpt.FAULT_DISK_FULL_IN_CHECKPOINT, "2")
    with pytest.raises(ckpt.CheckpointWriteError, match="No space left on device"):
        ckpt.save_checkpoint(root, 2, full_disk, keep=1)
    assert ckpt.latest_checkpoint(root) == root / "step_1" and ckpt.verify(root / "step_1") is None
    assert (root / ".tmp-step_2").is_dir()  # the torn folder: removed at the next start
    assert ckpt.clean_torn(root) == [root / ".tmp-step_2"] and not (root / ".tmp-step_2").exists()


def test_the_best_checkpoint_survives_pruning_and_verifies(tmp_path: Path) -> None:
    """trainer.keep_best: checkpoints/best is a verified copy of the best step, outside the
    rotation (keep=1 here prunes its step_<N>), replaced when a better one comes."""
    root = tmp_path / "checkpoints"
    assert best_copy.best_record(root) is None
    first = ckpt.save_checkpoint(root, 1, _write("one"), keep=1)
    assert first is not None
    best = best_copy.keep_best(root, first, 1, 0.25, "val/accuracy")
    for step in (2, 3):
        ckpt.save_checkpoint(root, step, _write(str(step)), keep=1)
    assert [p.name for p in ckpt.complete_checkpoints(root)] == ["step_3"]  # step_1 pruned ...
    assert (best / "payload.txt").read_text() == "one"  # ... its best copy kept
    assert ckpt.verify(best) is None
    assert best_copy.best_record(root) == {"step": 1, "score": 0.25, "metric": "val/accuracy"}
    assert ckpt.latest_checkpoint(root).name == "step_3"  # never resumed from
    best_copy.keep_best(root, root / "step_3", 3, 0.5, "val/accuracy")
    assert (best / "payload.txt").read_text() == "3" and best_copy.best_record(root)["step"] == 3
    # a swap killed between its two renames leaves .old-best only: it is put back
    (root / "best").rename(root / ".old-best")
    assert best_copy.best_record(root) == {"step": 3, "score": 0.5, "metric": "val/accuracy"}
