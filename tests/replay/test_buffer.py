"""The experience buffer's rules (docs/algorithm.md §2), driven step by step as the loop drives it."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.types import Question
from exgrpo_cli.replay import QUESTION_SELECTION, ExperienceBuffer, bucket_probabilities
from exgrpo_cli.replay.mixing import Group, Response


def resp(*tokens: int, logp: float = -0.5):
    return np.array(tokens, dtype=np.int64), np.full(len(tokens), logp, dtype=np.float64)


def stored_tokens(buf: ExperienceBuffer, uid: str) -> list[list[int]]:
    return [e.response_ids.tolist() for e in buf.experiences(uid)]


def scripted_buffer() -> ExperienceBuffer:
    """K=4, default edges: buckets 0/1/2 hold k = 1/2/3."""
    buf = ExperienceBuffer(group_size=4)
    # step 1, before the delayed start
    buf.observe_group("easy", 4, [resp(1), resp(2), resp(3), resp(4)], step=1, collect=False)
    buf.observe_group("mid", 2, [resp(5, 6), resp(7)], step=1, collect=False)
    assert buf.retired == set() and buf.num_questions == 0  # retirement waits for end_step
    assert buf.end_step() == ["easy"]
    # step 2, collecting
    buf.observe_group("q1", 1, [resp(10, 11)], step=2, collect=True)
    buf.observe_group("q2", 3, [resp(20, 21), resp(20, 21, logp=-0.1), resp(22)], step=2, collect=True)
    buf.observe_group("q3", 2, [resp(30), resp(31, 32, 33)], step=2, collect=True)
    buf.observe_group("mid", 2, [resp(5, 6)], step=2, collect=True)
    buf.observe_group("easy", 2, [resp(1, 9)], step=2, collect=True)  # retired: ignored
    buf.observe_group("none", 0, [], step=2, collect=True)
    buf.end_step()
    # step 3
    buf.observe_group("q1", 0, [], step=3, collect=True)  # k=0 keeps its bucket
    buf.observe_group("q3", 3, [resp(30), resp(34)], step=3, collect=True)  # k 2 -> 3; 30 is stored
    buf.observe_group("q2", 4, [resp(23)], step=3, collect=True)  # all correct: retires at end_step
    assert "q2" in buf and not buf.is_retired("q2")
    buf.end_step()
    return buf


def test_scripted_steps():
    buf = scripted_buffer()
    assert buf.retired == {"easy", "q2"}
    assert "q2" not in buf and "easy" not in buf and "none" not in buf
    with pytest.raises(KeyError):
        buf.experiences("q2")
    assert buf.questions_in_bucket(0) == ["q1"]
    assert buf.questions_in_bucket(1) == ["mid"]
    assert buf.questions_in_bucket(2) == ["q3"]
    assert buf.bucket_sizes() == [1, 1, 1]
    assert stored_tokens(buf, "q3") == [[30], [31, 32, 33], [34]]
    assert [e.step for e in buf.experiences("q3")] == [2, 2, 3]
    assert stored_tokens(buf, "mid") == [[5, 6]]  # nothing from step 1 (before the start)
    assert buf.num_questions == 3 and buf.num_experiences == 5 and buf.stored_tokens == 9
    e = buf.experiences("q1")[0]
    assert e.response_ids.dtype == np.int32 and e.behavior_logp.dtype == np.float32
    assert e.behavior_logp.tolist() == [-0.5, -0.5]
    with pytest.raises(ValueError):
        e.response_ids[0] = 3  # read-only view into the buffer
    assert buf.metrics() == {
        "replay/buffer_questions": 3.0,
        "replay/buffer_experiences": 5.0,
        "replay/buffer_tokens": 9.0,
        "replay/buffer_mb": (8 * 9 + 32 * 5) / 2**20,
        "replay/retired": 2.0,
        "replay/readmitted": 0.0,
        "replay/bucket/1": 1.0,
        "replay/bucket/2": 1.0,
        "replay/bucket/3": 1.0,
    }
    cfg = ExgrpoConfig()  # replay.mu = 0.5, replay.sigma = 0.125
    picked = QUESTION_SELECTION["gaussian"](cfg)(buf, 2, rng=np.random.default_rng(0))
    assert picked == ["mid", "q3"]
    assert QUESTION_SELECTION["uniform"](cfg)(buf, 2, rng=np.random.default_rng(0)) == ["mid", "q3"]


def test_duplicates_stored_once_and_hash_is_exact():
    buf = ExperienceBuffer(group_size=8)
    buf.observe_group("q", 3, [resp(1, 2, 3), resp(1, 2, 3, logp=-9.0), resp(1, 2)], step=5, collect=True)
    assert stored_tokens(buf, "q") == [[1, 2, 3], [1, 2]]
    assert buf.experiences("q")[0].behavior_logp.tolist() == [-0.5] * 3  # the first copy is kept
    buf.observe_group("q", 2, [resp(1, 2)], step=6, collect=True)
    assert buf.num_experiences == 2 and buf.questions_in_bucket(1) == ["q"]
    buf.observe_group("other", 1, [resp(1, 2)], step=6, collect=True)  # dedupe is per question
    assert buf.num_experiences == 3


def test_replayed_group_counts_replayed_response():
    buf = ExperienceBuffer(group_size=4)
    buf.observe_group("q", 1, [resp(1)], step=1, collect=True)
    # replayed: K-1 fresh responses all wrong, the replayed one right -> k = 1, nothing new
    buf.observe_group("q", 1, [], step=2, collect=True)
    assert buf.num_experiences == 1 and buf.questions_in_bucket(0) == ["q"]
    # a question with no stored response never enters the buffer
    buf.observe_group("fresh", 2, [], step=2, collect=True)
    assert "fresh" not in buf


def test_invalid_groups_are_refused():
    buf = ExperienceBuffer(group_size=4)
    with pytest.raises(ValueError):
        buf.observe_group("q", 5, [], step=1, collect=True)
    with pytest.raises(ValueError):
        buf.observe_group("q", 1, [resp(1), resp(2)], step=1, collect=True)
    with pytest.raises(ValueError):
        buf.observe_group("q", 1, [(np.array([1, 2]), np.array([0.0]))], step=1, collect=True)
    with pytest.raises(ValueError):
        buf.observe_group("q", 1, [resp()], step=1, collect=True)
    with pytest.raises(ValueError):
        ExperienceBuffer(group_size=4, bucket_edges=[0.75, 0.25])
    with pytest.raises(ValueError):
        ExperienceBuffer(group_size=1)


def test_readmission():
    buf = scripted_buffer()
    assert buf.readmit(0.0, np.random.default_rng(0)) == []
    back = buf.readmit(0.5, np.random.default_rng(0))
    assert len(back) == 1 and back[0] in {"easy", "q2"}
    assert buf.retired == {"easy", "q2"} - set(back)
    assert buf.readmit(1.0, np.random.default_rng(0)) == sorted({"easy", "q2"} - set(back))
    assert buf.retired == set()
    assert buf.metrics()["replay/readmitted"] == 2.0  # the run's total, kept through a checkpoint
    copy = ExperienceBuffer(group_size=buf.group_size)
    copy.load_state_dict(buf.state_dict())
    assert copy.metrics()["replay/readmitted"] == 2.0
    # a readmitted question can be collected again
    buf.observe_group("q2", 2, [resp(20, 21)], step=4, collect=True)
    assert stored_tokens(buf, "q2") == [[20, 21]]


def test_default_and_custom_buckets():
    buf = ExperienceBuffer(group_size=8)
    assert buf.bucket_centres() == [k / 8 for k in range(1, 8)]
    assert [buf.bucket_of_count(k) for k in range(1, 8)] == list(range(7))
    with pytest.raises(ValueError):
        buf.bucket_of_count(8)
    # the paper's easy/medium/hard split, 0-25-75-100%: [0, .25) [.25, .75) [.75, 1]
    split = ExperienceBuffer(group_size=8, bucket_edges=[0.25, 0.75])
    assert [split.bucket_of_count(k) for k in range(1, 8)] == [0, 1, 1, 1, 1, 2, 2]
    assert split.bucket_centres() == [0.125, 0.4375, 0.8125]
    # K=4: counts 1, 2 land in the middle range; the lowest range holds no count
    k4 = ExperienceBuffer(group_size=4, bucket_edges=[0.25, 0.75])
    assert [k4.bucket_of_count(k) for k in (1, 2, 3)] == [1, 1, 2]
    assert k4.bucket_centres() == [0.125, 0.375, 0.75]
    for i, k in enumerate([1, 2, 3, 3]):
        k4.observe_group(f"q{i}", k, [resp(i)], step=1, collect=True)
    assert k4.bucket_sizes() == [0, 2, 2]
    assert k4.metrics()["replay/bucket/1"] == 0.0
    probs = bucket_probabilities(k4.bucket_centres(), [s > 0 for s in k4.bucket_sizes()], 0.5, 0.125)
    assert probs[0] == 0.0 and sum(probs) == pytest.approx(1.0)


def _busy_buffer(max_experiences: int = 0) -> ExperienceBuffer:
    rng = np.random.default_rng(0)
    buf = ExperienceBuffer(group_size=8, max_experiences=max_experiences)
    for step in range(1, 6):
        for q in range(40):
            k = int(rng.integers(0, 9))
            correct = [
                (rng.integers(0, 50, size=int(rng.integers(1, 6))), rng.normal(size=1))
                for _ in range(min(k, 3))
            ]
            correct = [(ids, np.full(len(ids), lp[0])) for ids, lp in correct]
            buf.observe_group(f"q{q}", k, correct, step=step, collect=step > 1)
        buf.end_step()
    buf.observe_group("q0", 8, [], step=6, collect=True)  # pending at save time
    return buf


def _assert_same(a: ExperienceBuffer, b: ExperienceBuffer) -> None:
    assert a.metrics() == b.metrics() and a.retired == b.retired
    # the running checksum (kept through partial cap evictions) equals the one recomputed at load
    assert a.checksum == b.checksum
    assert [a.questions_in_bucket(i) for i in range(a.num_buckets)] == [
        b.questions_in_bucket(i) for i in range(b.num_buckets)
    ]
    for i in range(a.num_buckets):
        for uid in a.questions_in_bucket(i):
            for x, y in zip(a.experiences(uid), b.experiences(uid), strict=True):
                assert np.array_equal(x.response_ids, y.response_ids) and x.step == y.step
                assert np.array_equal(x.behavior_logp, y.behavior_logp)
    for mode in ("gaussian", "uniform"):
        rule = QUESTION_SELECTION[mode](ExgrpoConfig())
        sel = [rule(buf, 10, rng=np.random.default_rng(3)) for buf in (a, b)]
        assert sel[0] == sel[1] and len(sel[0]) == 10
    assert a.readmit(0.5, np.random.default_rng(1)) == b.readmit(0.5, np.random.default_rng(1))
    assert a.end_step() == b.end_step()


def test_save_load_round_trip_is_exact(tmp_path: Path):
    buf = _busy_buffer()
    assert buf.num_questions > 10 and len(buf.retired) > 0
    buf.save(str(tmp_path / "buf"))
    assert sorted(os.listdir(tmp_path / "buf")) == ["experiences.safetensors", "index.json"]
    index = json.loads((tmp_path / "buf" / "index.json").read_text())
    assert index["pending_retire"] == ["q0"]
    loaded = ExperienceBuffer.load(str(tmp_path / "buf"))
    twin = ExperienceBuffer(group_size=8)
    twin.load_state_dict(buf.state_dict())
    state = buf.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state["arrays"].values())
    assert json.loads(json.dumps(state["index"])) == state["index"]
    _assert_same(buf, twin)  # consumes nothing: each call gets its own rng
    _assert_same(ExperienceBuffer.load(str(tmp_path / "buf")), loaded)
    with pytest.raises(ValueError, match="group size"):
        ExperienceBuffer(group_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="bucket_edges"):
        ExperienceBuffer(group_size=8, bucket_edges=[0.5]).load_state_dict(state)


def test_byte_accounting_is_about_8_bytes_per_token():
    rng = np.random.default_rng(0)
    buf = ExperienceBuffer(group_size=8)
    for q in range(50):
        correct = [resp(*rng.integers(0, 32000, size=500).tolist()) for _ in range(4)]
        buf.observe_group(f"q{q}", 4, correct, step=1, collect=True)
    assert buf.stored_tokens == 50 * 4 * 500
    assert buf.nbytes == 8 * buf.stored_tokens + 32 * buf.num_experiences
    assert 8.0 <= buf.nbytes / buf.stored_tokens < 8.1


def test_cap_evicts_oldest_first():
    buf = ExperienceBuffer(group_size=4, max_experiences=3)
    buf.observe_group("a", 2, [resp(1), resp(2)], step=1, collect=True)
    buf.observe_group("b", 1, [resp(3)], step=2, collect=True)
    buf.observe_group("c", 1, [resp(4)], step=3, collect=True)  # 4 > 3: a's oldest goes
    assert stored_tokens(buf, "a") == [[2]] and buf.num_experiences == 3
    buf.observe_group("d", 3, [resp(5), resp(6)], step=4, collect=True)  # a's last and b go
    assert "a" not in buf and "b" not in buf
    assert buf.bucket_sizes() == [1, 0, 1] and buf.num_experiences == 3
    assert stored_tokens(buf, "c") == [[4]] and stored_tokens(buf, "d") == [[5], [6]]
    buf.observe_group("c", 2, [resp(7)], step=5, collect=True)  # c's old one goes, c stays (bucket 1)
    assert stored_tokens(buf, "c") == [[7]] and buf.questions_in_bucket(1) == ["c"]
    assert buf.num_experiences == 3 and buf.stored_tokens == 3


def test_cap_survives_churn_and_reload(tmp_path: Path):
    buf = _busy_buffer(max_experiences=25)
    assert buf.num_experiences == 25
    buf.save(str(tmp_path / "b"))
    loaded = ExperienceBuffer.load(str(tmp_path / "b"))
    _assert_same(buf, loaded)
    for b in (buf, loaded):
        b.observe_group("new", 1, [resp(99, 98)], step=9, collect=True)
    _assert_same(buf, loaded)
    assert stored_tokens(loaded, "new") == [[99, 98]] and loaded.num_experiences == 25


def _exp(*ids: int, logp: float = -1.0) -> tuple[np.ndarray, np.ndarray]:
    return np.array(ids, np.int32), np.full(len(ids), logp, np.float32)


def test_checksum_covers_stored_values_not_order(tmp_path: Path) -> None:
    a, b = ExperienceBuffer(4), ExperienceBuffer(4)
    a.observe_group("x", 2, [_exp(1, 2), _exp(3)], step=1, collect=True)
    a.observe_group("y", 1, [_exp(5, 6)], step=1, collect=True)
    b.observe_group("y", 1, [_exp(5, 6)], step=1, collect=True)
    b.observe_group("x", 2, [_exp(3), _exp(1, 2)], step=1, collect=True)
    assert a.checksum == b.checksum != ExperienceBuffer(4).checksum
    c = ExperienceBuffer(4)  # the same tokens with one stored log-prob off by 1e-6
    c.observe_group("x", 2, [_exp(1, 2), _exp(3)], step=1, collect=True)
    c.observe_group("y", 1, [_exp(5, 6, logp=-1.000001)], step=1, collect=True)
    assert c.checksum != a.checksum
    a.save(str(tmp_path / "r"))
    assert ExperienceBuffer.load(str(tmp_path / "r")).checksum == a.checksum
    a.observe_group("y", 4, [], step=2, collect=True)  # y solved by the whole group: retired
    a.end_step()
    only_x = ExperienceBuffer(4)
    only_x.observe_group("x", 2, [_exp(1, 2), _exp(3)], step=1, collect=True)
    assert a.checksum == only_x.checksum


def test_checksum_follows_cap_eviction() -> None:
    capped = ExperienceBuffer(4, max_experiences=2)
    for step, ids in enumerate([(1,), (2,), (3,)], start=1):
        capped.observe_group(f"q{step}", 1, [_exp(*ids)], step=step, collect=True)
    survivors = ExperienceBuffer(4)
    survivors.observe_group("q2", 1, [_exp(2)], step=2, collect=True)
    survivors.observe_group("q3", 1, [_exp(3)], step=3, collect=True)
    assert capped.num_experiences == 2 and capped.checksum == survivors.checksum


def test_digest_is_the_content_that_ranks_must_share(tmp_path: Path) -> None:
    """Equal content, equal digest, also through a save/load round trip; a stored log-prob, a
    retirement or a bucket move changes it."""

    def filled(logp: float = -1.0) -> ExperienceBuffer:
        buf = ExperienceBuffer(4)
        buf.observe_group("x", 2, [_exp(1, 2), _exp(3)], step=1, collect=True)
        buf.observe_group("y", 1, [_exp(5, 6, logp=logp)], step=1, collect=True)
        return buf

    a = filled()
    a.save(str(tmp_path / "r"))
    assert a.digest() == filled().digest() == ExperienceBuffer.load(str(tmp_path / "r")).digest()
    assert filled(logp=-1.000001).digest() != a.digest()
    moved = filled()
    moved.observe_group("y", 3, [], step=2, collect=True)  # bucket of k=1 -> k=3, nothing new stored
    assert moved.checksum == a.checksum and moved.digest() != a.digest()
    retired = filled()
    retired.observe_group("z", 4, [], step=2, collect=True)  # never stored, but retired
    retired.end_step()
    assert retired.num_questions == a.num_questions and retired.digest() != a.digest()


def _scored(uid: str, rewards: list[float], replayed: bool = False, engine_logp: bool = True) -> Group:
    """One group; response j is token [10 * len(uid) + j] with engine log-prob -j - 1 (or none)."""
    responses = [
        Response([10 * len(uid) + j], [-j - 1.0] if engine_logp else None, reward=r)
        for j, r in enumerate(rewards)
    ]
    if replayed:  # the replayed experience is correct but never stored again
        responses[-1].replayed = True
    return Group(Question(uid, uid, "1"), [1], responses)


def test_storable_is_the_fresh_correct_responses_of_the_collected_groups() -> None:
    groups = [
        _scored("a", [1, 0, 1, 0]),  # k = 2: collected
        _scored("bb", [1, 1, 1, 1]),  # k = K: retires, nothing stored
        _scored("ccc", [0, 1, 0, 1], replayed=True),  # k = 2, the replayed response is not stored
        _scored("dddd", [0, 0, 0, 0]),
    ]
    assert ExperienceBuffer.storable(groups, (0, 3)) == [(0, 0), (0, 2), (2, 1)]
    assert ExperienceBuffer.storable(groups, (1, 3)) == [(0, 0), (0, 2), (2, 1)]  # k=2 > lbound 1
    assert ExperienceBuffer.storable(groups, (2, 3)) == []
    assert ExperienceBuffer.storable(groups, None) == []  # before the delayed start


def test_observe_groups_stores_the_storable_responses_with_the_given_logprobs() -> None:
    groups = [_scored("a", [1, 0, 1, 0]), _scored("bb", [1, 1, 1, 1]), _scored("ccc", [0, 1, 0, 0])]
    trainer = ExperienceBuffer(4)
    logp = {
        key: np.full(1, -0.25 * (i + 1), np.float32) for i, key in enumerate(trainer.storable(groups, (0, 3)))
    }
    trainer.observe_groups(groups, step=1, bounds=(0, 3), logprobs=logp)
    assert [e.behavior_logp.tolist() for e in trainer.experiences("a")] == [[-0.25], [-0.5]]
    assert [e.behavior_logp.tolist() for e in trainer.experiences("ccc")] == [[-0.75]]
    trainer.end_step()
    assert trainer.is_retired("bb")
    engine = ExperienceBuffer(4)
    engine.observe_groups(groups, step=1, bounds=(0, 3), logprobs=None)  # the engine's log-probs
    assert [e.behavior_logp.tolist() for e in engine.experiences("a")] == [[-1.0], [-3.0]]
    silent = ExperienceBuffer(4)  # an engine that gives no log-probs: nothing to weight a replay with
    silent.observe_groups([_scored("a", [1, 0, 1, 0], engine_logp=False)], 1, (0, 3), None)
    assert silent.num_experiences == 0
    before = ExperienceBuffer(4)
    before.observe_groups(groups, step=1, bounds=None, logprobs=None)
    before.end_step()
    assert before.num_questions == 0 and before.is_retired("bb")  # K/K retires before the start too
