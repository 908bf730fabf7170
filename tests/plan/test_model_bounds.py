"""A model folder's config.json is checked against its weights and the memory before transformers
builds anything (issue 30, item 6): a crafted config with 50,000 layers is refused in one line."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from exgrpo_cli.plan.model_bounds import ModelFolderRefused, check_model, check_model_folder


def test_a_config_with_50000_layers_is_refused_before_anything_loads(
    tiny_model: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_hidden_layers"] = 50_000
    (folder / "config.json").write_text(json.dumps(cfg))
    t0 = time.monotonic()
    with pytest.raises(ModelFolderRefused, match="50000 layers.*does not match its weights"):
        check_model(str(folder), "", "float32")  # what train, eval and inspect-buffer call first
    assert time.monotonic() - t0 < 10


def test_weights_larger_than_the_memory_are_refused(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from exgrpo_cli.plan import model_bounds

    monkeypatch.setattr(model_bounds, "_available_bytes", lambda: 1000)
    with pytest.raises(ModelFolderRefused, match="more than the .* GiB of memory available"):
        check_model_folder(tiny_model, 4)
    monkeypatch.undo()
    check_model_folder(tiny_model, 4)  # the real tiny model passes
