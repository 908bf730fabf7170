"""A rollout engine that samples from other weights than the trainer's stops the run before its update.

Unit: the gap is the mean |trainer - engine| log-prob over fresh tokens only (replayed rows carry
stored log-probs of an older policy), it stops past `rollout.max_logprob_diff` (NaN too), and the
update calls it after the first forward and before any optimizer step: the weights are untouched.
End to end: `exgrpo train rollout=vllm` with the stand-in vLLM (tests/rollout/fake_vllm, which
samples from the weights the sync gave it) and a sync whose tensors never arrive stops at step 1
with exit 1 and no checkpoint; the healthy stand-in run is unaffected.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from update_plans import toy_plan

from exgrpo_cli.algo import group_advantages
from exgrpo_cli.config.schema import ModelConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy.model import load_model, load_tokenizer
from exgrpo_cli.replay.mixing import Group, Response, build_mixed_batch
from exgrpo_cli.step.divergence import (
    EngineDivergence,
    check_engine_logprobs,
    engine_check,
    nucleus_slack,
)
from exgrpo_cli.step.offpolicy import offpolicy_sums
from exgrpo_cli.step.update import policy_update

from conftest import FAKE_VLLM_ENV, metrics, run_cli


def _batch(engine_logp: list[float], replayed_logp: list[float]) -> object:
    q = Question("q", "What is 1+2?", "3")
    responses = [
        Response([5, 6, 7], engine_logp, 1.0),
        Response([5, 8], [-9.0, -9.0], 0.0, replayed=True),
    ]
    return build_mixed_batch([Group(q, [1, 2], responses)]), replayed_logp


def _gaps(trainer: dict[int, list[float]], batch: object) -> object:
    """The fresh-token sums the update hands the check (step/offpolicy.py)."""
    return offpolicy_sums(trainer, batch, None).mismatch  # type: ignore[arg-type]


def test_the_gap_counts_fresh_tokens_only_and_stops_past_the_limit() -> None:
    batch, _ = _batch([-1.0, -2.0, -3.0], [])
    trainer = {0: [-1.1, -2.0, -2.6], 1: [-1.0, -1.0]}  # row 1 is replayed: its stored log-probs differ
    gaps = _gaps(trainer, batch)
    assert gaps.tokens == 3 and gaps.abs_sum == pytest.approx(0.5)  # type: ignore[attr-defined]
    gap = check_engine_logprobs(_gaps(trainer, batch), limit=0.2, step=3, parallel=DataParallel())  # type: ignore[arg-type]
    assert gap == pytest.approx(0.5 / 3)
    with pytest.raises(EngineDivergence, match=r"step 3: .*0\.1667 nats per token.*3 fresh tokens") as err:
        check_engine_logprobs(_gaps(trainer, batch), limit=0.1, step=3, parallel=DataParallel())  # type: ignore[arg-type]
    message = str(err.value)
    for fallback in ("rollout.enforce_eager=true", "rollout.sleep_mode=false", "VLLM_USE_V2_MODEL_RUNNER=0"):
        assert fallback in message
    assert err.value.exit_code == 1
    nan = {0: [float("nan"), -2.0, -3.0]}
    with pytest.raises(EngineDivergence):
        check_engine_logprobs(_gaps(nan, batch), limit=0.1, step=1, parallel=DataParallel())  # type: ignore[arg-type]
    assert engine_check(None, 1, DataParallel()) is None


def test_top_p_widens_the_limit_by_the_nucleus_renormalisation() -> None:
    """vLLM's log-probs under top_p < 1 are renormalised over the nucleus: up to -log(top_p) per
    token from the trainer's on a healthy engine. A 0.6-nat gap passes at top_p 0.5 (slack 0.69)
    and stops at top_p 1."""
    batch, _ = _batch([-1.0, -2.0, -3.0], [])
    trainer = {0: [-1.6, -2.6, -3.6]}
    assert nucleus_slack(1.0) == 0.0 and nucleus_slack(0.5) == pytest.approx(math.log(2))
    healthy = engine_check(0.5, 2, DataParallel(), top_p=0.5)
    assert healthy is not None and healthy(_gaps(trainer, batch)) == pytest.approx(0.6)  # type: ignore[arg-type]
    strict = engine_check(0.5, 2, DataParallel(), top_p=1.0)
    assert strict is not None
    with pytest.raises(EngineDivergence):
        strict(_gaps(trainer, batch))  # type: ignore[arg-type]


def test_the_update_stops_before_its_first_optimizer_step(tiny_model: Path) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(path=str(tiny_model))
    tok, model = load_tokenizer(cfg), load_model(cfg, torch.device("cpu"))
    ids = tok("<think>1+2 = 3</think>\\boxed{3}<|im_end|>", add_special_tokens=False)["input_ids"]
    bad = [-5.0] * len(ids)  # an engine whose weights are not the trainer's
    group = Group(
        Question("q", "What is 1+2?", "3"),
        tok("What is 1+2?", add_special_tokens=False)["input_ids"],
        [Response(ids, bad, 1.0), Response(ids[:-2], bad[:-2], 0.0)],
    )
    batch = build_mixed_batch([group])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = toy_plan(updates=2, before_first_step=engine_check(0.5, 1, DataParallel()))
    with pytest.raises(EngineDivergence, match="step 1"):
        policy_update(
            model, opt, batch, group_advantages(batch.rewards, batch.group_index), plan, tok.pad_token_id
        )
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not opt.state  # AdamW never stepped


ARGS = [
    "rollout=vllm",
    "trainer.steps=2",
    "trainer.threads=1",
    "algo.questions_per_step=2",
    "rollout.n=2",
    "model.max_response_tokens=12",
    "trainer.val_questions=2",
    "trainer.val_samples=1",
    "logger.console=false",
]


@pytest.mark.slow
@pytest.mark.parametrize("broken", [True, False])
def test_a_broken_weight_sync_stops_the_run_at_step_1(tiny_model: Path, tmp_path: Path, broken: bool) -> None:
    out = tmp_path / "run"
    env = FAKE_VLLM_ENV | ({"EXGRPO_STANDIN_BROKEN_SYNC": "1"} if broken else {})
    steps = ["trainer.steps=1"] if not broken else []
    res = run_cli(["train", *ARGS, *steps, f"hydra.run.dir={out}"], env_extra=env, timeout=600)
    rows = metrics(out)
    if broken:
        assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-3000:]
        assert "step 1: the rollout engine's log-probs are" in res.stderr
        assert "rollout.enforce_eager=true" in res.stderr and "VLLM_USE_V2_MODEL_RUNNER=0" in res.stderr
        assert [r["step"] for r in rows] == [0]  # nothing logged for the stopped step
        assert not (out / "checkpoints").exists()
    else:
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        assert rows[-1]["step"] == 1 and rows[-1]["rollout/logprob_diff_mean"] < 1e-4
