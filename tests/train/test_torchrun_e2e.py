"""`torchrun --nproc_per_node 2 -m exgrpo_cli train` end to end: FSDP2 on CPU/gloo, replay on.

Three real launches of the CLI under torchrun (tiny model, small steps, one thread per rank):
a 2-step run, its resumption to step 3, and an uninterrupted 3-step run. ExGRPO replay is on from
the first step (replay.start_threshold=0), so the buffer, the replay selection (a collective
forward under FSDP) and the per-step cross-rank agreement check all run. A resumed run must equal
the uninterrupted one: weights, optimizer, buffer and metrics.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, TINY, checkpoint_tensors, metrics, run_cli, torchrun_ok

pytestmark = pytest.mark.slow

ARGS = [
    "algo.questions_per_step=4",
    "rollout.n=4",
    "trainer.val_questions=4",
    "trainer.val_samples=1",
    "logger.wandb.mode=disabled",
    "logger.console=false",
    "trainer.threads=1",
    "trainer.seed=3",
    "replay.ratio=0.5",
    "replay.start_threshold=0",
]


def _torchrun(cwd: Path, *overrides: str, skew_rank1_s: float = 0.0) -> None:
    train = ["-m", "exgrpo_cli", "train", *ARGS, *overrides]
    if skew_rank1_s:  # rank 1 starts later: its Hydra run dir gets another timestamp
        script = f'[ "$RANK" = 1 ] && sleep {skew_rank1_s}; exec "$@"'
        train = ["--no-python", "bash", "-c", script, "skew", sys.executable, *train]
    torchrun_ok(*train, cwd=cwd)  # the ranks run from `cwd`, outside the repo


def _metrics(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in metrics(out)}


@pytest.mark.long  # make test-all only (docs/testing.md)
def test_two_ranks_train_checkpoint_and_resume_like_one_run(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    # 1. two steps, Hydra's default timestamped run dir, rank 1 started 2.5 s late
    first = tmp_path / "first"
    first.mkdir()
    _torchrun(first, "trainer.steps=2", skew_rank1_s=2.5)
    runs = list((first / "outputs" / "train").iterdir())
    assert len(runs) == 1, f"the ranks must share rank 0's run dir, found {runs}"
    out = runs[0]
    assert (out / "train.log").is_file() and (out / "train.rank1.log").is_file()
    assert sorted(_metrics(out)) == [0, 1, 2]

    # 2. the same run resumed to step 3 (auto resume from its latest checkpoint)
    _torchrun(first, "trainer.steps=3", f"trainer.output_dir={out}", f"hydra.run.dir={tmp_path / 'h2'}")
    assert f"resumed from {out / 'checkpoints' / 'step_2'}" in (tmp_path / "h2" / "train.log").read_text()
    resumed = _metrics(out)
    assert sorted(resumed) == [0, 1, 2, 3]

    # 3. three steps without a break
    whole = tmp_path / "whole"
    _torchrun(tmp_path, "trainer.steps=3", f"hydra.run.dir={whole}")
    straight = _metrics(whole)

    # replay really ran under FSDP: questions were stored, then replayed with their stored log-probs
    assert straight[1]["replay/buffer_questions"] > 0
    assert straight[2]["replay/replayed_questions"] > 0 and straight[3]["replay/replayed_questions"] > 0
    assert straight[2]["loss/importance_weight_mean"] is not None
    assert straight[1]["rollout/logprob_diff_mean"] < 1e-3  # HF engine samples the sharded model itself
    # rank 0 logs run-wide metrics: groups of both ranks (4 questions x 4 responses per step)
    assert straight[1]["rollout/responses"] == 16.0

    a, b = (checkpoint_tensors(run / "checkpoints" / "step_3") for run in (out, whole))
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"resumed run differs from the uninterrupted one in {differ[:5]}"
    for key in ("loss/total", "reward/accuracy", "replay/buffer_experiences", "optim/grad_norm"):
        assert resumed[3][key] == straight[3][key], key

    # the checkpoint holds the full (gathered) weights: a plain from_pretrained gets every tensor
    # at the tiny model's full shapes, and training moved them
    model = AutoModelForCausalLM.from_pretrained(whole / "checkpoints" / "step_3" / "model")
    start = load_file(str(TINY / "model.safetensors"))
    trained = model.state_dict()
    assert set(start) <= set(trained)
    assert all(trained[k].shape == v.shape for k, v in start.items())
    assert any(not torch.equal(trained[k], v) for k, v in start.items())

    # 4. the two-rank checkpoint resumes on one process: the sharded optimizer state is resharded
    one = tmp_path / "one"
    resume = f"trainer.resume={out / 'checkpoints' / 'step_2'}"
    env = {"PYTHONPATH": str(REPO)}  # the process runs from tmp_path, outside the repo
    res = run_cli(
        ["train", *ARGS, "trainer.steps=3", f"hydra.run.dir={one}", resume], tmp_path, env_extra=env
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert f"resumed from {out / 'checkpoints' / 'step_2'} (step 2)" in (one / "train.log").read_text()
    assert sorted(_metrics(one)) == [3]
