"""A run you downloaded is data, end to end (issue 30): a run whose saved config asks for
trust_remote_code and whose checkpoint's tokenizer names a Python file runs nothing under eval or
resume, and a checkpoint that passes verify (its manifest rewritten, as whoever wrote the run
can) but fails to load is quarantined, and the resume falls back to the older one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inspection.test_trust import crafted_model

from exgrpo_cli.checkpoint import store as ckpt

from conftest import SMALL_RUN, run_cli, train_ok

SMALL = [*SMALL_RUN, "trainer.save_every=1", "trainer.keep_checkpoints=2"]


def _rehash(folder: Path) -> None:
    """What a run's author can do: list every file of the folder in its manifest again."""
    marker = folder / ckpt.COMPLETE
    record = json.loads(marker.read_text())
    record["files"] = {
        str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": ckpt.file_sha256(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ckpt.COMPLETE
    }
    marker.write_text(json.dumps(record))


@pytest.mark.slow
def test_eval_and_resume_run_no_code_and_a_checkpoint_that_does_not_load_is_quarantined(
    tiny_model: Path, tmp_path: Path
) -> None:
    out, marker = tmp_path / "run", tmp_path / "ran"
    train_ok(out, *SMALL, "trainer.steps=2")
    root = out / "checkpoints"
    step2 = root / "step_2"
    # the run's author: code named by the tokenizer, trust asked for in the saved config
    (step2 / "model").rename(tmp_path / "model-orig")
    crafted_model(step2 / "model", tmp_path / "model-orig", marker)
    saved = out / ".hydra" / "config.yaml"
    saved.write_text(saved.read_text().replace("trust_remote_code: false", "trust_remote_code: true"))
    # and a buffer index that passes verify but not the load (a format no reader knows)
    index = json.loads((step2 / "replay" / "index.json").read_text())
    index["format_version"] = 99
    (step2 / "replay" / "index.json").write_text(json.dumps(index))
    _rehash(step2)
    assert ckpt.verify(step2) is None

    ev = run_cli(
        ["eval", f"model.path={out}", "eval.limit=2", "eval.n=1", f"hydra.run.dir={tmp_path / 'ev'}"]
    )
    assert not marker.exists(), "eval ran the run's code"

    again = run_cli(["train", f"hydra.run.dir={out}", *SMALL, "trainer.steps=3"])
    assert not marker.exists(), "resume ran the run's code"
    assert again.returncode == 0, again.stderr[-3000:]
    log = (out / "train.log").read_text()
    assert "does not load" in log and f"resumed from {root / 'step_1'} (step 1)" in log
    assert "does not load" in (root / "corrupt-step_2" / "QUARANTINED.txt").read_text()
    assert ev.returncode in (0, 2), ev.stderr[-2000:]  # refused (exit 2) or evaluated: no code either way
