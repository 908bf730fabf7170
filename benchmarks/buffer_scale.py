"""Benchmark 4: the replay buffer at scale (not a test).

    python benchmarks/buffer_scale.py [--quick] [--experiences N] [--steps N]

Fills an `ExperienceBuffer` (K=8, default buckets) with `--experiences` synthetic correct
responses (1,000,000 by default; 100,000 with --quick) whose lengths follow real math responses:
log-normal with a median of 400 tokens, clipped to 32..4096 (mean about 450). Then runs train
steps at that scale and times each buffer operation of a step:

- insert: `observe_group` for the step's 128 groups (new and already buffered questions, so
  buckets change too), with the content hashes and de-duplication;
- retire: `end_step` (questions that reached K/K leave);
- select: `QUESTION_SELECTION["gaussian"]` of 64 questions (bucket Gaussian) plus fetching their stored
  experiences (`experiences(uid)`), i.e. everything but the entropy forward.

Memory: bytes per stored token, both the buffer's array payload (`nbytes`) and the process's RSS
growth while filling (Python objects included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from exgrpo_cli.replay.buffer import ExperienceBuffer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Stat, table  # noqa: E402

K, BATCH, SELECT = 8, 128, 64


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Synth:
    """Responses as views into one shared pool: the buffer copies what it stores, so the pool's
    memory is not counted as the buffer's and no per-response allocation skews the timing."""

    def __init__(self, rng: np.random.Generator, pool_tokens: int = 1 << 24) -> None:
        self.rng = rng
        self.ids = rng.integers(0, 151_000, pool_tokens, dtype=np.int32)
        self.logp = -rng.exponential(0.3, pool_tokens).astype(np.float32)

    def response(self) -> tuple[np.ndarray, np.ndarray]:
        n = int(np.clip(self.rng.lognormal(np.log(400), 0.5), 32, 4096))
        start = int(self.rng.integers(0, len(self.ids) - n))
        return self.ids[start : start + n], self.logp[start : start + n]

    def group(self) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
        k = int(self.rng.integers(1, K + 1))  # 1..K correct; K retires the question
        return k, [self.response() for _ in range(k if k < K else 0)]


def fill(buf: ExperienceBuffer, synth: Synth, target: int) -> tuple[int, float]:
    """Grow the buffer to `target` experiences with groups of new questions; returns (steps, s)."""
    step, t0, uid = 0, time.perf_counter(), 0
    while buf.num_experiences < target:
        step += 1
        for _ in range(BATCH):
            k, correct = synth.group()
            buf.observe_group(f"q{uid}", k, correct, step=step, collect=True)
            uid += 1
        buf.end_step()
    return step, time.perf_counter() - t0


def run(quick: bool, experiences: int | None = None, steps: int | None = None) -> dict:
    from exgrpo_cli.config.schema import ExgrpoConfig
    from exgrpo_cli.replay.buffer import ExperienceBuffer
    from exgrpo_cli.replay.selection import QUESTION_SELECTION

    experiences = experiences or (100_000 if quick else 1_000_000)
    steps = steps or 20
    rng = np.random.default_rng(0)
    synth = Synth(rng)
    buf = ExperienceBuffer(K)
    rss0 = _rss_bytes()
    fill_steps, fill_s = fill(buf, synth, experiences)
    rss_growth = _rss_bytes() - rss0
    tokens, stored, payload = buf.stored_tokens, buf.num_experiences, buf.nbytes
    n_questions = buf.num_questions
    ops: dict[str, list[float]] = {"insert": [], "retire": [], "select": []}
    next_uid = 10**9
    select = QUESTION_SELECTION["gaussian"](ExgrpoConfig())  # replay.mu = 0.5, replay.sigma = 0.125
    for s in range(steps):
        step = fill_steps + 1 + s
        t0 = time.perf_counter()
        uids = select(buf, SELECT, rng=rng)
        cands = [buf.experiences(u) for u in uids]
        ops["select"].append(time.perf_counter() - t0)
        assert len(cands) == SELECT
        # half the step's groups are the replayed questions (their buckets move), half are new
        groups = [(u, *synth.group()) for u in uids] + [
            (f"q{next_uid + i}", *synth.group()) for i in range(BATCH - len(uids))
        ]
        next_uid += BATCH
        t0 = time.perf_counter()
        for uid, k, correct in groups:
            buf.observe_group(uid, k, correct, step=step, collect=True)
        ops["insert"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        buf.end_step()
        ops["retire"].append(time.perf_counter() - t0)
    return {
        "experiences": stored,
        "questions": n_questions,
        "stored_tokens": tokens,
        "mean_length": tokens / max(stored, 1),
        "fill_s": fill_s,
        "fill_steps": fill_steps,
        "steps": steps,
        "batch_groups": BATCH,
        "selected": SELECT,
        "ms": {k: Stat([x * 1000 for x in v]).as_json() for k, v in ops.items()},
        "payload_bytes_per_token": payload / tokens,
        "rss_bytes_per_token": rss_growth / tokens,
    }


def render(res: dict) -> str:
    ms = res["ms"]
    rows = [
        [f"select {res['selected']} questions + fetch their experiences", "select"],
        [f"insert: observe_group x {res['batch_groups']} (buckets updated)", "insert"],
        ["retire: end_step", "retire"],
    ]
    rows = [[name, Stat(ms[key]["values"]).fmt(".3g")] for name, key in rows]
    head = (
        f"buffer of {res['experiences']:,} experiences ({res['questions']:,} questions, "
        f"{res['stored_tokens'] / 1e6:.0f}M tokens), ms per step"
    )
    text = table([head, "ms (median, min..max)"], rows)
    return text + (
        f"\nbytes per stored token: {res['payload_bytes_per_token']:.2f} (arrays), "
        f"{res['rss_bytes_per_token']:.2f} (process RSS growth, Python objects included)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--experiences", type=int)
    p.add_argument("--steps", type=int)
    a = p.parse_args()
    res = run(a.quick, a.experiences, a.steps)
    print(render(res), file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
