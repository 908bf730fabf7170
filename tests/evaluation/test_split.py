"""Work split across ranks (issue #12 point 8): each rank samples its share of the held-out
questions and scores its share of the replay candidates; gathered, the answers equal one
process's (2 gloo ranks, the shipped tiny model held whole by each rank)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exgrpo_cli.config.schema import ModelConfig
from exgrpo_cli.policy.model import load_model, load_tokenizer

from conftest import torchrun, worker_env

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from split_common import run_both  # noqa: E402  (beside this file, as the ranks import it)


@pytest.mark.slow
def test_two_ranks_give_one_process_answers(tmp_path: Path, tiny_model: Path) -> None:
    torch.set_num_threads(1)
    cfg = ModelConfig()
    alone = run_both(load_model(cfg, torch.device("cpu")), load_tokenizer(cfg), None)
    out = tmp_path / "split.json"
    cmd = torchrun(str(HERE / "split_worker.py"), str(out))
    proc = subprocess.run(cmd, env=worker_env(HERE), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shared = json.loads(out.read_text())
    assert shared["responses"] == alone["responses"]  # the same samples, drawn with the same seeds
    assert shared["correct"] == alone["correct"] and shared["accuracy"] == alone["accuracy"]
    assert len(shared["scores"]) == 13
    torch.testing.assert_close(
        torch.tensor(shared["scores"]), torch.tensor(alone["scores"]), atol=1e-5, rtol=0
    )
