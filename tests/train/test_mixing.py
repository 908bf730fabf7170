"""The mixed batch's group structure and the pure helpers around the train step."""

from pathlib import Path

import numpy as np
import torch

from exgrpo_cli.algo import group_advantages
from exgrpo_cli.data.sampler import QuestionSampler
from exgrpo_cli.data.types import Question
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy.forward import micro_batches, pack, synced_micro_batches
from exgrpo_cli.replay.mixing import Group, Response, build_mixed_batch, split_groups, update_order
from exgrpo_cli.replay.schedule import DelayedStart


def _q(i: int) -> Question:
    return Question(uid=f"q{i}", question=f"What is {i}+1?", answer=str(i + 1))


def test_mixed_batch_groups_fresh_and_replayed_questions():
    K = 4
    fresh = Group(_q(0), [1, 2], [Response([5], [-1.0], reward=r) for r in (1, 0, 0, 0)])
    replayed = Group(_q(1), [3], [Response([6], [-1.0], reward=r) for r in (0, 0, 1)], from_buffer=True)
    replayed.responses.append(Response([7, 8], [-0.5, -0.25], reward=1.0, replayed=True))
    batch = build_mixed_batch([fresh, replayed])
    assert len(batch) == 2 * K
    assert batch.group_index.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert batch.replay_mask.tolist() == [False] * 7 + [True]
    assert batch.prompt_ids[4:] == [[3]] * 4
    assert batch.behavior_logp[7] == [-0.5, -0.25]
    adv = group_advantages(batch.rewards, batch.group_index)
    # the replayed response counts in its group's baseline: rewards 0,0,1,1 -> mean 0.5
    assert adv.tolist() == [0.75, -0.25, -0.25, -0.25, -0.5, -0.5, 0.5, 0.5]
    assert replayed.num_correct == 2 and fresh.num_correct == 1


def test_updates_see_fresh_and_replayed_groups_alike():
    """Groups come fresh first, then replayed; cut as they come, one update would see only fresh
    groups and the other only replayed ones. Shuffled first (the official trainer's order), each
    mini-batch mixes both kinds; one update keeps the order (it cannot matter there)."""
    groups = list(range(16))  # 0-7 fresh, 8-15 replayed
    assert [set(p) <= set(range(8)) for p in split_groups(16, 2)] == [True, False]
    for seed in range(20):
        order = update_order(groups, 2, np.random.default_rng(seed))
        assert sorted(order) == groups
        halves = [[order[i] for i in part] for part in split_groups(16, 2)]
        assert all(any(g < 8 for g in h) and any(g >= 8 for g in h) for h in halves)
    again = update_order(groups, 2, np.random.default_rng(3))
    assert again == update_order(groups, 2, np.random.default_rng(3))  # reproducible after a resume
    assert update_order(groups, 1, np.random.default_rng(0)) == groups


CPU = torch.device("cpu")


def test_split_groups_into_updates():
    assert split_groups(5, 1) == [[0, 1, 2, 3, 4]]
    assert split_groups(5, 2) == [[0, 1], [2, 3, 4]]
    assert split_groups(2, 4) == [[0], [1]]


def test_micro_batches_respect_the_token_budget():
    lengths = [10, 50, 20, 40, 30]
    chunks = micro_batches(lengths, 60)
    assert sorted(i for c in chunks for i in c) == [0, 1, 2, 3, 4]
    for c in chunks:
        assert len(c) == 1 or len(c) * max(lengths[i] for i in c) <= 60
    assert micro_batches([100], 10) == [[0]]  # a row longer than the budget still goes alone


def test_synced_micro_batches_cut_to_max_rows():
    """The replay candidates' scoring caps the rows of a forward (replay.entropy_batch_size) on
    top of the token budget: each budget chunk is cut into pieces of at most max_rows rows."""
    prompts, responses = [[1]] * 5, [[2, 3]] * 5
    rows = [4, 0, 3, 1, 2]  # the caller's indices, in any order
    parallel = DataParallel()
    whole = [sb.rows for sb, _ in synced_micro_batches(prompts, responses, rows, 100, 0, CPU, parallel)]
    cut = [
        sb.rows for sb, _ in synced_micro_batches(prompts, responses, rows, 100, 0, CPU, parallel, max_rows=2)
    ]
    assert whole == [rows] and cut == [rows[:2], rows[2:4], rows[4:]]


def test_pack_left_pads_prompts_and_right_pads_responses():
    sb = pack([[1, 2, 3], [4]], [[7, 8], [9, 10, 11]], [0, 1], pad_id=0, device=torch.device("cpu"))
    # every response starts at column P=3; the logit of column 2+j predicts response token j
    assert sb.input_ids.tolist() == [[1, 2, 3, 7, 8, 0], [0, 0, 4, 9, 10, 11]]
    assert sb.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert sb.position_ids[1, 2:].tolist() == [0, 1, 2, 3]  # counted from the first real token
    assert sb.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert (sb.targets * sb.response_mask.long()).tolist() == [[7, 8, 0], [9, 10, 11]]


def test_response_logprobs_match_each_row_alone(tiny_model: Path):
    """Padding on both sides and the response-only projection change nothing: each row's
    log-probs and entropies equal those of the row run alone without padding."""
    from exgrpo_cli.config.schema import ModelConfig
    from exgrpo_cli.policy.forward import forward_logprobs
    from exgrpo_cli.policy.model import load_model

    model = load_model(ModelConfig(path=str(tiny_model)), torch.device("cpu")).eval()
    prompts, responses = [[5, 6, 7, 8], [9], [10, 11]], [[12, 13], [14, 15, 16, 17, 18], [19]]
    sb = pack(prompts, responses, [0, 1, 2], pad_id=0, device=torch.device("cpu"))
    with torch.no_grad():
        lp, ent = forward_logprobs(model, sb, with_entropy=True)
        for r in range(3):
            ids = torch.tensor([prompts[r] + responses[r]])
            logits = model(input_ids=ids).logits[0, len(prompts[r]) - 1 : -1]
            ref = torch.log_softmax(logits, -1)
            n, picked = len(responses[r]), ref.gather(-1, torch.tensor(responses[r])[:, None])[:, 0]
            assert torch.allclose(lp[r, :n], picked, atol=1e-5)
            assert torch.allclose(ent[r, :n], -(ref.exp() * ref).sum(-1), atol=1e-5)


def test_delayed_start_is_one_way():
    s = DelayedStart(0.35)
    assert not s.update(1, 0.2)
    assert s.update(2, 0.35) and s.started_at == 2
    assert s.update(3, 0.0)
    t = DelayedStart(0.9)
    t.load_state_dict(s.state_dict())
    assert t.active and t.started_at == 2 and t.threshold == 0.35
    assert DelayedStart(0.0).update(1, 0.0)  # threshold 0: no delay


def test_sampler_epochs_skip_retired_from_next_epoch_and_resume_exactly():
    qs = [_q(i) for i in range(6)]
    s = QuestionSampler(qs, seed=3)
    first = [q.uid for q in s.draw(4)]
    retired = {first[0]}
    rest = [q.uid for q in s.draw(2, retired)]  # this epoch still holds it
    assert sorted(first + rest) == sorted(q.uid for q in qs)
    state = s.state_dict()
    nxt = [q.uid for q in s.draw(5, retired)]
    assert first[0] not in nxt  # the new epoch leaves the retired question out
    s2 = QuestionSampler(qs, seed=999)
    s2.load_state_dict(state)
    assert [q.uid for q in s2.draw(5, retired)] == nxt


def test_step_rngs_are_independent_of_history():
    from exgrpo_cli.step.state import step_rng

    a = step_rng(0, 5, 2).integers(1 << 30, size=3)
    step_rng(0, 4, 2).integers(1 << 30, size=100)
    assert np.array_equal(a, step_rng(0, 5, 2).integers(1 << 30, size=3))
    assert not np.array_equal(a, step_rng(1, 5, 2).integers(1 << 30, size=3))


def test_row_keys_name_each_row_of_the_mixed_batch() -> None:
    """The batch's row_keys are the (group among the step's, response) of each row of the batch of
    those groups in that order: how the step finds the trainer's log-probs of the responses the
    buffer stores."""
    groups = [Group(_q(g), [g], [Response([100 * g + j], [-1.0]) for j in range(2 + g)]) for g in range(4)]
    order = [3, 1, 2]
    batch = build_mixed_batch([groups[i] for i in order], step_groups=order)
    keys = batch.row_keys
    assert len(keys) == len(batch) == 5 + 3 + 4
    assert [groups[g].responses[r].ids for g, r in keys] == batch.response_ids
    assert [order[i] for i in batch.group_index.tolist()] == [g for g, _ in keys]
