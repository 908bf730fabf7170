"""Exact values for the pure selection rules (docs/algorithm.md §3)."""

import numpy as np
import pytest

from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.replay import (
    QUESTION_SELECTION,
    ExperienceBuffer,
    bucket_probabilities,
    gaussian_weights,
    n_replay,
    sample_bucket_counts,
)


def select_questions(
    buf: ExperienceBuffer, n: int, *, mode: str, mu: float, sigma: float, rng: np.random.Generator
) -> list[str]:
    """The rule `mode` as the trainer builds it from a config with these replay.mu, replay.sigma."""
    cfg = ExgrpoConfig()
    cfg.replay.mu, cfg.replay.sigma = mu, sigma
    return QUESTION_SELECTION[mode](cfg)(buf, n, rng=rng)


K8_CENTRES = [k / 8 for k in range(1, 8)]
OFFICIAL_K8 = [0.0044, 0.0540, 0.2420, 0.3989, 0.2420, 0.0540, 0.0044]


def test_gaussian_weights_are_the_official_pdf_values():
    w = gaussian_weights(K8_CENTRES, 0.5, 0.125)
    assert np.round(w, 4).tolist() == OFFICIAL_K8
    # count scale (mu = K/2, sigma = 1) gives the same numbers
    assert np.allclose(gaussian_weights(range(1, 8), 4.0, 1.0), w)


def test_bucket_probabilities_k8_exact():
    p = bucket_probabilities(K8_CENTRES, [True] * 7, 0.5, 0.125)
    assert sum(p) == pytest.approx(1.0, abs=1e-12)
    # normalising the pdf values (sum 0.99973) moves only the centre in the 4th decimal
    assert np.round(p, 4).tolist() == [0.0044, 0.0540, 0.2420, 0.3991, 0.2420, 0.0540, 0.0044]
    assert np.round(p, 3).tolist() == np.round(OFFICIAL_K8, 3).tolist()
    assert p == pytest.approx(np.array(gaussian_weights(K8_CENTRES, 0.5, 0.125)) / 0.99972936, abs=1e-8)
    # the accuracy-scale and count-scale readings agree
    assert bucket_probabilities(range(1, 8), [True] * 7, 4.0, 1.0) == pytest.approx(p, abs=1e-12)


def test_bucket_probabilities_empty_buckets():
    assert bucket_probabilities(K8_CENTRES, [False] * 7, 0.5, 0.125) == [0.0] * 7
    nonempty = [True, False, False, True, False, True, False]
    p = bucket_probabilities(K8_CENTRES, nonempty, 0.5, 0.125)
    assert [x == 0 for x in p] == [not f for f in nonempty]
    assert sum(p) == pytest.approx(1.0)
    w = gaussian_weights(K8_CENTRES, 0.5, 0.125)
    assert p[3] == pytest.approx(w[3] / (w[0] + w[3] + w[5]))
    # a very narrow sigma must not underflow the only non-empty bucket to 0
    assert bucket_probabilities(K8_CENTRES, [True] + [False] * 6, 0.5, 1e-4) == [1.0] + [0.0] * 6
    # the paper's reading (sigma 1 on the accuracy scale) is nearly uniform
    assert max(bucket_probabilities(K8_CENTRES, [True] * 7, 0.5, 1.0)) < 1 / 7 + 0.01
    with pytest.raises(ValueError):
        bucket_probabilities(K8_CENTRES, [True] * 6, 0.5, 0.125)
    with pytest.raises(ValueError):
        bucket_probabilities(K8_CENTRES, [True] * 7, 0.5, 0.0)


def test_sample_bucket_counts_redistributes_excess_exactly():
    # Whatever the draws: buckets 0 and 1 (weight .5 each) fill to 1, the rest overflows into
    # the zero-weight bucket 2, the only one with room.
    for seed in range(20):
        rng = np.random.default_rng(seed)
        assert sample_bucket_counts(4, [0.5, 0.5, 0.0], [1, 1, 10], rng) == [1, 1, 2]
    rng = np.random.default_rng(0)
    assert sample_bucket_counts(3, [0.2, 0.3, 0.5], [5, 0, 0], rng) == [3, 0, 0]
    assert sample_bucket_counts(30, [0.25, 0.25, 0.5], [10, 10, 0], rng) == [10, 10, 0]
    assert sample_bucket_counts(0, [0.5, 0.5], [3, 3], rng) == [0, 0]


def test_sample_bucket_counts_excess_goes_in_proportion_to_weights():
    # Bucket 0 holds one question but is asked for ~8 of 10: its excess is split 2:1.
    rng = np.random.default_rng(1)
    draws = np.array(
        [sample_bucket_counts(10, [0.8, 0.2 * 2 / 3, 0.2 / 3], [1, 50, 50], rng) for _ in range(2000)]
    )
    assert (draws.sum(axis=1) == 10).all() and (draws[:, 0] == 1).all()
    assert draws[:, 1].mean() / draws[:, 2].mean() == pytest.approx(2.0, rel=0.05)


def test_sample_bucket_counts_capacity_and_reproducibility():
    rng = np.random.default_rng(123)
    for _ in range(200):
        caps = rng.integers(0, 6, size=5).tolist()
        probs = rng.dirichlet(np.ones(5)).tolist()
        n = int(rng.integers(0, 30))
        counts = sample_bucket_counts(n, probs, caps, rng)
        assert sum(counts) == min(n, sum(caps))
        assert all(0 <= c <= cap for c, cap in zip(counts, caps))
    a = sample_bucket_counts(20, [0.1, 0.6, 0.3], [4, 8, 20], np.random.default_rng(7))
    b = sample_bucket_counts(20, [0.1, 0.6, 0.3], [4, 8, 20], np.random.default_rng(7))
    assert a == b
    with pytest.raises(ValueError):
        sample_bucket_counts(2, [0.5, 0.5], [1], rng)


def _toy_buffer() -> ExperienceBuffer:
    """K=4: 3 questions in bucket 0 (k=1), 4 in bucket 1 (k=2), 2 in bucket 2 (k=3)."""
    buf = ExperienceBuffer(group_size=4)
    for i, k in enumerate([1, 1, 1, 2, 2, 2, 2, 3, 3]):
        ids = np.array([i, 100 + i], dtype=np.int32)
        buf.observe_group(f"q{i}", k, [(ids, np.zeros(2, np.float32))], step=1, collect=True)
    buf.end_step()
    return buf


def test_select_questions_gaussian_seeded_exact():
    buf = _toy_buffer()
    picked = select_questions(buf, 4, mode="gaussian", mu=0.5, sigma=0.25, rng=np.random.default_rng(0))
    assert picked == ["q0", "q6", "q3", "q7"]  # grouped by bucket: k=1, k=2, k=2, k=3
    # sigma 1/K: the k=2 bucket (4 questions) takes all four
    narrow = select_questions(buf, 4, mode="gaussian", mu=0.5, sigma=0.125, rng=np.random.default_rng(0))
    assert narrow == ["q5", "q4", "q6", "q3"]
    # asking for more than is buffered returns every question once
    everything = select_questions(buf, 50, mode="gaussian", mu=0.5, sigma=0.125, rng=np.random.default_rng(0))
    assert sorted(everything) == sorted(f"q{i}" for i in range(9))


def test_select_questions_gaussian_prefers_the_centre():
    buf = _toy_buffer()
    rng = np.random.default_rng(5)
    hits = {f"q{i}": 0 for i in range(9)}
    for _ in range(500):
        for uid in select_questions(buf, 1, mode="gaussian", mu=0.5, sigma=0.125, rng=rng):
            hits[uid] += 1
    middle = sum(hits[f"q{i}"] for i in range(3, 7)) / 500
    # K=4 centres .25 .5 .75 sit at z = -2, 0, 2
    assert middle == pytest.approx(0.3989 / (0.3989 + 2 * 0.0540), abs=0.05)


def test_select_questions_uniform_and_errors():
    buf = _toy_buffer()
    picked = select_questions(buf, 5, mode="uniform", mu=0.5, sigma=0.125, rng=np.random.default_rng(0))
    assert picked == ["q3", "q6", "q2", "q8", "q4"]
    assert len(set(picked)) == 5
    assert select_questions(buf, 0, mode="uniform", mu=0.5, sigma=0.125, rng=np.random.default_rng(0)) == []
    assert (
        select_questions(
            ExperienceBuffer(4), 3, mode="gaussian", mu=0.5, sigma=0.125, rng=np.random.default_rng(0)
        )
        == []
    )


@pytest.mark.parametrize("mode", list(QUESTION_SELECTION))
def test_selection_is_a_function_of_the_seed_and_the_buffer(mode: str):
    """Other seeds pick other questions; the same seed picks the same ones from a buffer built
    afresh and from one restored from its state dict (what a resumed run selects from)."""
    buf = _toy_buffer()
    by_seed = [
        select_questions(buf, 4, mode=mode, mu=0.5, sigma=0.25, rng=np.random.default_rng(s))
        for s in range(8)
    ]
    assert len({tuple(p) for p in by_seed}) > 1
    restored = ExperienceBuffer(group_size=4)
    restored.load_state_dict(_toy_buffer().state_dict())
    for other in (_toy_buffer(), restored):
        again = [
            select_questions(other, 4, mode=mode, mu=0.5, sigma=0.25, rng=np.random.default_rng(s))
            for s in range(8)
        ]
        assert again == by_seed


def test_n_replay():
    assert n_replay(0.5, 64, 100) == 32
    assert n_replay(0.5, 64, 10) == 10
    assert n_replay(0.5, 7, 100) == 3
    assert n_replay(0.29, 100, 100) == 29  # float error must not floor to 28
    assert n_replay(0.0, 64, 100) == 0
    assert n_replay(0.75, 128, 0) == 0
    with pytest.raises(ValueError):
        n_replay(1.5, 64, 10)
