"""replay.method=prompt (replay/prompt_replay.py): prompts, not responses, replay; nearest to a
pass rate of 0.5 first; cooldown and max reuse; on the real path no stored token is trained."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.methods import Members
from exgrpo_cli.replay.mixing import Group, Response
from exgrpo_cli.replay.prompt_replay import PromptReplay

from conftest import (
    REPLAY_RUN,
    SharedRun,
    checkpoint_tensors,
    metrics,
    run_cli,
    same_tensors,
    sigkill_mid_run,
    train_ok,
)

K = 4


def _group(uid: str, k: int) -> Group:
    responses = [Response([7, j], [-1.0, -1.0], reward=float(j < k)) for j in range(K)]
    return Group(Question(uid, uid, "1"), [1], responses)


def _method(cooldown: int = 1, max_reuse: int = 2) -> PromptReplay:
    cfg = ExgrpoConfig()
    cfg.rollout.n = K
    cfg.replay.method = "prompt"
    cfg.replay.prompt.cooldown, cfg.replay.prompt.max_reuse = cooldown, max_reuse
    return PromptReplay(cfg)


def _observe(method: PromptReplay, buf: ExperienceBuffer, groups: list[Group], step: int) -> None:
    rows = method.enters(groups, (0, K - 1))
    buf.observe_groups(groups, step, (0, K - 1), None, rows, method.keeps_prompts)
    method.end_step(buf, step, groups)


def test_prompts_enter_with_no_response_and_replay_with_k_fresh() -> None:
    method, buf = _method(), ExperienceBuffer(K)
    _observe(method, buf, [_group("a", 1), _group("b", 2), _group("c", 3), _group("d", 0), _group("e", 4)], 1)
    assert buf.num_questions == 3 and buf.num_experiences == 0  # k = 0 and k = K never enter
    assert buf.is_retired("e")
    assert method.members([], [], np.random.default_rng(0), K) == Members((), K)
    assert method.score is None and method.keeps_prompts


def test_nearest_to_half_first_then_cooldown_then_max_reuse() -> None:
    method, buf = _method(cooldown=1, max_reuse=2), ExperienceBuffer(K)
    _observe(method, buf, [_group("a", 1), _group("b", 2), _group("c", 3)], 1)
    rng = np.random.default_rng(0)
    assert method.questions(buf, 1, rng, step=2) == ["b"]  # pass rate 0.5
    assert method.questions(buf, 3, rng, step=3) == ["a", "c"]  # b cools down one step
    assert method.questions(buf, 3, rng, step=4) == ["b"]  # a and c cool down
    method.end_step(buf, 4, [])  # b was replayed twice: it leaves the buffer (not retired)
    assert "b" not in buf and not buf.is_retired("b") and "a" in buf
    assert buf.method_state == {"reuse": {"a": 1, "c": 1}, "last_replayed": {"a": 3, "c": 3}}


def test_a_prompts_only_buffer_and_its_counts_survive_a_save(tmp_path: Path) -> None:
    method, buf = _method(), ExperienceBuffer(K, max_age=5)
    _observe(method, buf, [_group("a", 1), _group("b", 2)], 1)
    method.questions(buf, 1, np.random.default_rng(0), step=2)
    buf.save(str(tmp_path / "replay"))
    back = ExperienceBuffer.load(str(tmp_path / "replay"))
    assert back.digest() == buf.digest() and back.method_state == buf.method_state
    assert back.questions_in_bucket(1) == ["b"] and back.experiences("b") == []
    assert ExperienceBuffer(K).digest() != back.digest()


@pytest.mark.slow
def test_prompt_replay_trains_every_token_on_policy(prompt_run: SharedRun) -> None:
    rows = metrics(prompt_run.dir)  # REPLAY_RUN + replay.method=prompt, shared with inspect-buffer's test
    replaying = [r for r in rows if r.get("replay/replayed_questions", 0) > 0]
    assert replaying, "the scenario must replay"
    for r in rows[1:]:
        assert r["replay/buffer_experiences"] == 0  # prompts only
        # a replayed prompt gets K fresh responses: every row of the batch was sampled this step
        assert r["rollout/responses"] == r["rollout/rows"] == 8 * K
        # the importance weight's mean is over replayed tokens in the loss: none reached it
        w = r["loss/importance_weight_mean"]
        assert w is None or math.isnan(w)
    assert all("reward/accuracy_replayed_questions" in r for r in replaying)


@pytest.mark.long
@pytest.mark.parametrize("method", ["prompt", "prioritized"])
def test_a_prompts_only_method_resumes_bit_for_bit(tmp_path: Path, method: str) -> None:
    """As tests/train/test_resume.py for exgrpo: SIGKILLed between steps and resumed, the run ends
    with the uninterrupted run's weights, optimizer and buffer (its method_state included)."""
    args = [*REPLAY_RUN, "trainer.steps=4", "trainer.save_every=1", f"replay.method={method}"]
    ref, out = tmp_path / "ref", tmp_path / "run"
    train_ok(ref, *args)
    assert any(r.get("replay/replayed_questions", 0) > 0 for r in metrics(ref)), "the run must replay"
    sigkill_mid_run(out, args)
    res = run_cli(["train", f"hydra.run.dir={out}", *args])
    assert res.returncode == 0 and "resumed from" in res.stderr + res.stdout, res.stderr[-3000:]
    index = "checkpoints/step_4/replay/index.json"
    assert json.loads((out / index).read_text()) == json.loads((ref / index).read_text())
    final = "checkpoints/step_4"
    assert same_tensors(checkpoint_tensors(out / final), checkpoint_tensors(ref / final))


def test_inspect_buffer_reports_a_prompts_only_buffer() -> None:
    """inspect-buffer's report of questions kept with no response (it indexed their last token)."""
    from exgrpo_cli.inspection import report as rp

    method, buf = _method(), ExperienceBuffer(K)
    _observe(method, buf, [_group("a", 1), _group("b", 2)], 1)
    rep = rp.buffer_report(buf, {"step": 1})
    assert rep["questions"] == 2 and rep["experiences"] == 0
    assert [q["experiences"] for q in rep["top_questions"]] == [0, 0]
    assert all(q["mean_length"] is None for q in rep["top_questions"])  # JSON has no NaN
