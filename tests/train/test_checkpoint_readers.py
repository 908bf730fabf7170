"""eval and inspect-buffer check the checkpoint files they read against the manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from exgrpo_cli.checkpoint import store as ckpt
from exgrpo_cli.config.schema import ConfigError
from exgrpo_cli.evaluation.runner import resolve_model_path

from conftest import run_cli


def _checkpoint(root: Path) -> Path:
    def write(tmp: Path) -> None:
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
        (tmp / "model" / "model.safetensors").write_bytes(b"weights" * 100)
        (tmp / "replay").mkdir()
        (tmp / "replay" / "index.json").write_text("{}")
        (tmp / "trainer_state.json").write_text("{}")

    path = ckpt.save_checkpoint(root, 2, write, keep=2)
    assert path is not None
    return path


def test_eval_refuses_a_checkpoint_whose_weights_changed(tmp_path: Path) -> None:
    step = _checkpoint(tmp_path / "run" / "checkpoints")
    assert resolve_model_path(str(tmp_path / "run")) == str(step / "model")
    assert resolve_model_path(str(step)) == str(step / "model")
    (step / "replay" / "index.json").write_text('{"x": 1}')  # eval does not read the buffer
    assert resolve_model_path(str(step)) == str(step / "model")
    (step / "model" / "model.safetensors").write_bytes(b"WEIGHTS" * 100)
    with pytest.raises(ConfigError, match="model.safetensors: checksum mismatch"):
        resolve_model_path(str(tmp_path / "run"))


def test_inspect_buffer_refuses_a_checkpoint_whose_buffer_changed(tmp_path: Path) -> None:
    step = _checkpoint(tmp_path / "run" / "checkpoints")
    (step / "replay" / "index.json").write_text("[]")  # same size, other bytes
    res = run_cli(["inspect-buffer", str(step)], timeout=120)
    assert res.returncode == 1
    assert "does not verify" in res.stderr and "replay/index.json: checksum mismatch" in res.stderr
