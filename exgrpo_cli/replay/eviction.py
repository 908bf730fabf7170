"""Oldest-first eviction for the replay buffer's two limits: `replay.max_experiences` (a cap on
the count) and `replay.max_age` (a cap on the steps since collection).

Place in the train step: the buffer calls `OldestFirst.pick` when an observed group pushes it past
the count cap, and at the start of a step (`ExperienceBuffer.expire`, before replay selection) for
the age cap. Experiences carry a global insertion number (seq), and insertion follows the steps,
so the smallest live seq is also the oldest collection step: one heap serves both limits.

The heap holds one live entry per question (its oldest experience); entries of removed or trimmed
questions go stale and are skipped, and the heap is rebuilt when stale entries dominate.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping

from exgrpo_cli.replay.experience import StoredQuestion
from exgrpo_cli.replay.persistence import META_SEQ, META_STEP


class OldestFirst:
    """(seq of a question's oldest experience, uid) min-heap."""

    def __init__(self) -> None:
        self.heap: list[tuple[int, str]] = []

    def push(self, seq: int, uid: str) -> None:
        heapq.heappush(self.heap, (seq, uid))

    def rebuild(self, questions: Mapping[str, StoredQuestion]) -> None:
        # a question kept with no response (a prompts-only method) has nothing to evict
        self.heap = [(int(q.meta[0, META_SEQ]), uid) for uid, q in questions.items() if len(q.meta)]
        heapq.heapify(self.heap)

    def pick(
        self, questions: Mapping[str, StoredQuestion], more: Callable[[int, int], bool]
    ) -> dict[str, int]:
        """uid -> how many of its oldest experiences to drop: the globally oldest ones, one at a
        time, while `more(dropped so far, collection step of the next oldest)` holds. Only the
        heap changes; the caller drops the experiences."""
        if len(self.heap) > 2 * len(questions) + 64:
            self.rebuild(questions)
        drop: dict[str, int] = {}
        dropped = 0
        while self.heap:
            seq, uid = self.heap[0]
            q, i = questions.get(uid), drop.get(uid, 0)
            if q is None or i >= len(q.meta) or q.meta[i, META_SEQ] != seq:
                heapq.heappop(self.heap)  # stale
                continue
            if not more(dropped, int(q.meta[i, META_STEP])):
                break
            heapq.heappop(self.heap)
            drop[uid] = i + 1
            dropped += 1
            if i + 1 < len(q.meta):
                heapq.heappush(self.heap, (int(q.meta[i + 1, META_SEQ]), uid))
        return drop
