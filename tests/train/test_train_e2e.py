"""`exgrpo train` end to end through the real CLI, on the shipped tiny model (CPU, small batches).
The on-policy and the replaying run are the session's shared ones (conftest: onpolicy_run,
replay_run), trained once per test run and read here and by other files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import SMALL_RUN, TINY, SharedRun, metrics, run_cli, train_ok


@pytest.mark.slow
def test_train_smoke(tiny_model: Path, onpolicy_run: SharedRun):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert {"trainer.steps=2", "replay.ratio=0"} <= set(onpolicy_run.overrides)
    out = onpolicy_run.dir
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "val/accuracy" in rows[0] and "val/accuracy" in rows[-1]
    for key in (
        "reward/accuracy",
        "loss/total",
        "optim/grad_norm",
        "timing/step",
        "rollout/response_length",
        "rollout/logprob_diff_mean",
    ):
        assert key in rows[1], key
    assert rows[1]["rollout/logprob_diff_mean"] < 1e-3  # HF engine: the trainer's own weights
    ckpt = out / "checkpoints" / "step_2"
    assert (out / "checkpoints" / "latest").read_text() == "step_2"
    # the checkpoint reloads as the shipped architecture with trained weights: its exported config
    # computes what the shipped config computes with the same weights (a config the export got
    # wrong, e.g. rope or norm settings or the tied head, would change the logits)
    trained, shipped = (
        AutoModelForCausalLM.from_pretrained(folder).eval() for folder in (ckpt / "model", tiny_model)
    )
    shapes = [{k: tuple(v.shape) for k, v in m.state_dict().items()} for m in (trained, shipped)]
    assert shapes[0] == shapes[1] and len(shapes[0]) > 0
    before = load_file(str(tiny_model / "model.safetensors"))
    after = load_file(str(ckpt / "model" / "model.safetensors"))
    ids = AutoTokenizer.from_pretrained(tiny_model)("Compute 37 + 58.", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = [m(ids).logits for m in (trained, shipped)]
        rebuilt = AutoModelForCausalLM.from_pretrained(tiny_model).eval()  # the shipped config...
        missing, unexpected = rebuilt.load_state_dict(after, strict=False)  # ...the trained weights
        assert not unexpected and set(missing) <= {"lm_head.weight"}  # a tied head is not stored
        logits.append(rebuilt(ids).logits)
    assert logits[0].shape == (1, ids.shape[1], trained.config.vocab_size)
    assert torch.equal(logits[0], logits[2])
    assert (logits[0] - logits[1]).abs().max() > 1e-3  # two steps moved them by ~0.1
    unchanged = [k for k, v in before.items() if torch.equal(v, after[k])]
    assert not unchanged, f"parameters that did not train: {unchanged}"


@pytest.mark.slow
def test_exgrpo_replays_from_the_second_step(replay_run: SharedRun):
    wanted = {"trainer.steps=3", "replay.ratio=0.5", "replay.start_threshold=0", "algo.questions_per_step=8"}
    assert wanted <= set(replay_run.overrides)
    out = replay_run.dir
    steps = {r["step"]: r for r in metrics(out)}
    for key in (
        "replay/active",
        "replay/buffer_questions",
        "replay/buffer_experiences",
        "replay/retired",
        "replay/bucket/1",
        "replay/replayed_questions",
        "replay/selected_entropy_mean",
        "loss/on_policy",
        "loss/off_policy",
        "loss/importance_weight_mean",
        "loss/clip_fraction",
    ):
        assert key in steps[2], key
    assert steps[1]["replay/active"] == 1.0 and steps[1]["replay/replayed_questions"] == 0
    assert steps[1]["replay/buffer_questions"] > 0, "the tiny model solves some questions partly"
    assert steps[2]["replay/replayed_questions"] > 0
    assert steps[2]["loss/importance_weight_mean"] is not None  # replayed tokens were in the loss
    assert steps[2]["loss/clip_fraction"] == 0.0  # no clipping after the delayed start (default)
    assert (out / "checkpoints" / "step_3" / "replay" / "index.json").is_file()


@pytest.mark.slow
def test_a_run_whose_delayed_start_never_fires_says_so(tiny_model: Path, tmp_path: Path) -> None:
    """No fresh accuracy reaches 1.0 on the tiny model: the run is on-policy GRPO, and the console
    says so while it waits and at the end, not only replay/active in metrics.jsonl."""
    out = tmp_path / "run"
    res = train_ok(out, *SMALL_RUN, "trainer.steps=2", "replay.start_threshold=1.0")
    console = res.stdout + res.stderr
    assert "replay waits: acc " in console and " < 1" in console
    assert (
        "replay never started: the fresh accuracy stayed below replay.start_threshold=1 in all 2 "
        "steps, so this run was on-policy GRPO" in console
    ), console[-2000:]
    assert [r.get("replay/active") for r in metrics(out)[1:]] == [0.0, 0.0]


@pytest.mark.slow
def test_ratio_zero_is_exactly_on_policy(onpolicy_run: SharedRun, tmp_path: Path):
    """With replay.ratio=0 no replay setting may change anything: the run is plain Dr.GRPO. Run a
    is the shared on-policy run; b is the same command with every replay setting changed."""
    a = onpolicy_run.dir
    b = tmp_path / "b"
    base = ["trainer.steps=2", "replay.ratio=0"]
    assert [*SMALL_RUN, *base] == list(onpolicy_run.overrides)
    train_ok(
        b,
        *SMALL_RUN,
        *base,
        "replay.start_threshold=0",
        "replay.beta=0.7",
        "replay.mu=0.2",
        "replay.trajectory_selection=random",
        "replay.shaping=false",
    )
    wa = load_file(str(a / "checkpoints/step_2/model/model.safetensors"))
    wb = load_file(str(b / "checkpoints/step_2/model/model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert all(r.get("replay/active", 0.0) == 0.0 for r in metrics(a) + metrics(b))


@pytest.mark.parametrize("bad", ["replay.ratio=2", "rollout.n=1"])
def test_bad_config_exits_2(tmp_path: Path, bad: str):
    res = run_cli(["train", bad, f"hydra.run.dir={tmp_path}"])
    assert res.returncode == 2 and bad.split("=")[0] in res.stderr


def test_shipped_model_exists():
    assert (TINY / "config.json").is_file(), "exgrpo_cli/assets/tiny must ship with the package"
