"""What a replay method takes over from another run's buffer (replay.init_from, a resume under
another replay.method): the `carried` and `replays` hooks (replay/methods.py), and two rules the
methods share with the buffer: a LUFFY-guided group retires when its fresh rollouts are all
correct, and replay.max_age is refused for methods that store no response."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.method_registry import build_replay_method
from exgrpo_cli.replay.methods import ReplayMethod
from exgrpo_cli.replay.mixing import Group, Response
from exgrpo_cli.run import carry

K = 4
IDS, LOGP = np.array([5, 6, 7], np.int32), np.array([-0.1, -0.2, -0.3], np.float32)


def _method(name: str, **replay: Any) -> ReplayMethod:
    cfg = ExgrpoConfig()
    cfg.replay.method = name
    for key, value in replay.items():
        setattr(cfg.replay, key, value)
    return build_replay_method(cfg)


def _group(uid: str, rewards: list[float], guided: bool = False) -> Group:
    responses = [Response([3 + i, 9], [-0.5, -0.5], reward=r) for i, r in enumerate(rewards)]
    if guided:  # LUFFY's solution from the data, right by construction
        responses.append(Response([8, 9], [0.0, 0.0], reward=1.0, replayed=True))
    return Group(Question(uid, "q", "1"), [1, 2], responses)


def _buffer(method: ReplayMethod, groups: list[Group], step: int = 1) -> ExperienceBuffer:
    """A buffer filled as the train step fills it under `method`, collecting from the start."""
    buf = ExperienceBuffer(K)
    seen = method.observed(groups)
    rows = method.enters(seen, (0, K - 1))
    logprobs = {(gi, ri): np.full(len(seen[gi].responses[ri].ids), -0.5, np.float32) for gi, ri in rows}
    buf.observe_groups(seen, step, (0, K - 1), logprobs, rows, method.keeps_prompts, method.stores_any)
    method.recorded(buf, seen, rows)
    return buf


def test_a_guided_group_whose_fresh_rollouts_are_all_correct_retires() -> None:
    luffy = _method("luffy")
    buf = _buffer(luffy, [_group("all", [1, 1, 1], guided=True), _group("some", [1, 0, 1], guided=True)])
    assert luffy.end_step(buf, 1, []) == ["all"]  # 3 of its 3 fresh: solved, as ExGRPO's K/K
    exgrpo = _method("exgrpo")
    buf = _buffer(exgrpo, [_group("three", [1, 1, 1, 0]), _group("four", [1, 1, 1, 1])])
    assert exgrpo.end_step(buf, 1, []) == ["four"]  # ExGRPO's rule is unchanged


def test_max_age_is_refused_for_methods_that_store_no_response() -> None:
    for name in ("prompt", "prioritized"):
        with pytest.raises(ConfigError, match=f"replay.max_age=5 with replay.method={name}: it ages stored"):
            _method(name, max_age=5)
    _method("exgrpo", max_age=5)  # stored responses age: allowed


def _saved(method: ReplayMethod, groups: list[Group], replay_steps: int = 0) -> dict[str, Any]:
    buf = _buffer(method, groups, step=40)
    rng = np.random.default_rng(0)
    for step in range(41, 41 + replay_steps):
        method.questions(buf, 2, rng, step)  # what a method remembers of its replays
    return buf.state_dict()


GROUPS = [_group("a", [1, 0, 1, 0]), _group("b", [1, 0, 0, 0])]


def test_a_carried_buffer_keeps_no_step_of_the_old_runs_method_state() -> None:
    """The old prompt run replayed its questions at step 41: carried, they are ready at step 1."""
    prompt = _method("prompt")
    state = _saved(prompt, GROUPS, replay_steps=1)
    assert state["index"]["method_state"]["last_replayed"] == {"a": 41, "b": 41}
    buf = carry.carried_buffer(state, ExperienceBuffer(K))
    buf.method_state = prompt.carried(buf.method_state)
    assert buf.method_state == {} and prompt.replays(buf) is None
    assert sorted(prompt.questions(buf, 2, np.random.default_rng(0), 1)) == ["a", "b"]


@pytest.mark.parametrize(
    ("writer", "reader", "refused"),
    [
        ("exgrpo", "rlep", None),
        ("exgrpo", "prompt", None),
        ("repo", "repo", None),
        ("repo", "prompt", None),
        ("prompt", "exgrpo", "holds no stored response"),
        ("prompt", "rlep", "holds no stored response"),
        ("prompt", "repo", "holds no stored response"),
        ("repo", "exgrpo", "incorrect responses too"),
        ("exgrpo", "repo", "has no recorded reward"),
    ],
)
def test_a_method_takes_over_only_a_buffer_it_can_replay(
    writer: str, reader: str, refused: str | None
) -> None:
    state = _saved(_method(writer), GROUPS)
    method = _method(reader)
    buf = carry.carried_buffer(state, ExperienceBuffer(K))
    buf.method_state = method.carried(buf.method_state)
    reason = method.replays(buf)
    assert reason is None if refused is None else refused in (reason or "")
    if (writer, reader) == ("repo", "repo"):  # its rewards came along: it ranks by them
        cands = buf.experiences("a")
        assert sorted(method.values(buf, "a", cands, [])) == [0.0, 0.0, 1.0, 1.0]


def test_which_responses_were_stored_survives_a_save() -> None:
    buf = _buffer(_method("repo"), GROUPS)
    assert buf.holds_any
    again = ExperienceBuffer(K)
    again.load_state_dict(buf.state_dict())
    assert again.holds_any
    plain = ExperienceBuffer(K)
    plain.load_state_dict(_buffer(_method("exgrpo"), GROUPS).state_dict())
    assert not plain.holds_any and "holds_any" not in _buffer(_method("exgrpo"), GROUPS).state_dict()["index"]
