"""reward=model: a sequence-classification reward model built locally from a config (the tiny
model's tokenizer and chat template, a random 2-layer Qwen2 scorer), used by the reward stage
directly and by `exgrpo train` on 1 and on 2 ranks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from exgrpo_cli.config.schema import RewardModelConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.reward.reward_model import ModelReward, RewardModelError

from conftest import SMALL_RUN, TINY, run_cli


def build_reward_model(folder: Path, chat_template: bool = True) -> Path:
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    vocab = json.loads((TINY / "config.json").read_text())["vocab_size"]
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, num_labels=1, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(cfg).save_pretrained(folder)
    names = ["tokenizer.json", "tokenizer_config.json"] + (["chat_template.jinja"] if chat_template else [])
    for name in names:
        shutil.copy(TINY / name, folder / name)
    return folder


@pytest.fixture
def reward_model(tiny_model: Path, tmp_path: Path) -> Path:
    return build_reward_model(tmp_path / "rm")


def test_scores_are_one_logit_per_response_batched_alike(reward_model: Path) -> None:
    qs = [Question(str(i), f"What is {i}+1?", "") for i in range(5)]
    texts = ["<think>x</think> 2", "3", "a much longer answer " * 5, "", "7"]
    one = ModelReward(RewardModelConfig(path=str(reward_model), batch_size=1), torch.device("cpu"))
    many = ModelReward(RewardModelConfig(path=str(reward_model), batch_size=4), torch.device("cpu"))
    a = one.score(texts, [""] * 5, questions=qs).rewards
    b = many.score(texts, [""] * 5, questions=qs).rewards
    assert len(a) == 5 and len(set(a)) > 1  # a score per response, not a constant
    assert a == pytest.approx(b, abs=1e-5)  # padding in a batch changes nothing
    sig = ModelReward(RewardModelConfig(path=str(reward_model), normalise="sigmoid"), torch.device("cpu"))
    assert all(0 < x < 1 for x in sig.score(texts, [""] * 5, questions=qs).rewards)


def test_a_reward_model_without_chat_template_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    folder = build_reward_model(tmp_path / "plain", chat_template=False)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert "chat_template" not in cfg
    with pytest.raises(RewardModelError, match="no chat template"):
        ModelReward(RewardModelConfig(path=str(folder)), torch.device("cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_train_with_a_reward_model_runs_3_steps(reward_model: Path, tmp_path: Path, ranks: int) -> None:
    run = tmp_path / "run"
    res = run_cli(
        ["train", "reward=model", f"reward.model.path={reward_model}", "reward.correct_at=0",
         f"trainer.nproc={ranks}", "trainer.steps=3", f"hydra.run.dir={run}", *SMALL_RUN],
        timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in rows if "reward/mean" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    # a raw logit: not 0/1, and the accuracy is the share >= reward.correct_at, not the mean
    assert all(m["reward/mean"] not in (0.0, 1.0) for m in steps)
    assert all(0.0 <= m["reward/accuracy"] <= 1.0 for m in steps)


@pytest.mark.slow
def test_a_sigmoid_reward_under_the_default_threshold_is_named_at_start_up(
    reward_model: Path, tmp_path: Path
) -> None:
    """reward.model.normalise=sigmoid gives rewards in (0, 1): under the default reward.correct_at=1
    nothing would ever be correct and replay would never act, so the run says so before step 1."""
    run = tmp_path / "run"
    res = run_cli(
        ["train", "reward=model", f"reward.model.path={reward_model}", "reward.model.normalise=sigmoid",
         "trainer.steps=1", f"hydra.run.dir={run}", *SMALL_RUN],
        timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout + res.stderr
    (line,) = [x for x in out.splitlines() if "reward.correct_at=1 cannot be reached" in x]
    assert "set reward.correct_at to the reward a good answer reaches" in line
    assert out.index("cannot be reached") < out.index("training /")  # with the start-up lines


def test_reward_model_path_that_is_no_model_exits_2(tmp_path: Path) -> None:
    res = run_cli(
        ["train", "reward=model", f"reward.model.path={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}"]
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert (
        res.stderr.strip()
        .splitlines()[-1]
        .startswith(f"exgrpo train: invalid reward.model.path='{tmp_path}'")
    )
