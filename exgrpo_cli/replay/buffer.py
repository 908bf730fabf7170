"""Experience buffer: what ExGRPO remembers between steps (docs/algorithm.md §2).

Place in the train step: after the rollouts of a step are scored and the policy updated, the loop
calls ``observe_groups`` with the step's groups (fresh and replayed questions alike; which of their
responses are stored is the buffer's rule, ``storable``) and then ``end_step``.
At the start of the next step the question-selection rule (``selection.QUESTION_SELECTION``)
reads the buckets to pick the questions to replay, and ``experiences(uid)`` hands over the
stored candidates that the trajectory selection scores. Buffer, buckets and retired set go into
every checkpoint (``state_dict`` / ``save``): a resumed run replays what the uninterrupted one would.

Storage. A question owns three numpy arrays (its ``StoredQuestion``, replay/experience.py, which
also holds the hashes and the duplicate check). Retiring a question frees its memory at once (no
compaction pass); selection never touches token data, only the per-bucket question lists.

Buckets are ranges of accuracy k/K (replay/buckets.py). A question sits in the bucket of its
latest accuracy; each bucket keeps its questions in an ``IndexedSet`` (O(1) add, remove and access
by position, so selecting from a million experiences never copies a bucket), whose member order,
and with it seeded selection, survives a save/load round trip.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from exgrpo_cli.replay.bucketing import BUCKET_BY, Bounds, collects, storable
from exgrpo_cli.replay.buckets import BucketScheme
from exgrpo_cli.replay.eviction import OldestFirst
from exgrpo_cli.replay.experience import (
    META_BYTES,
    Experience,
    StoredQuestion,
    new_responses,
    pack_questions,
    unpack_questions,
    value_hash,
)
from exgrpo_cli.replay.indexed_set import IndexedSet
from exgrpo_cli.replay.persistence import FORMAT_VERSION, checked_arrays, load_buffer, save_buffer
from exgrpo_cli.replay.persistence import META_LEN as _LEN

if TYPE_CHECKING:
    from exgrpo_cli.replay.mixing import Group


class ExperienceBuffer:
    """Question id -> stored correct responses, bucketed by latest accuracy, plus the retired set."""

    def __init__(
        self,
        group_size: int,
        bucket_edges: Sequence[float] | None = None,
        max_experiences: int = 0,
        bucket_by: str = "count",
        max_age: int = 0,
    ) -> None:
        if max_experiences < 0:
            raise ValueError(f"replay.max_experiences must be >= 0 (got {max_experiences})")
        if max_age < 0:
            raise ValueError(f"replay.max_age must be >= 0 (got {max_age})")
        if bucket_by not in BUCKET_BY:
            raise ValueError(f"replay.bucket_by must be one of {', '.join(BUCKET_BY)} (got {bucket_by!r})")
        self.bucket_by = bucket_by  # replay/bucketing.py: what a question's bucket is measured by
        self._scheme = BucketScheme(group_size, bucket_edges, BUCKET_BY[bucket_by].min_level)
        self.group_size = group_size
        self.max_experiences = max_experiences
        self.max_age = max_age  # 0: no age limit (the paper's rule)
        self._clear()

    def _clear(self) -> None:
        self._questions: dict[str, StoredQuestion] = {}
        self._buckets: list[IndexedSet] = [IndexedSet() for _ in range(self.num_buckets)]
        self._retired: dict[str, None] = {}  # insertion-ordered so readmission is reproducible
        self._pending: dict[str, None] = {}  # reached k == K this step; retired by end_step
        self._readmitted = 0  # retired questions put back into fresh sampling so far (the run's total)
        self._num_experiences = 0
        self._tokens = 0
        self._next_seq = 0  # global insertion number: defines "oldest" for the cap
        self._oldest = OldestFirst()  # kept only under a cap (max_experiences or max_age)
        self._expired = 0  # experiences dropped by max_age so far (the run's total)
        # sum mod 2^64 of every stored experience's value hash: order-free, and updated as experiences
        # come and go, so the per-step rank check covers the stored log-probs at no O(buffer) cost
        self._checksum = 0
        # what the replay method remembers across steps (replay/methods.py): JSON-able, saved and
        # digested with the buffer; empty under ExGRPO
        self.method_state: dict[str, Any] = {}
        # whether incorrect responses were ever stored (a method that stores any, as RePO's): a
        # method that replays stored responses as correct ones cannot take such a buffer over
        self.holds_any = False

    # ----------------------------------------------------------------- buckets
    def bucket_centres(self) -> list[float]:
        return list(self._scheme.centres)

    def bucket_of_count(self, k: int) -> int:
        return self._scheme.bucket_of_count(k)

    @property
    def num_buckets(self) -> int:
        return self._scheme.num_buckets

    def bucket_sizes(self) -> list[int]:
        return [len(b) for b in self._buckets]

    def questions_in_bucket(self, b: int) -> list[str]:
        """Questions of bucket ``b`` in slot order (a copy: O(bucket size))."""
        return list(self._buckets[b])

    def question_at(self, b: int, i: int) -> str:
        """``questions_in_bucket(b)[i]`` in O(1): what selection uses."""
        return self._buckets[b].member(i)

    # ----------------------------------------------------------------- updates
    def observe_group(
        self,
        uid: str,
        num_correct: int,
        correct: Sequence[tuple[np.ndarray, np.ndarray]],
        step: int,
        collect: bool,
        level: int | None = None,
        keep_bare: bool = False,
        keep_any: bool = False,
        counted: int | None = None,
    ) -> None:
        """Apply one scored group (docs/algorithm.md §2).

        ``num_correct`` is k out of K (for a replayed question it counts the replayed
        response); ``correct`` holds (token ids, behaviour log-probs) of the group's new
        fresh correct responses. ``collect`` is False before the delayed start. ``level`` places
        the question in a bucket (replay/bucketing.py; None: k, the count rule). ``keep_bare``: a
        question enters its bucket with no response stored (a method that replays prompts only).
        ``keep_any``: ``correct`` may hold incorrect responses too (a method that stores every
        response with its reward, as RePO's). ``counted``: how many responses k is out of (None:
        K); a question retires when all of them are correct (a group LUFFY guides counts its
        K - 1 fresh rollouts beside the solution).
        """
        k, K = int(num_correct), self.group_size
        if not 0 <= k <= K:
            raise ValueError(f"num_correct must be in 0..{K} (got {k})")
        if len(correct) > (K if keep_any else k):
            raise ValueError(f"{len(correct)} correct responses but num_correct={k} for {uid!r}")
        if uid in self._retired:
            return  # retired questions are never replayed again (until readmitted)
        if k == (K if counted is None else counted) and k > 0:
            # Deferred to end_step: the question may still be part of this step's batch.
            self._pending[uid] = None
            return
        if k == 0 or not collect:
            return  # k == 0 keeps the last informative accuracy; before the start nothing is stored
        b = self._scheme.bucket_of_count(k if level is None else level)
        q = self._questions.get(uid)
        ids, logps, hashes = new_responses(q, correct)
        if q is None:
            if not ids and not keep_bare:
                return  # a question with nothing stored could be selected but not replayed
            q = StoredQuestion(b, np.empty(0, np.int32), np.empty(0, np.float32), np.empty((0, 4), np.int64))
            self._questions[uid] = q
            self._buckets[b].add(uid)
            if self.max_experiences or self.max_age:
                self._oldest.push(self._next_seq, uid)
        elif q.bucket != b:
            self._buckets[q.bucket].remove(uid)
            self._buckets[b].add(uid)
            q.bucket = b
        if ids:
            self.holds_any = self.holds_any or keep_any
            seqs = range(self._next_seq, self._next_seq + len(ids))
            meta = np.array([[len(a), step, h, i] for a, h, i in zip(ids, hashes, seqs)], dtype=np.int64)
            self._next_seq += len(ids)
            # Replace rather than grow in place: views handed out by experiences() stay valid.
            q.ids = np.concatenate([q.ids, *ids])
            q.logp = np.concatenate([q.logp, *logps])
            q.meta = np.concatenate([q.meta, meta])
            self._num_experiences += len(ids)
            self._tokens += int(meta[:, _LEN].sum())
            self._add_to_checksum(sum(value_hash(a, lp) for a, lp in zip(ids, logps)))
            self._enforce_cap()

    # (group, response) of every response ``observe_groups`` stores (replay/bucketing.py)
    storable = staticmethod(storable)

    def observe_groups(
        self,
        groups: Sequence[Group],
        step: int,
        bounds: Bounds | None,
        logprobs: Mapping[tuple[int, int], np.ndarray] | None,
        rows: Sequence[tuple[int, int]] | None = None,
        keep_bare: bool = False,
        keep_any: bool = False,
    ) -> None:
        """``observe_group`` for each of a step's scored groups, storing its ``rows`` (the replay
        method's ``enters``; None: ``storable``, ExGRPO's) with ``logprobs[(group, response)]``
        (the trainer's), or with the rollout engine's when ``logprobs`` is None (then a response
        the engine gave none for is not stored: there would be nothing to weight its replay with)."""
        correct: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in groups]
        for gi, ri in self.storable(groups, bounds) if rows is None else rows:
            r = groups[gi].responses[ri]
            if logprobs is not None:
                logp = logprobs[(gi, ri)]
            elif r.behavior_logp:
                logp = np.asarray(r.behavior_logp, dtype=np.float32)
            else:
                continue
            correct[gi].append((np.asarray(r.ids, dtype=np.int32), logp))
        levels = BUCKET_BY[self.bucket_by].levels(groups, self.group_size)
        for gi, g in enumerate(groups):
            collect = collects(g, bounds)
            self.observe_group(
                g.question.uid,
                g.num_correct,
                correct[gi],
                step,
                collect,
                levels[gi],
                keep_bare,
                keep_any,
                counted=len(g.responses),
            )

    def end_step(self) -> list[str]:
        """Retire the questions that reached k == K this step; returns them."""
        done = list(self._pending)
        self._pending.clear()
        for uid in done:
            if uid in self._questions:
                self._remove(uid)
            self._retired[uid] = None
        return done

    def readmit(self, fraction: float, rng: np.random.Generator) -> list[str]:
        """Put floor(fraction * #retired) retired questions back into fresh sampling.

        They are drawn uniformly without replacement and returned in retirement order.
        """
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"replay.readmit_retired_fraction must be in [0, 1] (got {fraction})")
        pool = list(self._retired)
        n = math.floor(fraction * len(pool) + 1e-9)  # 1e-9: 0.29 * 100 must give 29, not 28
        if n == 0:
            return []
        picked = [pool[i] for i in sorted(rng.choice(len(pool), size=n, replace=False).tolist())]
        for uid in picked:
            del self._retired[uid]
        self._readmitted += len(picked)
        return picked

    def discard(self, uid: str) -> None:
        """Take a buffered question out of the buffer and its bucket (not retired: fresh sampling
        may still draw it), as a replay method's leaving rule does (replay.prompt.max_reuse)."""
        self._remove(uid)

    def _add_to_checksum(self, value: int) -> None:
        self._checksum = (self._checksum + value) % 2**64

    def _remove(self, uid: str) -> None:
        self._add_to_checksum(-self._questions[uid].value_hashes())
        q = self._questions.pop(uid)
        self._buckets[q.bucket].remove(uid)
        self._num_experiences -= len(q.meta)
        self._tokens -= int(q.meta[:, _LEN].sum())

    def _enforce_cap(self) -> None:
        """Evict the oldest experiences (earliest inserted, hence earliest step) above the cap."""
        excess = self._num_experiences - self.max_experiences
        if not self.max_experiences or excess <= 0:
            return
        self._drop(self._oldest.pick(self._questions, lambda dropped, _: dropped < excess))

    def expire(self, step: int) -> int:
        """`replay.max_age`: drop the experiences collected more than max_age steps before `step`
        (called before the step's replay selection, so no replayed row is older); returns how many."""
        if not self.max_age:
            return 0
        cutoff = step - self.max_age
        drop = self._oldest.pick(self._questions, lambda _, collected: collected < cutoff)
        self._drop(drop)
        self._expired += sum(drop.values())
        return sum(drop.values())

    def _drop(self, drop: Mapping[str, int]) -> None:
        """Remove each question's `drop[uid]` oldest experiences; a question left with none
        leaves the buffer and its bucket."""
        for uid, n in drop.items():
            q = self._questions[uid]
            if n == len(q.meta):
                self._remove(uid)
                continue
            t = int(q.meta[:n, _LEN].sum())
            self._add_to_checksum(-q.value_hashes(n))
            # copy(): a slice would keep the evicted tokens alive in the old array.
            q.ids, q.logp, q.meta = q.ids[t:].copy(), q.logp[t:].copy(), q.meta[n:].copy()
            self._num_experiences -= n
            self._tokens -= t

    # ----------------------------------------------------------------- queries
    @property
    def retired(self) -> set[str]:
        return set(self._retired)

    def is_retired(self, uid: str) -> bool:
        return uid in self._retired

    def __contains__(self, uid: str) -> bool:
        return uid in self._questions

    @property
    def num_questions(self) -> int:
        return len(self._questions)

    @property
    def num_experiences(self) -> int:
        return self._num_experiences

    @property
    def stored_tokens(self) -> int:
        return self._tokens

    @property
    def checksum(self) -> str:
        """A digest of every stored experience's tokens and log-probs (hex): equal buffers, equal
        checksums, whatever the order the experiences came in."""
        return f"{self._checksum:016x}"

    def digest(self) -> str:
        """What two ranks' buffers must agree on, in 16 hex digits: bucket membership, the retired
        set, the sizes and the running checksum of every stored token and log-prob. O(questions):
        the checksum is kept up to date as experiences come and go."""
        sizes = [self.num_questions, self._num_experiences, self._tokens, self.checksum]
        content = [[list(b) for b in self._buckets], sorted(self._retired), *sizes]
        if self.method_state:  # absent, the digest is the one buffers had before methods
            content.append(self.method_state)
        return hashlib.blake2b(json.dumps(content).encode(), digest_size=8).hexdigest()

    @property
    def nbytes(self) -> int:
        """Array payload: 8 bytes per token + 32 per experience (Python objects not counted)."""
        return 8 * self._tokens + META_BYTES * self._num_experiences

    def experiences(self, uid: str) -> list[Experience]:
        """Stored experiences of ``uid``, oldest first (KeyError if it is not buffered)."""
        return self._questions[uid].experiences()

    def metrics(self) -> dict[str, float]:
        """``replay/bucket/<b>`` counts questions in bucket b, numbered from 1 (= success count b
        with the default edges)."""
        m = {
            "replay/buffer_questions": float(self.num_questions),
            "replay/buffer_experiences": float(self._num_experiences),
            "replay/buffer_tokens": float(self._tokens),
            "replay/buffer_mb": self.nbytes / 2**20,
            "replay/retired": float(len(self._retired)),
            "replay/readmitted": float(self._readmitted),  # so far; they left the retired count
        }
        if self.max_age:
            m["replay/expired"] = float(self._expired)  # so far: dropped for their age
        for b, size in enumerate(self.bucket_sizes(), start=1):
            m[f"replay/bucket/{b}"] = float(size)
        return m

    # ----------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """{"arrays": name -> numpy array, "index": JSON-able dict}. Copies the token data once."""
        qs = list(self._questions.values())
        arrays = pack_questions(qs)
        index: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "group_size": self.group_size,
            "bucket_edges": self._scheme.user_edges,
            "bucket_by": self.bucket_by,
            "max_experiences": self.max_experiences,
            "max_age": self.max_age,
            "expired": self._expired,
            "next_seq": self._next_seq,
            "questions": list(self._questions),
            "question_buckets": [q.bucket for q in qs],
            "buckets": [list(b) for b in self._buckets],
            "retired": list(self._retired),
            "pending_retire": list(self._pending),
            "readmitted": self._readmitted,
        }
        if self.method_state:
            index["method_state"] = json.loads(json.dumps(self.method_state))  # a copy, and JSON
        if self.holds_any:  # absent: correct responses only (every buffer saved before methods)
            index["holds_any"] = True
        return {"arrays": arrays, "index": index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the content with ``state``; group size, bucket edges and rule must match."""
        index = state["index"]
        saved_rule = index.get("bucket_by", "count")  # absent from buffers saved before the rule
        if saved_rule != self.bucket_by:
            raise ValueError(
                f"buffer was bucketed by {saved_rule}, this run uses replay.bucket_by={self.bucket_by}"
            )
        ids, logp, meta, counts = checked_arrays(state, self.group_size, self._scheme.edges)
        uids, qbuckets = index["questions"], index["question_buckets"]
        self._clear()
        self._questions.update(zip(uids, unpack_questions(qbuckets, ids, logp, meta, counts)))
        members = [uid for bucket in index["buckets"] for uid in bucket]
        if len(index["buckets"]) != self.num_buckets or sorted(members) != sorted(uids):
            raise ValueError("inconsistent buffer state: bucket membership does not match the questions")
        if any(self._questions[u].bucket != b for b, bucket in enumerate(index["buckets"]) for u in bucket):
            raise ValueError("inconsistent buffer state: a question's bucket differs from its bucket list")
        self._buckets = [IndexedSet(bucket) for bucket in index["buckets"]]
        self._retired = dict.fromkeys(index["retired"])
        self._pending = dict.fromkeys(index["pending_retire"])
        self._readmitted = int(index.get("readmitted", 0))  # absent from checkpoints written before it
        self._num_experiences = len(meta)
        self._tokens = len(ids)
        self._next_seq = int(index["next_seq"])
        for q in self._questions.values():
            self._add_to_checksum(q.value_hashes())
        self._expired = int(index.get("expired", 0))  # absent from buffers saved before max_age
        self.method_state = json.loads(json.dumps(index.get("method_state", {})))  # a deep copy
        self.holds_any = index.get("holds_any", False) is True
        if self.max_experiences or self.max_age:
            self._oldest.rebuild(self._questions)
            self._enforce_cap()

    def save(self, directory: str) -> None:
        """Write the buffer into ``directory`` (format: replay/persistence.py)."""
        save_buffer(self.state_dict(), directory)

    @classmethod
    def load(cls, directory: str) -> ExperienceBuffer:
        state = load_buffer(directory)
        index = state["index"]
        rule = index.get("bucket_by", "count")
        max_age = int(index.get("max_age", 0))  # absent from buffers saved before max_age
        buf = cls(index["group_size"], index["bucket_edges"], index["max_experiences"], rule, max_age)
        buf.load_state_dict(state)
        return buf
