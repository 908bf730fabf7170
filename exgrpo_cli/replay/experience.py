"""One question's stored experiences: their arrays, their hashes, and the check that keeps a
response from being stored twice (docs/algorithm.md §2).

Place in the train step: after the rollouts of a step are scored, ``ExperienceBuffer.observe_group``
passes a group's new correct responses through ``new_responses`` and appends the survivors to the
question's ``StoredQuestion``. At the start of the next step ``ExperienceBuffer.experiences`` hands
the trajectory selection (replay/trajectory.py) ``Experience`` views of those arrays. What to keep,
evict or retire is the buffer's business (replay/buffer.py); this module only knows one question.

Storage. A question owns three numpy arrays: its responses' token ids concatenated (int32),
their behaviour log-probs (float32) and one int64 row of meta per experience
(length, collection step, content hash, insertion number; the columns are the on-disk layout of
replay/persistence.py). That is 8 bytes per token plus 32 bytes per experience of array payload,
plus a few hundred bytes of Python objects per question.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from exgrpo_cli.replay.persistence import META_HASH, META_LEN, META_STEP

META_BYTES = 4 * 8  # int64 meta row per experience


@dataclass(frozen=True)
class Experience:
    """One stored correct response. The arrays are read-only views into the buffer."""

    response_ids: np.ndarray  # int32 [T]
    behavior_logp: np.ndarray  # float32 [T], log-probs under pi_old of the collection step
    step: int  # train step that collected it


class StoredQuestion:
    """The experiences of one buffered question, oldest first, and the bucket it sits in."""

    # __slots__: a million-question buffer pays a few hundred bytes per question, not a dict each
    __slots__ = ("bucket", "ids", "logp", "meta")

    def __init__(self, bucket: int, ids: np.ndarray, logp: np.ndarray, meta: np.ndarray) -> None:
        self.bucket = bucket
        self.ids = ids
        self.logp = logp
        self.meta = meta

    def holds(self, ids: np.ndarray, h: int) -> bool:
        """Whether a response with token ids ``ids`` (content hash ``h``) is already stored."""
        hits = np.flatnonzero(self.meta[:, META_HASH] == h)
        if hits.size == 0:
            return False
        starts = np.concatenate([[0], np.cumsum(self.meta[:, META_LEN])])
        # Compare the bytes too: a 64-bit hash collision must not drop a distinct response.
        return any(np.array_equal(self.ids[starts[i] : starts[i + 1]], ids) for i in hits)

    def value_hashes(self, n: int | None = None) -> int:
        """Sum of the value hashes of the first n experiences (all when None)."""
        ends = np.cumsum(self.meta[:, META_LEN]).tolist()[:n]
        starts = [0, *ends[:-1]]
        return sum(value_hash(self.ids[a:b], self.logp[a:b]) for a, b in zip(starts, ends))

    def experiences(self) -> list[Experience]:
        """The stored experiences, oldest first, as read-only views (no token data is copied)."""
        starts = np.concatenate([[0], np.cumsum(self.meta[:, META_LEN])]).tolist()
        out = []
        for i in range(len(self.meta)):
            ids, logp = self.ids[starts[i] : starts[i + 1]], self.logp[starts[i] : starts[i + 1]]
            ids.flags.writeable = False
            logp.flags.writeable = False
            out.append(Experience(ids, logp, int(self.meta[i, META_STEP])))
        return out


def value_hash(ids: np.ndarray, logp: np.ndarray) -> int:
    """64-bit hash of one experience's tokens and stored log-probs, for the buffer's checksum."""
    digest = hashlib.blake2b(ids.tobytes() + logp.tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def content_hash(ids: np.ndarray) -> int:
    # blake2b, not hash(): it must be stable across processes for the saved index to stay valid.
    digest = hashlib.blake2b(ids.tobytes(), digest_size=8).digest()
    return int(np.frombuffer(digest, dtype="<i8")[0])


def new_responses(
    q: StoredQuestion | None, correct: Sequence[tuple[np.ndarray, np.ndarray]]
) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """Validated responses not already stored for this question (nor repeated within the group)."""
    ids_out: list[np.ndarray] = []
    logp_out: list[np.ndarray] = []
    hashes: list[int] = []
    for raw_ids, raw_logp in correct:
        ids = np.ascontiguousarray(raw_ids, dtype=np.int32)
        logp = np.ascontiguousarray(raw_logp, dtype=np.float32)
        if ids.ndim != 1 or ids.shape != logp.shape or ids.size == 0:
            raise ValueError(
                f"a response needs 1-D non-empty ids and log-probs of equal length "
                f"(got {ids.shape} and {logp.shape})"
            )
        h = content_hash(ids)
        if any(h == h2 and np.array_equal(ids, a) for a, h2 in zip(ids_out, hashes)):
            continue
        if q is not None and q.holds(ids, h):
            continue
        ids_out.append(ids)
        logp_out.append(logp)
        hashes.append(h)
    return ids_out, logp_out, hashes


def pack_questions(qs: Sequence[StoredQuestion]) -> dict[str, np.ndarray]:
    """The questions' arrays end to end, the layout of the buffer's state (replay/persistence.py);
    copies the token data once."""
    return {
        "response_ids": np.concatenate([np.empty(0, np.int32)] + [q.ids for q in qs]),
        "behavior_logp": np.concatenate([np.empty(0, np.float32)] + [q.logp for q in qs]),
        "meta": np.concatenate([np.empty((0, 4), np.int64)] + [q.meta for q in qs]),
        "experience_counts": np.array([len(q.meta) for q in qs], dtype=np.int64),
    }


def unpack_questions(
    buckets: Sequence[int], ids: np.ndarray, logp: np.ndarray, meta: np.ndarray, counts: np.ndarray
) -> list[StoredQuestion]:
    """`pack_questions` undone, one question per entry of `buckets` (its bucket)."""
    exp_ends = np.cumsum(counts).tolist()
    tok_ends = np.cumsum(meta[:, META_LEN]).tolist()
    out, e0, t0 = [], 0, 0
    for b, e1 in zip(buckets, exp_ends):
        t1 = tok_ends[e1 - 1] if e1 > e0 else t0  # a question with no response: no tokens
        # copy(): each question must own its memory so retiring it frees it.
        out.append(StoredQuestion(int(b), ids[t0:t1].copy(), logp[t0:t1].copy(), meta[e0:e1].copy()))
        e0, t0 = e1, t1
    return out
