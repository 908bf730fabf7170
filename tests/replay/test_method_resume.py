"""Resume bit for bit under the replay methods of replay/rlep.py, replay/repo.py and
replay/luffy.py: a run SIGKILLed mid-run and resumed holds the same buffer (its method_state
included: RePO's reward record) and the same weights as the uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPLAY_RUN, checkpoint_tensors, run_cli, same_tensors, sigkill_mid_run, train_ok

SETTINGS = {
    "rlep": ["replay.method=rlep"],
    "repo": ["replay.method=repo", "replay.repo.min_stored=1", "replay.repo.replayed=2"],
    "luffy": ["replay.method=luffy"],
}


@pytest.mark.long
@pytest.mark.parametrize("method", list(SETTINGS))
def test_a_method_resumes_bit_for_bit(tmp_path: Path, method: str) -> None:
    args = [*REPLAY_RUN, "trainer.steps=4", "trainer.save_every=1", *SETTINGS[method]]
    ref, out = tmp_path / "ref", tmp_path / "run"
    train_ok(ref, *args)
    sigkill_mid_run(out, args)
    res = run_cli(["train", f"hydra.run.dir={out}", *args])
    assert res.returncode == 0 and "resumed from" in res.stderr + res.stdout, res.stderr[-3000:]
    index = "checkpoints/step_4/replay/index.json"
    assert json.loads((out / index).read_text()) == json.loads((ref / index).read_text())
    if method == "repo":  # the reward record resumed with the buffer
        assert json.loads((ref / index).read_text())["method_state"]["reward"], "the run must store"
    assert same_tensors(
        checkpoint_tensors(out / "checkpoints/step_4"), checkpoint_tensors(ref / "checkpoints/step_4")
    )
