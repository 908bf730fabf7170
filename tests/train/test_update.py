"""The policy update moves the policy the right way: towards rewarded responses, away from the rest."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from update_plans import toy_plan

from exgrpo_cli.algo import group_advantages
from exgrpo_cli.algo.losses import ExgrpoLoss, LossInputs
from exgrpo_cli.config.schema import ModelConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.policy.forward import forward_logprobs, pack
from exgrpo_cli.policy.model import load_model, load_tokenizer
from exgrpo_cli.replay.mixing import Group, MixedBatch, Response, build_mixed_batch
from exgrpo_cli.step.update import UpdatePlan, policy_update

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def _plan(clip_eps: float | None, beta: float | None, entropy_coef: float, updates: int) -> UpdatePlan:
    return toy_plan(loss=ExgrpoLoss(clip_eps, beta), entropy_coef=entropy_coef, updates=updates)


def _seq_logps(model: PreTrainedModel, batch: MixedBatch) -> list[float]:
    sb = pack(batch.prompt_ids, batch.response_ids, list(range(len(batch))), 0, torch.device("cpu"))
    with torch.no_grad():
        lp, _ = forward_logprobs(model, sb)
    return [float((lp[i] * sb.response_mask[i]).sum()) for i in range(len(batch))]


def test_update_raises_rewarded_and_lowers_unrewarded_responses(tiny_model: Path):
    torch.manual_seed(0)
    cfg = ModelConfig(path=str(tiny_model))
    tok, model = load_tokenizer(cfg), load_model(cfg, torch.device("cpu"))
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    good = enc("<think>1+2 = 3</think>\\boxed{3}<|im_end|>")
    bad = enc("<think>1+2 = 4</think>\\boxed{4}<|im_end|>")
    stored = [-1.0] * len(good)  # a replayed copy of the good one, with stored log-probs
    responses = [
        Response(good, None, 1.0),
        Response(bad, None, 0.0),
        Response(good, stored, 1.0, replayed=True),
    ]
    group = Group(Question("q", "What is 1+2?", "3"), enc("What is 1+2?"), responses)
    batch = build_mixed_batch([group])
    adv = group_advantages(batch.rewards, batch.group_index)
    before = _seq_logps(model, batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    settings = _plan(clip_eps=None, beta=0.1, entropy_coef=0.0, updates=1)
    for _ in range(3):
        res = policy_update(model, opt, batch, adv, settings, pad_id=tok.pad_token_id)
        assert res.skipped == 0 and res.stats.replay_tokens == len(good)
    after = _seq_logps(model, batch)
    # the two responses share a prefix that the group baseline pushes both ways; what must move is
    # the preference: log p(rewarded) - log p(unrewarded)
    assert after[0] - after[1] > before[0] - before[1] + 1.0
    assert after[1] < before[1]


def _two_question_batch(tok: PreTrainedTokenizerBase) -> MixedBatch:
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    groups = []
    for q, right, wrong in (("1+2", "3", "4"), ("2+2", "4", "5"), ("3+4", "7", "8"), ("5+1", "6", "9")):
        good = enc(f"<think>{q} = {right}</think>\\boxed{{{right}}}<|im_end|>")
        bad = enc(f"<think>{q} = {wrong}</think>\\boxed{{{wrong}}}<|im_end|>")
        groups.append(
            Group(
                Question(q, f"What is {q}?", right),
                enc(f"What is {q}?"),
                [Response(good, None, 1.0), Response(bad, None, 0.0)],
            )
        )
    return build_mixed_batch(groups)


def _recording(ratios: list[tuple[float, int]]) -> UpdatePlan:
    """Two updates of ExGRPO's loss that record, per call (one micro-batch each here), the sum of the
    fresh tokens' ratios w = exp(logp - pi_old) and their count."""

    def loss(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
        fresh = x.response_mask.bool() & ~x.replay_mask.bool().unsqueeze(-1)
        w = (x.logp.detach() - x.behaviour_logp).exp()
        ratios.append((float(w[fresh].sum()), int(fresh.sum())))
        return ExgrpoLoss(clip_eps=0.2, beta=0.1)(x)

    return dataclasses.replace(_plan(clip_eps=0.2, beta=0.1, entropy_coef=0.0, updates=2), loss=loss)


def test_two_updates_first_minibatch_ratio_is_exactly_one(tiny_model: Path):
    """docs/algorithm.md §4: with several updates per step, pi_old of every mini-batch is the policy
    before the step's first update. The first mini-batch's fresh tokens must see w == 1 exactly
    (and so clip nothing); the second's pi_old is the pre-update pass, so after a real first
    update its ratios move away from 1."""
    torch.manual_seed(0)
    cfg = ModelConfig(path=str(tiny_model))
    tok, model = load_tokenizer(cfg), load_model(cfg, torch.device("cpu"))
    batch = _two_question_batch(tok)
    adv = group_advantages(batch.rewards, batch.group_index)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    ratios: list[tuple[float, int]] = []
    res = policy_update(model, opt, batch, adv, _recording(ratios), pad_id=tok.pad_token_id)
    (first, first_n), (second, second_n) = ratios
    assert res.skipped == 0 and first_n > 0 and second_n > 0
    assert first == first_n  # exactly: b is the very forward's detached log-probs
    assert abs(second - second_n) > 1e-3  # the first update moved the policy


def test_two_updates_without_learning_never_clip(tiny_model: Path):
    """lr 0: the policy never moves, so every fresh ratio of both mini-batches is 1."""
    cfg = ModelConfig(path=str(tiny_model))
    tok, model = load_tokenizer(cfg), load_model(cfg, torch.device("cpu"))
    batch = _two_question_batch(tok)
    adv = group_advantages(batch.rewards, batch.group_index)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    ratios: list[tuple[float, int]] = []
    res = policy_update(model, opt, batch, adv, _recording(ratios), pad_id=tok.pad_token_id)
    assert res.stats.clipped_tokens == 0 and len(ratios) == 2
    assert all(abs(w - n) < 1e-5 * n for w, n in ratios)


def test_trainer_logp_are_the_pre_update_logprobs_of_every_fresh_row(tiny_model: Path) -> None:
    """What the replay buffer stores (docs/algorithm.md §4, the official code): the trainer's own
    log-probs under the policy before the step's first update, for both mini-batches."""
    cfg = ModelConfig(path=str(tiny_model))
    tok, model = load_tokenizer(cfg), load_model(cfg, torch.device("cpu"))
    batch = _two_question_batch(tok)
    sb = pack(
        batch.prompt_ids, batch.response_ids, list(range(len(batch))), tok.pad_token_id, torch.device("cpu")
    )
    with torch.no_grad():
        before, _ = forward_logprobs(model, sb)
    adv = group_advantages(batch.rewards, batch.group_index)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    res = policy_update(model, opt, batch, adv, _plan(0.2, 0.1, 0.0, updates=2), pad_id=tok.pad_token_id)
    assert sorted(res.trainer_logp) == list(range(len(batch)))  # every row here is fresh
    for i, row in res.trainer_logp.items():
        torch.testing.assert_close(
            torch.tensor(row), before[i, : len(batch.response_ids[i])], atol=1e-5, rtol=0
        )
    with torch.no_grad():
        after, _ = forward_logprobs(model, sb)
    assert not torch.allclose(after, before, atol=1e-3)  # the update did move the policy


def test_skipped_updates_are_counted_in_order(tiny_model: Path) -> None:
    """Every update whose gradient norm is above algo.skip_grad_norm_above is skipped, and the
    result says which, in order (the run's count of skipped updates in a row needs the order)."""
    cfg = ModelConfig(path=str(tiny_model))
    tok, model = load_tokenizer(cfg), load_model(cfg, torch.device("cpu"))
    batch = _two_question_batch(tok)
    adv = group_advantages(batch.rewards, batch.group_index)
    before = [p.detach().clone() for p in model.parameters()]
    plan = dataclasses.replace(_plan(0.2, 0.1, 0.0, updates=2), skip_grad_norm_above=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    res = policy_update(model, opt, batch, adv, plan, pad_id=tok.pad_token_id)
    assert res.applied == [False, False] and res.skipped == 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_without_is_correction_replayed_rows_are_weighed_against_the_steps_pi_old(tiny_model: Path) -> None:
    """The "w/o IS correction" ablation (replay.importance_correction=false): b of a replayed row is
    the step's pi_old, as the official code has it: neither the stored log-probs nor the current
    policy. Every replayed row's behaviour log-probs, in both mini-batches, must be those of the
    model before the update (computed here by an independent pass); in the second mini-batch, after
    a real first update, they must differ from the current policy's."""
    torch.manual_seed(0)
    cfg = ModelConfig(path=str(tiny_model))
    tok, model = load_tokenizer(cfg), load_model(cfg, torch.device("cpu"))
    batch = _two_question_batch(tok)
    groups = []
    for g in range(int(batch.group_index.max()) + 1):
        rows = [i for i in range(len(batch)) if int(batch.group_index[i]) == g]
        responses = [Response(batch.response_ids[i], None, float(batch.rewards[i])) for i in rows]
        good = batch.response_ids[rows[0]]
        responses.append(Response(good, [-1.0] * len(good), 1.0, replayed=True))  # stored: ignored here
        groups.append(Group(Question(str(g), str(g), "1"), batch.prompt_ids[rows[0]], responses))
    batch = build_mixed_batch(groups)
    adv = group_advantages(batch.rewards, batch.group_index)
    # pi_old of each replayed row (sum over its tokens), from the model before any update
    before = _seq_logps(model, batch)
    pi_old = sorted(before[i] for i in range(len(batch)) if bool(batch.replay_mask[i]))
    stored_sums = {-1.0 * len(batch.response_ids[i]) for i in range(len(batch)) if bool(batch.replay_mask[i])}
    seen: list[tuple[list[float], list[float]]] = []  # per mini-batch: (behaviour, current) row sums

    def loss(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [i for i in range(x.logp.shape[0]) if bool(x.replay_mask[i])]
        m = x.response_mask
        seen.append(
            (
                [float((x.behaviour_logp[i] * m[i]).sum()) for i in rows],
                [float((x.logp.detach()[i] * m[i]).sum()) for i in rows],
            )
        )
        return ExgrpoLoss(clip_eps=0.2, beta=0.1)(x)

    plan = dataclasses.replace(
        _plan(clip_eps=0.2, beta=0.1, entropy_coef=0.0, updates=2), loss=loss, importance_correction=False
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    res = policy_update(model, opt, batch, adv, plan, pad_id=tok.pad_token_id)
    assert res.skipped == 0 and len(seen) == 2 and all(b for b, _ in seen)
    behaviour = sorted(v for b, _ in seen for v in b)
    assert len(behaviour) == len(pi_old)  # every replayed row, once
    torch.testing.assert_close(torch.tensor(behaviour), torch.tensor(pi_old), atol=1e-4, rtol=0)
    assert not stored_sums & {round(v, 3) for v in behaviour}  # not the stored -1.0 per token
    second_behaviour, second_current = seen[1]
    # the second mini-batch runs after a real update: the current policy has moved away from pi_old
    assert min(abs(b - c) for b, c in zip(second_behaviour, second_current)) > 1e-3


def test_rollout_and_trainer_logprobs_agree_at_temperature_0_6(tiny_model: Path) -> None:
    """One temperature for both sides (docs/algorithm.md §4): at rollout.temperature=0.6 the HF
    engine's log-probs and the trainer's pre-update log-probs are both those of softmax(logits /
    0.6), as an independent teacher-forced pass computes them, so their gap stays float noise."""
    from exgrpo_cli.rollout.base import SamplingSpec
    from exgrpo_cli.rollout.hf import HFEngine

    torch.manual_seed(0)
    cfg = ModelConfig(path=str(tiny_model))
    tok, model = load_tokenizer(cfg), load_model(cfg, torch.device("cpu"))
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompts = [enc("What is 1+2?"), enc("What is 3+4?")]
    outs = HFEngine(model, tok).generate(prompts, [3, 3], SamplingSpec(0.6, 1.0, 24, seed=2))
    groups = [Group(Question(str(i), "q", "3"), p) for i, p in enumerate(prompts)]
    for o in outs:
        groups[o.prompt_index].responses.append(
            Response(o.response_ids, o.logprobs, float(len(o.response_ids) % 2))
        )
    batch = build_mixed_batch(groups)
    adv = group_advantages(batch.rewards, batch.group_index)
    plan = dataclasses.replace(_plan(0.2, 0.1, 0.0, updates=1), temperature=0.6)
    res = policy_update(
        model, torch.optim.SGD(model.parameters(), lr=0.0), batch, adv, plan, tok.pad_token_id
    )
    tokens = sum(len(r) for r in batch.response_ids)
    assert res.logprob_diff_sum / tokens < 1e-5, res.logprob_diff_sum / tokens  # mean per token
    with torch.no_grad():
        for i in range(len(batch)):
            ids = torch.tensor([batch.prompt_ids[i] + batch.response_ids[i]])
            logits = model(input_ids=ids).logits[0, len(batch.prompt_ids[i]) - 1 : -1].float()
            want = torch.log_softmax(logits / 0.6, -1).gather(
                -1, torch.tensor(batch.response_ids[i])[:, None]
            )[:, 0]
            torch.testing.assert_close(torch.tensor(res.trainer_logp[i]), want, atol=1e-4, rtol=0)
            torch.testing.assert_close(torch.tensor(batch.behavior_logp[i]), want, atol=1e-4, rtol=0)
