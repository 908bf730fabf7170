"""The replay buckets' indexed set, and selection from a buffer whose buckets lost members."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.indexed_set import IndexedSet
from exgrpo_cli.replay.selection import QUESTION_SELECTION


def test_indexed_set_add_remove_and_positions():
    s = IndexedSet(["a", "b", "c", "d"])
    s.add("b")  # already there: no change
    assert list(s) == ["a", "b", "c", "d"] and len(s) == 4
    s.remove("b")  # the last member fills the gap
    assert list(s) == ["a", "d", "c"] and [s.member(i) for i in range(3)] == ["a", "d", "c"]
    s.remove("c")
    s.add("e")
    assert list(s) == ["a", "d", "e"] and "c" not in s and "e" in s
    assert list(IndexedSet(list(s))) == list(s)  # rebuilding from the order restores it


def test_selection_after_removals_survives_save_and_load(tmp_path: Path):
    buf = ExperienceBuffer(group_size=4)
    for i in range(30):
        ids = np.array([i, 100 + i], dtype=np.int32)
        buf.observe_group(f"q{i}", 1 + i % 3, [(ids, np.zeros(2, np.float32))], step=1, collect=True)
    for i in range(0, 30, 4):  # retire some, move others to another bucket
        buf.observe_group(f"q{i}", 4, [], step=2, collect=True)
    for i in range(1, 30, 5):
        buf.observe_group(f"q{i}", 2, [], step=2, collect=True)
    buf.end_step()
    buf.save(str(tmp_path))
    again = ExperienceBuffer.load(str(tmp_path))
    for b in range(buf.num_buckets):
        assert again.questions_in_bucket(b) == buf.questions_in_bucket(b)
        assert [buf.question_at(b, i) for i in range(buf.bucket_sizes()[b])] == buf.questions_in_bucket(b)
    cfg = ExgrpoConfig()
    cfg.replay.sigma = 0.25
    for build in QUESTION_SELECTION.values():
        rule = build(cfg)
        a = rule(buf, 7, rng=np.random.default_rng(3))
        b = rule(again, 7, rng=np.random.default_rng(3))
        assert a == b and len(set(a)) == 7 and all(u in buf for u in a)
