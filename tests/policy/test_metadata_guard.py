"""The optimizer checkpoint's metadata is read as data: a crafted `.metadata` runs nothing, is
refused by `verify` (so resume quarantines it like a corrupt checkpoint) and by the loader itself;
a real one loads exactly as before (issue: loading a checkpoint never runs code)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.checkpoint.metadata_guard import METADATA_FILE, NotDataError, read_metadata, refusal
from exgrpo_cli.checkpoint.optimizer_files import load_optimizer, read_optimizer_tensors, save_optimizer
from exgrpo_cli.parallel.sharding import DataParallel


class _Touch:
    """What an attacker's pickle does: unpickling calls os.system."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.target}",))


def _trained(folder: Path) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    save_optimizer(model, opt, folder, DataParallel())
    return model, opt


def _fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.AdamW(model.parameters(), lr=0.5)


def test_a_real_metadata_file_parses_and_loads_as_before(tmp_path: Path) -> None:
    _, opt = _trained(tmp_path)
    meta = read_metadata(tmp_path / METADATA_FILE)
    assert set(meta.state_dict_metadata) == {
        f"state.{p}.{k}" for p in ("weight", "bias") for k in ("step", "exp_avg", "exp_avg_sq")
    }
    assert refusal(tmp_path) is None
    model2, opt2 = _fresh()
    load_optimizer(model2, opt2, tmp_path, DataParallel())
    for pid, state in opt.state_dict()["state"].items():
        for name, value in state.items():
            assert torch.equal(value, opt2.state_dict()["state"][pid][name])
    assert torch.equal(
        read_optimizer_tensors(tmp_path)["state.bias.exp_avg_sq"],
        opt.state[opt.param_groups[0]["params"][1]]["exp_avg_sq"],
    )


def test_a_crafted_metadata_file_runs_nothing_and_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "optimizer"
    _trained(folder)
    marker = tmp_path / "pwned"
    (folder / METADATA_FILE).write_bytes(pickle.dumps(_Touch(marker)))
    with pytest.raises(NotDataError, match="posix.system|os.system"):
        read_metadata(folder / METADATA_FILE)
    reason = refusal(folder)
    assert reason is not None and "holds something other than data" in reason and "system" in reason
    model2, opt2 = _fresh()
    with pytest.raises(NotDataError):  # the loader itself refuses too (not only verify)
        load_optimizer(model2, opt2, folder, DataParallel())
    with pytest.raises(NotDataError):
        read_optimizer_tensors(folder)
    assert not marker.exists()


def test_verify_refuses_it_even_with_a_matching_manifest(tmp_path: Path) -> None:
    """The checksums guard against corruption, not against someone who writes the folder: a
    manifest updated for the crafted file still does not make it data."""
    root = tmp_path / "checkpoints"
    marker = tmp_path / "pwned"

    def write(tmp: Path) -> None:
        (tmp / "optimizer").mkdir()
        _trained(tmp / "optimizer")
        (tmp / "optimizer" / METADATA_FILE).write_bytes(pickle.dumps(_Touch(marker)))

    folder = ckpt.save_checkpoint(root, 2, write, keep=2)
    assert folder is not None
    assert ckpt.verify(folder, prefix="model/") is None  # the weights' readers never touch it
    reason = ckpt.verify(folder)
    assert reason is not None and "holds something other than data" in reason
    with pytest.raises(ckpt.CheckpointError, match="something other than data"):
        ckpt.latest_verified(root)
    assert (root / "corrupt-step_2" / "QUARANTINED.txt").is_file() and not marker.exists()


def _metadata_with(tmp_path: Path, change: str) -> Path:
    """A real metadata object, changed the way a crafted file could, pickled as torch does."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    folder = tmp_path / change
    _trained(folder)
    meta = pickle.loads((folder / METADATA_FILE).read_bytes())  # our own file, just written
    if change == "bytes-entry":  # torch loads a bytes entry with torch.load(weights_only=False)
        meta.state_dict_metadata["state.weight.step"] = BytesStorageMetadata()
    elif change == "entries-not-a-mapping":
        meta.state_dict_metadata = ["state.weight.step"]
    elif change == "path-escape":
        info = next(iter(meta.storage_data.values()))
        info.relative_path = "../../elsewhere.distcp"
    (folder / METADATA_FILE).write_bytes(pickle.dumps(meta))
    return folder


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("bytes-entry", "BytesStorageMetadata"),
        ("path-escape", "not a plain file name"),
        ("entries-not-a-mapping", "not mappings"),
    ],
)
def test_metadata_built_from_allowed_types_is_still_checked(tmp_path: Path, change: str, said: str) -> None:
    folder = _metadata_with(tmp_path, change)
    with pytest.raises(NotDataError, match=said):
        read_metadata(folder / METADATA_FILE)


def test_a_garbled_file_is_refused_with_a_reason(tmp_path: Path) -> None:
    _trained(tmp_path)
    (tmp_path / METADATA_FILE).write_bytes(b"\x80\x05not a pickle at all")
    reason = refusal(tmp_path)
    assert reason is not None and "does not parse as checkpoint metadata" in reason


def test_python_313s_module_name_for_paths_is_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.13 pickles PosixPath as pathlib._local.PosixPath: a checkpoint written there is
    still data. The metadata is re-pickled here as 3.13 names the class (the name swapped in for
    the dump only), then read where no pathlib._local module exists."""
    import pathlib
    import sys
    import types

    _trained(tmp_path)
    meta = pickle.loads((tmp_path / METADATA_FILE).read_bytes())  # our own file, just written
    local = types.ModuleType("pathlib._local")
    local.PosixPath = pathlib.PosixPath  # type: ignore[attr-defined]
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "pathlib._local", local)
        m.setattr(pathlib.PosixPath, "__module__", "pathlib._local")
        data = pickle.dumps(meta)
    assert b"pathlib._local" in data and "pathlib._local" not in sys.modules
    (tmp_path / METADATA_FILE).write_bytes(data)
    back = read_metadata(tmp_path / METADATA_FILE)
    assert back.storage_meta is not None and back.storage_meta.checkpoint_id == Path(tmp_path)
