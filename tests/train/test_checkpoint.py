"""Atomic checkpoints: a torn write is never picked up; pruning keeps the newest."""

from collections.abc import Callable
from pathlib import Path

import torch

from exgrpo_cli.policy import checkpoint as ckpt


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


def test_optimizer_round_trip_without_pickle(tmp_path: Path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    ckpt.optimizer_to_files(opt, tmp_path)
    model2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.5)
    ckpt.optimizer_from_files(opt2, tmp_path)
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s2["param_groups"][0]["lr"] == 0.1
    for k in s1["state"]:
        for name, v in s1["state"][k].items():
            assert torch.equal(v, s2["state"][k][name])
