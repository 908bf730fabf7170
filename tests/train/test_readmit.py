"""Re-admission of retired questions (docs/algorithm.md §2): back into fresh sampling
(`replay.readmit_into=sampling`), or also into the next steps' batches (`batch`, the paper's
App. E.4: 10% of the retired questions put back into the training batch every 25 steps)."""

from __future__ import annotations

from pathlib import Path

import pytest
from toy_trainer import toy_state, toy_trainer

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.mixing import Group, Response
from exgrpo_cli.step.loop import Trainer

from conftest import SMALL_RUN, metrics, train_ok


def _trainer(into: str) -> Trainer:
    cfg = ExgrpoConfig()
    cfg.rollout.n = 4
    cfg.replay.readmit_retired_fraction, cfg.replay.readmit_every, cfg.replay.readmit_into = 0.5, 2, into
    t = toy_trainer(cfg, toy_state(started=True))
    solved = [
        Group(Question(f"p{i}", "p", "1"), [1], [Response([1], [-1.0], reward=1.0)] * 4) for i in range(4)
    ]
    t.observe(solved, step=1, trainer_logp={})
    t.state.buffer.end_step()  # p0..p3 retired
    return t


def test_readmit_into_batch_queues_them_for_the_next_steps_first_fresh_slots() -> None:
    t = _trainer("batch")
    t.maybe_readmit(1)  # not a re-admission step
    assert t.state.readmit_queue == []
    t.maybe_readmit(2)
    back = list(t.state.readmit_queue)
    assert len(back) == 2 and not any(t.state.buffer.is_retired(u) for u in back)
    assert [q.uid for q in t.take_readmitted(1)] == back[:1]  # one fresh slot: the first
    assert t.state.readmit_queue == back[1:]  # the other waits for the next step
    state = t.state.state_dict()  # and is in the checkpoint
    assert state["readmit_queue"] == back[1:]
    t.state.readmit_queue = []
    t.state.load_state_dict(state)
    assert [q.uid for q in t.take_readmitted(5)] == back[1:] and t.state.readmit_queue == []


def test_readmitted_questions_take_at_most_their_share_of_the_batch() -> None:
    """replay.readmit_batch_share caps the re-admitted questions a step trains (ours: the paper's
    App. E.4 gives no queue); the rest wait, and a new re-admission replaces what still waits
    (those questions stay in fresh sampling: they left the retired set)."""
    t = _trainer("batch")
    t.cfg.algo.questions_per_step, t.cfg.replay.readmit_batch_share = 4, 0.25  # at most 1 a step
    t.state.readmit_queue = ["p0", "p1", "p2"]
    assert [q.uid for q in t.take_readmitted(4)] == ["p0"]  # 4 fresh slots, the cap is 1
    assert t.state.readmit_queue == ["p1", "p2"]
    t.cfg.replay.readmit_batch_share = 0.0
    assert t.take_readmitted(4) == [] and t.state.readmit_queue == ["p1", "p2"]
    t.maybe_readmit(2)  # half of p0..p3 leave the retired set: they replace the queue
    back = list(t.state.readmit_queue)
    assert len(back) == 2 and not any(t.state.buffer.is_retired(u) for u in back)
    t.cfg.replay.readmit_batch_share = 1.0
    assert [q.uid for q in t.take_readmitted(4)] == back  # the whole batch may be re-admitted


def test_readmit_into_sampling_queues_nothing() -> None:
    t = _trainer("sampling")
    t.maybe_readmit(2)
    assert t.state.readmit_queue == [] and t.take_readmitted(4) == []
    assert sum(t.state.buffer.is_retired(f"p{i}") for i in range(4)) == 2  # they left the retired set


@pytest.mark.slow
def test_a_run_trains_the_readmitted_questions_in_the_step_after(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [
        "trainer.steps=6",
        "trainer.eval_every=0",
        "data.synthetic.max_digits=1",  # an easy pool: groups solved K/K, so questions retire
        "data.synthetic.num_train=64",
        "data.synthetic.num_val=16",
        "replay.start_threshold=0",
        "replay.readmit_retired_fraction=1.0",
        "replay.readmit_every=2",
        "replay.readmit_into=batch",
    ]
    train_ok(run, *SMALL_RUN, *args)
    rows = {r["step"]: r for r in metrics(run)}
    # re-admission at steps 2 and 4 (the whole retired set), trained at steps 3 and 5 (up to the
    # step's fresh slots): a question retired by then must have come back
    readmitted = {s: rows[s]["replay/readmitted"] for s in (2, 4)}
    assert readmitted[4] > 0, readmitted
    trained = [rows[s]["replay/readmitted_trained"] for s in (1, 2, 3, 4, 5, 6)]
    assert trained[0] == trained[1] == 0 and trained[2] + trained[4] > 0, trained
    # replay.readmit_batch_share 0.25 of 4 questions: at most one a step; the queue is logged
    assert max(trained) <= 1 and all("replay/readmit_queue" in rows[s] for s in rows if s), trained
