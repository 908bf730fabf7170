"""reward/accuracy apart for questions drawn fresh and questions replayed from the buffer."""

from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.mixing import Group, Response
from exgrpo_cli.step.metrics import accuracy_by_origin


def _group(uid: str, rewards: list[float], replayed_reward: float | None = None) -> Group:
    responses = [Response([1], [-1.0], reward=r) for r in rewards]
    if replayed_reward is not None:
        responses.append(Response([2], [-1.0], reward=replayed_reward, replayed=True))
    return Group(Question(uid, uid, "1"), [1], responses, from_buffer=replayed_reward is not None)


def test_fresh_and_replayed_questions_apart_replayed_response_left_out():
    groups = [
        _group("new", [0.0, 0.0, 0.0, 1.0]),  # drawn fresh: 1 of 4
        _group("old", [1.0, 1.0, 1.0], replayed_reward=1.0),  # replayed: 3 of 3 fresh, stored one left out
    ]
    out = accuracy_by_origin(groups)
    assert out == {"reward/accuracy_fresh_questions": 0.25, "reward/accuracy_replayed_questions": 1.0}


def test_an_origin_without_groups_is_absent():
    assert accuracy_by_origin([_group("new", [1.0, 0.0])]) == {"reward/accuracy_fresh_questions": 0.5}
