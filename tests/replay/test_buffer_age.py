"""replay.max_age: experiences older than max_age steps leave the buffer before the step's replay
selection, oldest first, counted (replay/expired), through a save/load and a resume alike; a
buffer saved before the setting existed still loads (no age limit, nothing expired)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exgrpo_cli.replay import ExperienceBuffer


def _exp(*ids: int) -> tuple[np.ndarray, np.ndarray]:
    return np.array(ids, np.int32), np.full(len(ids), -1.0, np.float32)


def _filled(max_age: int, max_experiences: int = 0) -> ExperienceBuffer:
    """a: steps 1 and 3; b: step 2; c: step 4 (K = 4)."""
    buf = ExperienceBuffer(4, max_experiences=max_experiences, max_age=max_age)
    buf.observe_group("a", 2, [_exp(1)], step=1, collect=True)
    buf.observe_group("b", 1, [_exp(2)], step=2, collect=True)
    buf.observe_group("a", 2, [_exp(3)], step=3, collect=True)
    buf.observe_group("c", 3, [_exp(4)], step=4, collect=True)
    return buf


def _steps(buf: ExperienceBuffer) -> dict[str, list[int]]:
    uids = [u for b in range(buf.num_buckets) for u in buf.questions_in_bucket(b)]
    return {u: [e.step for e in buf.experiences(u)] for u in sorted(uids)}


def test_expire_drops_what_is_older_than_max_age_and_counts_it() -> None:
    buf = _filled(max_age=2)
    assert buf.expire(4) == 1  # step 1 is 3 steps before step 4: a loses its oldest
    assert _steps(buf) == {"a": [3], "b": [2], "c": [4]}
    assert buf.expire(5) == 1  # b (step 2) goes, and with it the question
    assert "b" not in buf and buf.bucket_sizes() == [0, 1, 1]
    assert buf.expire(5) == 0
    assert buf.metrics()["replay/expired"] == 2.0
    # every replay candidate left is at most max_age old
    assert all(5 - s <= 2 for steps in _steps(buf).values() for s in steps)


def test_no_age_limit_by_default() -> None:
    buf = _filled(max_age=0)
    assert buf.expire(100) == 0 and buf.num_experiences == 4
    assert "replay/expired" not in buf.metrics()  # the default run logs no such key


def test_age_and_count_caps_share_one_oldest_first_order() -> None:
    buf = _filled(max_age=3, max_experiences=3)  # the count cap already took step 1
    assert _steps(buf) == {"a": [3], "b": [2], "c": [4]}
    assert buf.expire(6) == 1 and _steps(buf) == {"a": [3], "c": [4]}


def test_max_age_survives_save_load_and_a_resume(tmp_path: Path) -> None:
    buf = _filled(max_age=2)
    buf.expire(4)
    buf.save(str(tmp_path / "b"))
    loaded = ExperienceBuffer.load(str(tmp_path / "b"))
    assert loaded.max_age == 2 and loaded.metrics()["replay/expired"] == 1.0
    resumed = ExperienceBuffer(4, max_age=2)  # a resumed run: its config, then the checkpoint's state
    resumed.load_state_dict(buf.state_dict())
    for b in (buf, loaded, resumed):
        assert b.expire(5) == 1
    assert _steps(buf) == _steps(loaded) == _steps(resumed) == {"a": [3], "c": [4]}
    assert buf.digest() == loaded.digest() == resumed.digest()
    assert resumed.metrics()["replay/expired"] == 2.0


def test_a_buffer_saved_before_max_age_still_loads(tmp_path: Path) -> None:
    buf = _filled(max_age=0)
    buf.save(str(tmp_path / "old"))
    index_file = tmp_path / "old" / "index.json"
    index = json.loads(index_file.read_text())
    del index["max_age"], index["expired"]  # what an older exgrpo wrote
    index_file.write_text(json.dumps(index))
    old = ExperienceBuffer.load(str(tmp_path / "old"))
    assert old.max_age == 0 and old.num_experiences == 4 and old.digest() == buf.digest()


def test_a_negative_max_age_is_refused() -> None:
    with pytest.raises(ValueError, match="replay.max_age"):
        ExperienceBuffer(4, max_age=-1)
